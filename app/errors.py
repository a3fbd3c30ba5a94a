"""The closed vocabulary of txlog errors, named and numbered as in Kafka's ``Errors``.

Every failure a client can see is one of these. Kafka's numeric code never changes; the HTTP status
and the retriable flag are txlog's. The API maps them in one exception handler.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class _Spec:
    kafka_code: int
    http_status: int
    retriable: bool
    default_message: str


class ErrorCode(Enum):
    UNKNOWN_SERVER_ERROR = _Spec(-1, 500, False, "The server experienced an unexpected error.")
    OFFSET_OUT_OF_RANGE = _Spec(
        1, 416, False, "The requested offset is not within the range of offsets maintained by the server."
    )
    CORRUPT_MESSAGE = _Spec(
        2,
        400,
        True,
        "This message has failed its CRC checksum, exceeds the valid size, has a null key for a compacted topic, or is otherwise corrupt.",
    )
    UNKNOWN_TOPIC_OR_PARTITION = _Spec(3, 404, False, "This server does not host this topic-partition.")
    LEADER_NOT_AVAILABLE = _Spec(
        5, 503, True, "There is no leader for this topic-partition as we are in the middle of a leadership election."
    )
    # Only on the Kafka wire: a read replica gateway asked to append (it leads no partition).
    NOT_LEADER_OR_FOLLOWER = _Spec(
        6, 503, True, "For requests intended only for the leader, this error indicates that the broker is not the current leader."
    )
    REQUEST_TIMED_OUT = _Spec(7, 503, True, "The request timed out.")
    MESSAGE_TOO_LARGE = _Spec(
        10, 413, False, "The request included a message larger than the max message size the server will accept."
    )
    OFFSET_METADATA_TOO_LARGE = _Spec(12, 413, False, "The metadata field of the offset request was too large.")
    COORDINATOR_LOAD_IN_PROGRESS = _Spec(14, 503, True, "The coordinator is loading and hence can't process requests.")
    COORDINATOR_NOT_AVAILABLE = _Spec(15, 503, True, "The coordinator is not available.")
    NOT_COORDINATOR = _Spec(16, 503, True, "This is not the correct coordinator.")
    INVALID_TOPIC_EXCEPTION = _Spec(17, 400, False, "The request attempted to perform an operation on an invalid topic.")
    RECORD_LIST_TOO_LARGE = _Spec(
        18, 413, False, "The request included message batch larger than the configured segment size on the server."
    )
    INVALID_REQUIRED_ACKS = _Spec(21, 400, False, "Produce request specified an invalid value for required acks.")
    ILLEGAL_GENERATION = _Spec(22, 409, False, "Specified group generation id is not valid.")
    INCONSISTENT_GROUP_PROTOCOL = _Spec(
        23,
        409,
        False,
        "The group member's supported protocols are incompatible with those of existing members or first group member tried to join with empty protocol type or empty protocol list.",
    )
    INVALID_GROUP_ID = _Spec(24, 400, False, "The configured groupId is invalid.")
    UNKNOWN_MEMBER_ID = _Spec(25, 409, False, "The coordinator is not aware of this member.")
    INVALID_SESSION_TIMEOUT = _Spec(
        26,
        400,
        False,
        "The session timeout is not within the range allowed by the broker (as configured by group.min.session.timeout.ms and group.max.session.timeout.ms).",
    )
    REBALANCE_IN_PROGRESS = _Spec(27, 409, False, "The group is rebalancing, so a rejoin is needed.")
    TOPIC_AUTHORIZATION_FAILED = _Spec(29, 403, False, "Topic authorization failed.")
    GROUP_AUTHORIZATION_FAILED = _Spec(30, 403, False, "Group authorization failed.")
    CLUSTER_AUTHORIZATION_FAILED = _Spec(31, 403, False, "Cluster authorization failed.")
    UNSUPPORTED_SASL_MECHANISM = _Spec(33, 400, False, "The broker does not support the requested SASL mechanism.")
    ILLEGAL_SASL_STATE = _Spec(34, 400, False, "Request is not valid given the current SASL state.")
    UNSUPPORTED_VERSION = _Spec(35, 400, False, "The version of API is not supported.")
    TOPIC_ALREADY_EXISTS = _Spec(36, 409, False, "Topic with this name already exists.")
    INVALID_PARTITIONS = _Spec(37, 400, False, "Number of partitions is below 1.")
    INVALID_REPLICATION_FACTOR = _Spec(
        38, 400, False, "Replication factor is below 1 or larger than the number of available brokers."
    )
    INVALID_REPLICA_ASSIGNMENT = _Spec(39, 400, False, "Replica assignment is invalid.")
    INVALID_CONFIG = _Spec(40, 400, False, "Configuration is invalid.")
    INVALID_REQUEST = _Spec(42, 400, False, "This most likely occurs because of a request being malformed.")
    UNSUPPORTED_FOR_MESSAGE_FORMAT = _Spec(
        43, 400, False, "The message format version on the broker does not support the request."
    )
    POLICY_VIOLATION = _Spec(44, 400, False, "Request parameters do not satisfy the configured policy.")
    OUT_OF_ORDER_SEQUENCE_NUMBER = _Spec(45, 409, False, "The broker received an out of order sequence number.")
    INVALID_PRODUCER_EPOCH = _Spec(47, 409, False, "Producer attempted to produce with an old epoch.")
    INVALID_TXN_STATE = _Spec(48, 409, False, "The producer attempted a transactional operation in an invalid state.")
    INVALID_PRODUCER_ID_MAPPING = _Spec(
        49, 409, False, "The producer attempted to use a producer id which is not currently assigned to its transactional id."
    )
    INVALID_TRANSACTION_TIMEOUT = _Spec(
        50, 400, False, "The transaction timeout is larger than the maximum value allowed by the broker."
    )
    CONCURRENT_TRANSACTIONS = _Spec(
        51,
        409,
        True,
        "The producer attempted to update a transaction while another concurrent operation on the same transaction was ongoing.",
    )
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = _Spec(53, 403, False, "Transactional Id authorization failed.")
    SECURITY_DISABLED = _Spec(54, 400, False, "Security features are disabled.")
    OPERATION_NOT_ATTEMPTED = _Spec(55, 409, False, "The broker did not attempt to execute this operation.")
    SASL_AUTHENTICATION_FAILED = _Spec(58, 401, False, "SASL Authentication failed.")
    KAFKA_STORAGE_ERROR = _Spec(56, 503, True, "Disk error when trying to access log file on the disk.")
    UNKNOWN_PRODUCER_ID = _Spec(
        59, 409, False, "This exception is raised by the broker if it could not locate the producer metadata."
    )
    NON_EMPTY_GROUP = _Spec(68, 409, False, "The group is not empty.")
    GROUP_ID_NOT_FOUND = _Spec(69, 404, False, "The group id does not exist.")
    FENCED_LEADER_EPOCH = _Spec(74, 409, True, "The leader epoch in the request is older than the epoch on the broker.")
    UNKNOWN_LEADER_EPOCH = _Spec(75, 409, True, "The leader epoch in the request is newer than the epoch on the broker.")
    UNSUPPORTED_COMPRESSION_TYPE = _Spec(
        76, 400, False, "The requesting client does not support the compression type of given partition."
    )
    MEMBER_ID_REQUIRED = _Spec(
        79, 409, False, "The group member needs to have a valid member id before actually entering a consumer group."
    )
    GROUP_MAX_SIZE_REACHED = _Spec(81, 409, False, "The consumer group has reached its max size.")
    FENCED_INSTANCE_ID = _Spec(
        82,
        409,
        False,
        "The broker rejected this static consumer since another consumer with the same group.instance.id has registered with a different member.id.",
    )
    GROUP_SUBSCRIBED_TO_TOPIC = _Spec(86, 409, False, "The consumer group is actively subscribed to the topic.")
    INVALID_RECORD = _Spec(87, 400, False, "This record has failed the validation on broker and hence will be rejected.")
    UNSTABLE_OFFSET_COMMIT = _Spec(88, 409, True, "There are unstable offsets that need to be cleared.")
    THROTTLING_QUOTA_EXCEEDED = _Spec(89, 429, True, "The throttling quota has been exceeded.")
    PRODUCER_FENCED = _Spec(
        90, 409, False, "There is a newer producer with the same transactionalId which fences the current one."
    )
    RESOURCE_NOT_FOUND = _Spec(91, 404, False, "A request illegally referred to a resource that does not exist.")
    DUPLICATE_RESOURCE = _Spec(92, 409, False, "A request illegally referred to the same resource twice.")
    UNACCEPTABLE_CREDENTIAL = _Spec(93, 400, False, "Requested credential would not meet criteria for acceptability.")
    UNKNOWN_TOPIC_ID = _Spec(100, 404, False, "This server does not host this topic ID.")
    MISMATCHED_ENDPOINT_TYPE = _Spec(114, 400, False, "The request was sent to an endpoint of the wrong type.")
    UNSUPPORTED_ENDPOINT_TYPE = _Spec(115, 400, False, "This endpoint type is not supported yet.")
    TRANSACTION_ABORTABLE = _Spec(
        120,
        409,
        False,
        "The server encountered an error with the transaction. The client can abort the transaction to continue using this transactional ID.",
    )
    INVALID_RECORD_STATE = _Spec(
        121, 409, False, "The record state is invalid. The acknowledgement of delivery could not be completed."
    )
    SHARE_SESSION_NOT_FOUND = _Spec(122, 404, True, "The share session was not found.")
    INVALID_SHARE_SESSION_EPOCH = _Spec(123, 409, True, "The share session epoch is invalid.")
    SHARE_SESSION_LIMIT_REACHED = _Spec(133, 503, True, "The limit of share sessions has been reached.")
    INVALID_REGULAR_EXPRESSION = _Spec(128, 400, False, "The regular expression is not valid.")
    TRANSACTIONAL_ID_NOT_FOUND = _Spec(105, 404, False, "The transactionalId could not be found.")
    FENCED_MEMBER_EPOCH = _Spec(
        110,
        409,
        False,
        "The member epoch is fenced by the group coordinator. The member must abandon all its partitions and rejoin.",
    )
    UNRELEASED_INSTANCE_ID = _Spec(
        111, 409, False, "The instance ID is still used by another member in the consumer group. That member must leave first."
    )
    UNSUPPORTED_ASSIGNOR = _Spec(112, 400, False, "The assignor or its version range is not supported by the consumer group.")
    STALE_MEMBER_EPOCH = _Spec(
        113,
        409,
        False,
        "The member epoch is stale. The member must retry after receiving its updated member epoch via the ConsumerGroupHeartbeat API.",
    )

    @property
    def kafka_code(self) -> int:
        return self.value.kafka_code

    @property
    def http_status(self) -> int:
        return self.value.http_status

    @property
    def retriable(self) -> bool:
        return self.value.retriable


class TxlogError(Exception):
    """A failure with a Kafka name. ``details`` are extra fields of the error object (e.g. ``reason``)."""

    def __init__(self, code: ErrorCode, message: str | None = None, **details: object) -> None:
        self.code = code
        self.message = message or code.value.default_message
        self.details = details
        super().__init__(f"{code.name}: {self.message}")

    def to_dict(self) -> dict[str, object]:
        return {
            "code": self.code.name,
            "kafka_code": self.code.kafka_code,
            "message": self.message,
            "retriable": self.code.retriable,
            **self.details,
        }


class DatabaseUnavailable(TxlogError):
    """The database cannot be reached: down, restarting, failing over or cut off. Always
    COORDINATOR_NOT_AVAILABLE (retriable) to the HTTP API; each way in may name it as its protocol
    does (the Kafka gateway as a broker names a partition or coordinator it cannot serve)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.COORDINATOR_NOT_AVAILABLE, message)


def error(code: ErrorCode, message: str | None = None, **details: object) -> TxlogError:
    return TxlogError(code, message, **details)
