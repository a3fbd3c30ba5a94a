"""Kafka's SCRAM credential admin APIs: DescribeUserScramCredentials (50) and
AlterUserScramCredentials (51), over the principals' credentials (``app.services.scram``).

A user is a principal; an upsertion for a name that is none creates the principal, as Kafka creates
users implicitly (with a token no one is told: it signs in by SCRAM). The client sends a salt and
the SaltedPassword, never the password; only StoredKey and ServerKey are kept. When the gateway
authenticates (``ctx.authorizer``), Describe needs Describe on the cluster and Alter needs Alter on
it, as Kafka's brokers check them: CLUSTER_AUTHORIZATION_FAILED otherwise, for the whole request
(Describe) or for every user named (Alter)."""

from __future__ import annotations

from typing import Any

from api.kafka.handlers import RequestContext, access, error_code
from app.domain.acls import Api
from app.domain.scram import MECHANISMS, Deletion, Upsertion, users_named
from app.errors import ErrorCode, TxlogError
from app.services import scram


def _denied(ctx: RequestContext, api: Api) -> bool:
    """Refused by ``api``'s rows of the ACL table (``app.domain.acls.REQUIRED``)."""
    return access.refusal(ctx, api) is not None


async def handle_describe_user_scram_credentials(ctx: RequestContext, request: Any) -> dict:
    """Every user with credentials when none are named (null or empty), else each user named, with
    its mechanisms and iteration counts (never a key)."""
    if _denied(ctx, Api.DESCRIBE_USER_SCRAM_CREDENTIALS):
        code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        return {"throttle_time_ms": 0, "error_code": code.kafka_code, "error_message": code.value.default_message, "results": []}
    users = [u.name for u in request.users] if request.users else None
    described = await ctx.call(scram.describe_credentials, ctx.broker.db, users)
    results = [
        {
            "user": d.user,
            "error_code": d.error.code.kafka_code if d.error else 0,
            "error_message": d.error.message if d.error else None,
            "credential_infos": [{"mechanism": _type(m), "iterations": i} for m, i in d.credentials],
        }
        for d in described
    ]
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "results": results}


def _type(mechanism: str) -> int:
    return MECHANISMS[mechanism].kafka_type


async def handle_alter_user_scram_credentials(ctx: RequestContext, request: Any) -> dict:
    """One result per user named: done, or why not (Kafka's codes: DUPLICATE_RESOURCE,
    RESOURCE_NOT_FOUND, UNACCEPTABLE_CREDENTIAL, UNSUPPORTED_SASL_MECHANISM)."""
    deletions = [Deletion(d.name, d.mechanism) for d in request.deletions]
    upsertions = [Upsertion(u.name, u.mechanism, u.iterations, u.salt, u.salted_password) for u in request.upsertions]
    users = users_named(deletions, upsertions)
    if _denied(ctx, Api.ALTER_USER_SCRAM_CREDENTIALS):
        return _every_user(
            users, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, ErrorCode.CLUSTER_AUTHORIZATION_FAILED.value.default_message
        )
    try:
        altered = await ctx.call(scram.alter_credentials, ctx.broker.db, deletions, upsertions)
    except TxlogError as exc:  # the database away or too slow: each user hears it
        return _every_user(users, error_code(ctx.api_key, exc), exc.message)
    results = [
        {
            "user": r.user,
            "error_code": r.error.code.kafka_code if r.error else 0,
            "error_message": r.error.message if r.error else None,
        }
        for r in altered
    ]
    return {"throttle_time_ms": 0, "results": results}


def _every_user(users: list[str], code: ErrorCode, message: str) -> dict:
    return {
        "throttle_time_ms": 0,
        "results": [{"user": u, "error_code": code.kafka_code, "error_message": message} for u in users],
    }
