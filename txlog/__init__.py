"""txlog's Python client: confluent-kafka's shapes over txlog's HTTP API."""

from txlog.errors import KafkaError, KafkaException

__all__ = ["KafkaError", "KafkaException"]
