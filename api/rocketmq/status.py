"""txlog's errors as RocketMQ's status codes (``apache.rocketmq.v2.Code``): what a RocketMQ 5
proxy answers for the same condition, so the client raises the exception it raises against
RocketMQ (NotFoundException for TOPIC_NOT_FOUND, PayloadTooLargeException for
MESSAGE_BODY_TOO_LARGE, …)."""

from __future__ import annotations

from typing import Any

from app.errors import DatabaseUnavailable, ErrorCode, TxlogError
from app.wire.rocketmq.protocol import Code, definition

_CODES = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: Code.TOPIC_NOT_FOUND,
    ErrorCode.INVALID_TOPIC_EXCEPTION: Code.ILLEGAL_TOPIC,
    ErrorCode.MESSAGE_TOO_LARGE: Code.MESSAGE_BODY_TOO_LARGE,
    ErrorCode.RECORD_LIST_TOO_LARGE: Code.PAYLOAD_TOO_LARGE,
    ErrorCode.INVALID_RECORD: Code.BAD_REQUEST,
    ErrorCode.INVALID_REQUEST: Code.BAD_REQUEST,
    ErrorCode.TOPIC_AUTHORIZATION_FAILED: Code.FORBIDDEN,
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED: Code.FORBIDDEN,
    ErrorCode.GROUP_AUTHORIZATION_FAILED: Code.FORBIDDEN,
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: Code.FORBIDDEN,
    # a call unsigned, or signed by no one's key (``identity``)
    ErrorCode.SASL_AUTHENTICATION_FAILED: Code.UNAUTHORIZED,
    ErrorCode.THROTTLING_QUOTA_EXCEEDED: Code.TOO_MANY_REQUESTS,
    ErrorCode.REQUEST_TIMED_OUT: Code.PROXY_TIMEOUT,
    # EndTransaction: no such half message; one decided the other way already
    ErrorCode.TRANSACTIONAL_ID_NOT_FOUND: Code.INVALID_TRANSACTION_ID,
    ErrorCode.INVALID_TXN_STATE: Code.BAD_REQUEST,
}


class RocketMQError(Exception):
    """An answer with a RocketMQ status code, for a condition only the protocol has (a missing
    client id, an illegal tag): raised by the translation, answered by the RPC."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def status(code: int = Code.OK, message: str = "OK") -> Any:
    return definition.Status(code=code, message=message)


def of_error(exc: TxlogError) -> Any:
    """The status answering ``exc``: its RocketMQ counterpart, else INTERNAL_SERVER_ERROR (the
    database away included: the client retries, as it does a proxy's)."""
    if isinstance(exc, DatabaseUnavailable):
        return status(Code.INTERNAL_SERVER_ERROR, exc.message)
    return status(_CODES.get(exc.code, Code.INTERNAL_SERVER_ERROR), exc.message)
