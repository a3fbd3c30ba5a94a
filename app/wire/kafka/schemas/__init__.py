"""Message definitions of the share-group APIs (KIP-932) and of ConsumerGroupHeartbeat and
ConsumerGroupDescribe (KIP-848), in the JSON form of Kafka's own message
definitions, for the versions Kafka 4.1+ and librdkafka's share consumer speak. kafka-python 3.0.12
has none of them; ``app.wire.kafka.messages`` loads them into its codec beside kafka-python's."""
