"""Kafka's client errors, shaped as confluent-kafka's ``KafkaError`` and ``KafkaException``.

A broker error keeps Kafka's numeric code (the same table the server answers with,
``app.errors.ErrorCode``) and its name; errors that happen in the client itself use librdkafka's
negative codes (``_TRANSPORT``, ``_TIMED_OUT``, ``_STATE``, ...). Code that catches
``KafkaException`` and looks at ``e.args[0].code()`` works the same against txlog.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING

from app.errors import ErrorCode

# librdkafka's local error codes (rdkafka.h, RD_KAFKA_RESP_ERR__*), the ones this client raises.
_LOCAL = {
    "_BAD_MSG": -199,
    "_FAIL": -196,
    "_TRANSPORT": -195,
    "_MSG_TIMED_OUT": -192,
    "_PARTITION_EOF": -191,
    "_UNKNOWN_PARTITION": -190,
    "_UNKNOWN_TOPIC": -188,
    "_TIMED_OUT": -185,
    "_INVALID_ARG": -186,
    "_QUEUE_FULL": -184,
    "_STATE": -172,
    "_NO_OFFSET": -168,
    "_OUTDATED": -167,
    "_FENCED": -144,
    "_FATAL": -150,
    "_INCONSISTENT": -149,
    "_PURGE_QUEUE": -152,
    "_PURGE_INFLIGHT": -151,
    "_NOT_CONFIGURED": -145,
    "_AUTO_OFFSET_RESET": -140,
}

_NAMES: dict[int, str] = {c.kafka_code: c.name for c in ErrorCode}
_NAMES.update({v: k for k, v in _LOCAL.items()})
_NAMES[0] = "NO_ERROR"
_RETRIABLE = {c.kafka_code for c in ErrorCode if c.retriable} | {_LOCAL["_TRANSPORT"], _LOCAL["_TIMED_OUT"]}


if TYPE_CHECKING:

    class _WithCodes(type):
        """What the type checker knows of the per-code constants, which are set from the tables
        below after the class is made."""

        def __getattr__(cls, name: builtins.str) -> int: ...

else:
    _WithCodes = type


class KafkaError(metaclass=_WithCodes):
    """One error: ``code()``, ``name()``, ``str()``, ``retriable()``, ``fatal()``, ``txn_requires_abort()``.

    The class has one constant per code, as confluent-kafka's: ``KafkaError.PRODUCER_FENCED == 90``,
    ``KafkaError._TRANSPORT == -195``.
    """

    NO_ERROR = 0

    def __init__(
        self,
        code: int,
        reason: str | None = None,
        fatal: bool = False,
        retriable: bool | None = None,
        txn_requires_abort: bool = False,
        *,
        details: dict | None = None,
    ) -> None:
        self._code = int(code)
        self._reason = reason or _NAMES.get(self._code, f"error {self._code}")
        self._fatal = fatal
        self._retriable = (self._code in _RETRIABLE) if retriable is None else retriable
        self._txn_requires_abort = txn_requires_abort
        self.details: dict = dict(details or {})

    def code(self) -> int:
        return self._code

    def name(self) -> str:
        return _NAMES.get(self._code, f"ERR_{self._code}")

    def str(self) -> str:
        return self._reason

    def fatal(self) -> bool:
        return self._fatal

    def retriable(self) -> bool:
        return self._retriable

    def txn_requires_abort(self) -> bool:
        return self._txn_requires_abort

    def with_flags(
        self, *, fatal: bool | None = None, retriable: bool | None = None, txn_requires_abort: bool | None = None
    ) -> "KafkaError":
        """The same error, classified differently (a producer decides what an error means to it)."""
        return KafkaError(
            self._code,
            self._reason,
            self._fatal if fatal is None else fatal,
            self._retriable if retriable is None else retriable,
            self._txn_requires_abort if txn_requires_abort is None else txn_requires_abort,
            details=self.details,
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KafkaError):
            return self._code == other._code
        if isinstance(other, int):
            return self._code == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._code)

    def __str__(self) -> builtins.str:  # `str` in this class is the method above
        return f'KafkaError{{code={self.name()},val={self._code},str="{self._reason}"}}'

    __repr__ = __str__


for _code in ErrorCode:
    setattr(KafkaError, _code.name, _code.kafka_code)
for _name, _value in _LOCAL.items():
    setattr(KafkaError, _name, _value)


class KafkaException(Exception):
    """Raised by the client's calls; ``args[0]`` is the ``KafkaError`` (as in confluent-kafka)."""

    def __init__(self, error: KafkaError | int, reason: str | None = None) -> None:
        if not isinstance(error, KafkaError):
            error = KafkaError(error, reason)
        super().__init__(error)

    @property
    def error(self) -> KafkaError:
        return self.args[0]

    def __str__(self) -> str:
        return str(self.args[0])
