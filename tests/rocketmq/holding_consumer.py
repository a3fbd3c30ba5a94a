"""A RocketMQ push consumer that holds every message it is given and never finishes consuming it:
``python -m tests.rocketmq.holding_consumer ENDPOINTS GROUP TOPIC`` prints each message id it
receives, one a line, then waits (until it is killed)."""

from __future__ import annotations

import sys
import threading
from typing import Any

import rocketmq


class Holding(rocketmq.MessageListener):  # type: ignore[misc]
    def consume(self, message: Any) -> Any:
        print(message.message_id, flush=True)
        threading.Event().wait()
        return rocketmq.ConsumeResult.SUCCESS


def main(endpoints: str, group: str, topic: str) -> None:
    config = rocketmq.ClientConfiguration(endpoints, rocketmq.Credentials(), request_timeout=10)
    consumer = rocketmq.PushConsumer(config, group, Holding(), {topic: rocketmq.FilterExpression()})
    consumer.startup()
    threading.Event().wait()


if __name__ == "__main__":
    main(*sys.argv[1:4])
