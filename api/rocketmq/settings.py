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
A consumer's subscription is answered as a proxy merges its group's config into it: the receive
batch size and long-polling timeout the proxy tells clients (32 messages, 20 s), and the group's
maximum delivery attempts as ``backoff_policy.max_attempts`` — one fewer than txlog's share
group's share.delivery.count.limit (``receiving.max_attempts``: the limit's last acquisition
copies the message to the dead-letter topic), where RocketMQ's proxy says the group's
retryMaxTimes + 1 — with RocketMQ's default retry back-off (5 s doubling to 2 h), which a push
consumer waits before a failed message comes again.
"""

from __future__ import annotations

from typing import Any

from app.wire.rocketmq.protocol import definition

PRODUCER_MAX_ATTEMPTS = 3
BACKOFF_INITIAL_MS = 10
BACKOFF_MAX_MS = 1_000
BACKOFF_MULTIPLIER = 2.0
CONSUMER_RECEIVE_BATCH_SIZE = 32
CONSUMER_LONG_POLLING_TIMEOUT_MS = 20_000
CONSUMER_BACKOFF_INITIAL_MS = 5_000
CONSUMER_BACKOFF_MAX_MS = 7_200_000


def answer(sent: Any, max_body_size: int, max_delivery_attempts: int | None = None) -> Any:
    """The Settings answering ``sent`` (``max_delivery_attempts``: a consumer group's)."""
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
    if sent.HasField("subscription") and max_delivery_attempts is not None:
        _subscription(settings, max_delivery_attempts)
    settings.metric.Clear()
    settings.metric.on = False
    return settings


def _subscription(settings: Any, max_delivery_attempts: int) -> None:
    subscription = settings.subscription
    subscription.receive_batch_size = CONSUMER_RECEIVE_BATCH_SIZE
    subscription.long_polling_timeout.FromMilliseconds(CONSUMER_LONG_POLLING_TIMEOUT_MS)
    subscription.fifo = False
    policy = settings.backoff_policy
    policy.Clear()
    policy.max_attempts = max_delivery_attempts
    policy.exponential_backoff.initial.FromMilliseconds(CONSUMER_BACKOFF_INITIAL_MS)
    policy.exponential_backoff.max.FromMilliseconds(CONSUMER_BACKOFF_MAX_MS)
    policy.exponential_backoff.multiplier = BACKOFF_MULTIPLIER
