"""The answer to a client's Settings (its first Telemetry command, and every five minutes after),
as a RocketMQ proxy gives it: the client's own settings with the server's word on what the
server decides.

- Publishing: ``max_body_size`` is the log's limit on a record's value (TXLOG_MAX_VALUE_BYTES),
  where RocketMQ's proxy says its maxMessageSize, so the client refuses an oversized body before
  sending it (and the gateway refuses it too, MESSAGE_BODY_TOO_LARGE, if it comes);
  ``validate_message_type`` on: the client checks a message's type against its queue's.
- The retry policy of sends: the proxy's defaults (three attempts, exponential back-off from 10 ms
  to 1 s, doubling).
- Metrics off: the gateway names no OpenTelemetry collector.

A client waits for this answer before it counts as started where it must (the Python client's
push consumer; its producer and simple consumer go on without it, and take it when it comes).
A subscription's settings (consumers) are answered as sent until the gateway serves consumers.
"""

from __future__ import annotations

from typing import Any

from app.wire.rocketmq.protocol import definition

PRODUCER_MAX_ATTEMPTS = 3
BACKOFF_INITIAL_MS = 10
BACKOFF_MAX_MS = 1_000
BACKOFF_MULTIPLIER = 2.0


def answer(sent: Any, max_body_size: int) -> Any:
    """The Settings answering ``sent``."""
    settings = definition.Settings()
    settings.CopyFrom(sent)
    if sent.HasField("publishing"):
        settings.publishing.max_body_size = max_body_size
        settings.publishing.validate_message_type = True
        policy = settings.backoff_policy
        policy.Clear()
        policy.max_attempts = PRODUCER_MAX_ATTEMPTS
        policy.exponential_backoff.initial.FromMilliseconds(BACKOFF_INITIAL_MS)
        policy.exponential_backoff.max.FromMilliseconds(BACKOFF_MAX_MS)
        policy.exponential_backoff.multiplier = BACKOFF_MULTIPLIER
    settings.metric.Clear()
    settings.metric.on = False
    return settings
