"""Who signs a RocketMQ call, and which of txlog's ACL rules each RPC answers to.

With TXLOG_AUTH=token a call is signed as RocketMQ 5 clients sign it (``MQv2-HMAC-SHA1``,
``app.domain.rocketmq_signature``): the access key is a principal's name and the secret key the
principal's RocketMQ secret key, derived from its token (``app.services.security
.rocketmq_secret_key``). A call unsigned, signed wrongly, by no active principal or dated outside
the skew window is answered UNAUTHORIZED (SASL_AUTHENTICATION_FAILED, ``status``).

Each RPC is then checked as the Kafka API doing the same thing (``RPC_API``, the rules of
``app.domain.acls.REQUIRED``, never one of its own); a refusal is answered FORBIDDEN (the
*_AUTHORIZATION_FAILED errors). A request names what the rules read: ``topic`` / ``topics`` (the
message's or the subscription's topic) and ``group`` (the consumer group). Heartbeat, Telemetry
and NotifyClientTermination name nothing to authorize: any authenticated principal may speak them.
"""

from __future__ import annotations

import time
from typing import Mapping, Sequence

from app.domain import rocketmq_signature as signature
from app.domain.acl_bindings import StoredPrincipal
from app.domain.acls import Api, denied
from app.errors import ErrorCode, TxlogError
from app.services.security import Authorizer

RPC_API: Mapping[str, Api] = {
    "QueryRoute": Api.DESCRIBE_TOPIC,  # Metadata: Describe on the topic
    "SendMessage": Api.PRODUCE,  # Produce: Write on the topic
    "SendHalfMessage": Api.SEND_HALF_MESSAGE,  # a SendMessage of TRANSACTION messages: Write on the topic
    "EndTransaction": Api.END_HALF_MESSAGE,  # Write on the topic
    "QueryAssignment": Api.SHARE_GROUP_HEARTBEAT,  # Read on the group, Describe on the topic
    "ReceiveMessage": Api.SHARE_FETCH,  # Read on the group and the topic
    "AckMessage": Api.SHARE_ACKNOWLEDGE,  # Read on the group and the topic
    "ChangeInvisibleDuration": Api.SHARE_ACKNOWLEDGE,
    "ForwardMessageToDeadLetterQueue": Api.SHARE_ACKNOWLEDGE,
    "Heartbeat": Api.UNCHECKED,
    "Telemetry": Api.UNCHECKED,
    "NotifyClientTermination": Api.UNCHECKED,
}


def _unauthorized(message: str) -> TxlogError:
    return TxlogError(ErrorCode.SASL_AUTHENTICATION_FAILED, f"Authentication failed: {message}")


def signer(authorizer: Authorizer, metadata: Mapping[str, str], now_s: float | None = None) -> StoredPrincipal:
    """The active principal that signed a call with this metadata, else SASL_AUTHENTICATION_FAILED."""
    header = metadata.get(signature.AUTHORIZATION_HEADER)
    if not header:
        raise _unauthorized("the call is not signed: set the client's credentials (access key: a principal's name)")
    try:
        signed = signature.parse_authorization(header)
        date_time = metadata.get(signature.DATE_TIME_HEADER, "")
        signature.check_date(date_time, time.time() if now_s is None else now_s)
    except signature.SignatureError as exc:
        raise _unauthorized(str(exc)) from None
    return authorizer.authenticate_signed(signed.access_key, lambda key: signature.signature_matches(signed, date_time, key))


def _names(topic: str | None, group: str | None) -> dict[str, str | Sequence[str] | None]:
    names: dict[str, str | Sequence[str] | None] = {}
    if topic is not None:
        names["topic"] = topic
        names["topics"] = (topic,)
    if group is not None:
        names["group"] = group
    return names


def authorize(
    authorizer: Authorizer, metadata: Mapping[str, str], rpc: str, topic: str | None = None, group: str | None = None
) -> StoredPrincipal:
    """The call's signer, allowed ``rpc`` on ``topic`` for ``group``; else the error to answer."""
    principal = signer(authorizer, metadata)
    authorizer.check(principal.name, RPC_API[rpc], _names(topic, group))
    return principal


def allowed(authorizer: Authorizer, principal: str, rpc: str, topic: str | None = None, group: str | None = None) -> bool:
    """May ``principal`` call ``rpc`` on ``topic`` for ``group``? (From the authorizer's snapshot.)"""
    return denied(authorizer.decisions(principal), RPC_API[rpc], _names(topic, group)) is None
