"""Client quotas: DescribeClientQuotas and AlterClientQuotas through ``app.services.quotas`` (the
same operations as ``txlog quotas``), and what Produce and Fetch spend of them.

Kafka's rules: DescribeClientQuotas needs DescribeConfigs on the cluster, AlterClientQuotas
AlterConfigs on the cluster (refused as CLUSTER_AUTHORIZATION_FAILED, for the whole request or
every entry); a filter Kafka refuses is the request's error; an entry Kafka refuses is answered with
its own error and changes nothing, the others are applied (unless validate_only).
"""

from __future__ import annotations

from typing import Any

from api.kafka.handlers import RequestContext, access
from app.domain.acls import Api
from app.domain.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE, FilterComponent, request_percentage
from app.errors import ErrorCode, TxlogError
from app.services import quotas


async def handle_describe_client_quotas(ctx: RequestContext, request: Any) -> dict:
    access.check(ctx, Api.DESCRIBE_CLIENT_QUOTAS)
    components = [FilterComponent(c.entity_type, c.match_type, c.match) for c in request.components]
    try:
        found = await ctx.call(quotas.describe_quotas, ctx.broker.db, components, request.strict)
    except TxlogError as exc:
        if exc.code not in (ErrorCode.INVALID_REQUEST, ErrorCode.UNSUPPORTED_VERSION):
            raise
        return {"throttle_time_ms": 0, "error_code": exc.code.kafka_code, "error_message": exc.message, "entries": None}
    return {
        "throttle_time_ms": 0,
        "error_code": 0,
        "error_message": None,
        "entries": [
            {
                "entity": [{"entity_type": t, "entity_name": n} for t, n in entity],
                "values": [{"key": k, "value": v} for k, v in sorted(values.items())],
            }
            for entity, values in found
        ],
    }


async def handle_alter_client_quotas(ctx: RequestContext, request: Any) -> dict:
    access.check(ctx, Api.ALTER_CLIENT_QUOTAS)
    alterations = [
        quotas.QuotaAlteration(
            [(e.entity_type, e.entity_name) for e in entry.entity],
            [quotas.QuotaOp(op.key, op.value, op.remove) for op in entry.ops],
        )
        for entry in request.entries
    ]
    results = await ctx.call(quotas.alter_quotas, ctx.broker.db, alterations, request.validate_only)
    return {
        "throttle_time_ms": 0,
        "entries": [
            {
                "error_code": 0 if error is None else error.code.kafka_code,
                "error_message": None if error is None else error.message,
                "entity": [{"entity_type": e.entity_type, "entity_name": e.entity_name} for e in entry.entity],
            }
            for entry, error in zip(request.entries, results)
        ],
    }


# -- what Produce and Fetch spend ----------------------------------------------------------------------


def produce_throttle(ctx: RequestContext, size: int, handler_s: float) -> int:
    """Record a Produce's bytes against producer_byte_rate and its handler time against
    request_percentage; the throttle time, the larger of the two (Kafka's)."""
    q = ctx.quotas
    user, client_id = ctx.principal, ctx.client_id
    return max(
        q.record(user, client_id, PRODUCER_BYTE_RATE, size),
        q.record(user, client_id, REQUEST_PERCENTAGE, request_percentage(handler_s)),
    )


def fetch_max_bytes(ctx: RequestContext, max_bytes: int) -> int:
    """A Fetch's max_bytes, at most what the consumer_byte_rate lets one request take (Kafka's
    getMaxValueInQuotaWindow)."""
    cap = ctx.quotas.max_value(ctx.principal, ctx.client_id, CONSUMER_BYTE_RATE)
    return max_bytes if cap is None else max(1, min(max_bytes, int(cap)))


def fetch_throttle(ctx: RequestContext, size: int, handler_s: float) -> int:
    """Record a Fetch answer's bytes against consumer_byte_rate and its handler time against
    request_percentage; the throttle time. A throttled Fetch is answered without records, as Kafka
    answers it, so its bytes are taken back."""
    q = ctx.quotas
    user, client_id = ctx.principal, ctx.client_id
    throttle = max(
        q.record(user, client_id, CONSUMER_BYTE_RATE, size),
        q.record(user, client_id, REQUEST_PERCENTAGE, request_percentage(handler_s)),
    )
    if throttle:
        q.unrecord(user, client_id, CONSUMER_BYTE_RATE, size)
    return throttle
