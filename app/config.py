"""Settings: environment variables ``TXLOG_*`` (a command-line flag of the same name wins)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TXLOG_", extra="ignore")

    database_url: str | None = None
    data_dir: Path = Path(".txlog")
    max_transaction_timeout_ms: int = Field(900_000, gt=0)  # transaction.max.timeout.ms
    default_transaction_timeout_ms: int = Field(60_000, gt=0)  # transaction.timeout.ms
    transaction_abort_check_interval_ms: int = Field(10_000, gt=0)
    transactional_id_expiration_ms: int = Field(604_800_000, gt=0)
    producer_id_expiration_ms: int = Field(86_400_000, gt=0)
    transaction_state_partitions: int = Field(50, gt=0)  # transaction.state.log.num.partitions
    max_request_bytes: int = Field(1_048_576, gt=0)  # message.max.bytes
    # The longest metadata an OffsetCommit or TxnOffsetCommit may store with an offset, counted as
    # Kafka counts it (UTF-16 code units, Java's String.length()).
    offset_metadata_max_bytes: int = Field(4096, ge=0)  # offset.metadata.max.bytes
    # Defaults for topics without retention.ms / retention.bytes (-1: keep everything). Kafka's
    # log.retention.ms is 7 days; txlog keeps every record unless told otherwise.
    log_retention_ms: int = Field(-1, ge=-1)  # log.retention.ms
    log_retention_bytes: int = Field(-1, ge=-1)  # log.retention.bytes
    db_pool_size: int = Field(10, gt=0)
    # A server or gateway started while no database host accepts writes (down, restarting, failing
    # over) waits this long for one before it gives up (exit 1).
    startup_database_wait_ms: int = Field(60_000, ge=0)
    # uvicorn's access log, a line per HTTP request: off unless asked for (a busy worker spent 5-8%
    # of its CPU on it; /metrics counts requests by route and status).
    access_log: bool = False
    # Plain and idempotent batches arriving together in one process are appended in one database
    # transaction (a group commit), up to this many (1: each batch in its own).
    produce_group_commit_batches: int = Field(16, ge=1)
    # Connections beyond the pool for bursts, and how long a request waits for a free one before
    # it is answered REQUEST_TIMED_OUT (503, retriable, Retry-After) rather than hanging.
    db_pool_max_overflow: int = Field(20, ge=0)
    db_pool_timeout_ms: int = Field(2_000, gt=0)
    admin_token: str | None = None
    # Authentication of the API: none (only on loopback unless `txlog serve --insecure`), or a
    # principal's token as `Authorization: Bearer`, authorized by Kafka's ACLs (docs/security.md).
    auth: Literal["none", "token"] = "none"
    # What keeps one stuck process (a VM stall, SIGSTOP, a partition TCP does not notice) from
    # freezing the log for everyone: limits PostgreSQL enforces on every txlog session.
    db_lock_timeout_ms: int = Field(5_000, ge=0)  # a lock wait longer than this is REQUEST_TIMED_OUT (retriable)
    db_statement_timeout_ms: int = Field(30_000, ge=0)  # a statement running longer is REQUEST_TIMED_OUT
    # A session idle inside a transaction this long is ended by the server, its locks released.
    db_idle_in_transaction_timeout_ms: int = Field(10_000, ge=0)
    # TCP keepalives both ways and a bound on unacknowledged data, so a dead peer is noticed.
    db_keepalives_idle_s: int = Field(10, gt=0)
    db_keepalives_interval_s: int = Field(5, gt=0)
    db_keepalives_count: int = Field(3, gt=0)
    db_tcp_user_timeout_ms: int = Field(30_000, ge=0)

    # Half messages (RocketMQ's transactional messages). The check-back endpoints the server may
    # call: host names matched exactly and IP addresses or networks, comma-separated (loopback only
    # by default, so the server cannot be turned against the network).
    half_check_allowed_hosts: str = "localhost,127.0.0.0/8,::1"
    half_check_timeout_ms: int = Field(3_000, gt=0)  # one check-back call, connect to answer
    half_check_poll_interval_ms: int = Field(1_000, gt=0)  # how often the checker looks for due half messages
    half_check_concurrency: int = Field(8, gt=0)  # check-back calls in flight per process
    half_message_retention_ms: int = Field(604_800_000, gt=0)  # decided half messages are kept this long
    # The outbox drainer: how often it looks for committed rows, and rows per append at most. A
    # pass finding none doubles the wait, up to the idle interval (an idle outbox costs each
    # worker a statement a second, not twenty); a pass that moved rows brings it back down.
    outbox_poll_interval_ms: int = Field(50, gt=0)
    outbox_idle_poll_interval_ms: int = Field(1_000, gt=0)
    outbox_batch_records: int = Field(500, gt=0)

    # Limits (app/domain/limits.py), each refused with a Kafka-named error.
    max_batch_records: int = Field(100_000, gt=0)  # records in one produced batch: RECORD_LIST_TOO_LARGE
    max_key_bytes: int = Field(65_536, gt=0)  # a record's key: MESSAGE_TOO_LARGE
    max_value_bytes: int = Field(1_048_576, gt=0)  # a record's value (message.max.bytes): MESSAGE_TOO_LARGE
    max_header_bytes: int = Field(65_536, gt=0)  # a record's header keys and values together: MESSAGE_TOO_LARGE
    max_partitions_per_topic: int = Field(10_000, gt=0)  # INVALID_PARTITIONS
    max_partitions_per_transaction: int = Field(1_000, gt=0)  # POLICY_VIOLATION
    # Transactions open at once that one principal started (no limit without authentication):
    # THROTTLING_QUOTA_EXCEEDED (retriable).
    max_open_transactions_per_principal: int = Field(1_000, gt=0)
    # A fetch's wait_ms above this is shortened to it, as a broker bounds a consumer's
    # fetch.max.wait.ms (at most 60 s: the long-poll listener's lease covers that).
    max_fetch_wait_ms: int = Field(60_000, ge=0, le=60_000)
    # Long-polling fetches waiting at once in one worker; beyond it a fetch answers at once.
    max_long_polls: int = Field(1_000, ge=0)
    # The least share.record.lock.duration.ms a share group may set (Kafka's broker config
    # group.share.min.record.lock.duration.ms: 15 s by default, at least 1 s).
    share_min_record_lock_duration_ms: int = Field(15_000, ge=1_000, le=60_000)

    # The Kafka wire gateway (`txlog kafka`, docs/kafka.md). Several gateways against one database
    # act as the brokers of one cluster, each with its own node id.
    # One listener (`--listen`): PLAINTEXT, or SASL_PLAINTEXT with TXLOG_AUTH=token.
    kafka_listen: str = "127.0.0.1:9092"
    kafka_advertised_host: str | None = None  # the host clients are told to connect to (default: the listen host)
    # Several listeners, as Kafka names them (app/domain/listeners.py): listeners,
    # advertised.listeners and listener.security.protocol.map. Set, they replace kafka_listen.
    kafka_listeners: str | None = None
    kafka_advertised_listeners: str | None = None
    kafka_listener_security_protocol_map: str | None = None
    # TLS of the SSL and SASL_SSL listeners (PEM files): ssl.keystore.location and ssl.key.password's
    # part, ssl.truststore.location (the CA that signs client certificates), ssl.client.auth, and
    # ssl.principal.mapping.rules (a client certificate's subject to a principal's name).
    kafka_ssl_certfile: str | None = None
    kafka_ssl_keyfile: str | None = None
    kafka_ssl_cafile: str | None = None
    kafka_ssl_client_auth: Literal["none", "requested", "required"] = "none"
    kafka_ssl_principal_mapping_rules: str = "DEFAULT"
    # A TLS handshake not finished within this is cut off (no task waits on it past the bound).
    kafka_ssl_handshake_timeout_ms: int = Field(10_000, gt=0)
    # A connection that has not signed in within this (from its accept: the whole SASL exchange,
    # however slowly its bytes come) is closed.
    kafka_authentication_timeout_ms: int = Field(30_000, gt=0)
    # KIP-368 (connections.max.reauth.ms): a SASL session lasts this long (0: for ever); the
    # client must sign in again on the same connection before it ends, else it is closed.
    kafka_connections_max_reauth_ms: int = Field(0, ge=0)
    kafka_node_id: int = Field(0, ge=0)
    # The transaction.version feature ApiVersions finalizes, as a Kafka operator finalizes it
    # (kafka-features.sh): 2 lets Java clients from 4.0 use transactions V2 (KIP-890); 1 keeps every
    # client on the first transaction protocol. Requests are served by their versions either way.
    kafka_transaction_version: int = Field(2, ge=1, le=2)
    # Metadata for an unknown topic creates it (Kafka's auto.create.topics.enable), with
    # kafka_num_partitions partitions (num.partitions).
    kafka_auto_create_topics: bool = False
    kafka_num_partitions: int = Field(1, gt=0)
    # Hostile-input limits: one request frame (socket.request.max.bytes), one batch decompressed,
    # records in one batch, and connections open at once.
    kafka_max_frame_bytes: int = Field(104_857_600, gt=0)
    kafka_max_decompressed_bytes: int = Field(67_108_864, gt=0)
    kafka_max_batch_records: int = Field(1_000_000, gt=0)
    kafka_max_connections: int = Field(1_000, gt=0)
    # Group coordination: group.initial.rebalance.delay.ms, the session timeouts a member may ask for,
    # and group.max.size (None: no limit; members beyond it get GROUP_MAX_SIZE_REACHED).
    kafka_group_initial_rebalance_delay_ms: int = Field(3_000, ge=0)
    kafka_group_min_session_timeout_ms: int = Field(6_000, gt=0)
    kafka_group_max_session_timeout_ms: int = Field(1_800_000, gt=0)
    kafka_group_max_size: int | None = Field(None, gt=0)
    # Consumer groups of the next-generation protocol (KIP-848): group.consumer.session.timeout.ms
    # (a member silent that long is fenced), group.consumer.heartbeat.interval.ms (how often members
    # are told to heartbeat) and group.consumer.max.size (None: no limit).
    kafka_consumer_group_session_timeout_ms: int = Field(45_000, gt=0)
    kafka_consumer_group_heartbeat_interval_ms: int = Field(5_000, gt=0)
    kafka_consumer_group_max_size: int | None = Field(None, gt=0)
    # How long a gateway's entry in the node registry lives without renewal (renewed at a third).
    kafka_node_lease_ms: int = Field(10_000, gt=0)
    # The gateway's rack, Kafka's broker.rack (Metadata shows it; a consumer whose client.rack is a
    # read replica's is sent to fetch there, KIP-392). None: no rack.
    kafka_rack: str | None = None
    # A read replica gateway: the hot standby it serves Fetch and ListOffsets from (a libpq URL).
    # The gateway registers as a read replica (leading no partition, coordinating no group);
    # database_url stays the primary, for the registry and every other request. None: a gateway
    # of the primary.
    replica_database_url: str | None = None
    # How often a read replica's long-polling fetch reads its standby again while it waits: the
    # primary's append notifications come before the standby has replayed the append.
    replica_poll_interval_ms: int = Field(50, gt=0, le=60_000)
    # The RocketMQ gateway (`txlog rocketmq`, docs/rocketmq.md): RocketMQ 5's gRPC protocol on the
    # port of RocketMQ's proxy (8081). Clients are routed to the advertised host (default: the
    # listen host, or the access point the client asked through when listening on every address).
    rocketmq_listen: str = "127.0.0.1:8081"
    rocketmq_advertised_host: str | None = None
    # How long a RocketMQ gateway's entry in its registry lives without renewal (renewed at a third):
    # a gateway that dies is routed to no more once it ends.
    rocketmq_gateway_lease_ms: int = Field(10_000, gt=0)
    # One gRPC message at most (a SendMessage request whole): a body above max_value_bytes but
    # within this is answered MESSAGE_BODY_TOO_LARGE; above it gRPC itself refuses the call.
    rocketmq_max_inbound_message_bytes: int = Field(16_777_216, gt=0)
    # Push consumers (a receive with auto_renew): the invisible duration of their receives (the
    # proxy's defaultInvisibleTimeMills, at most 12 h), and the renewal of their receipt handles in
    # the background: a round every schedule period (renewSchedulePeriodMillis) renews the handles
    # whose lock ends within the renew-ahead time (renewAheadTimeMillis).
    rocketmq_default_invisible_ms: int = Field(60_000, gt=0, le=43_200_000)
    rocketmq_renew_schedule_period_ms: int = Field(5_000, gt=0)
    rocketmq_renew_ahead_ms: int = Field(10_000, gt=0)
    # Client quotas' rate measurement, Kafka's quota.window.num and quota.window.size.seconds.
    quota_window_num: int = Field(11, ge=2)
    quota_window_size_seconds: int = Field(1, ge=1)

    @field_validator(
        "kafka_listeners",
        "kafka_advertised_listeners",
        "kafka_listener_security_protocol_map",
        "kafka_ssl_certfile",
        "kafka_ssl_keyfile",
        "kafka_ssl_cafile",
    )
    @classmethod
    def _blank_is_none(cls, v: str | None) -> str | None:
        return v if v and v.strip() else None

    @field_validator("database_url")
    @classmethod
    def _empty_is_none(cls, v: str | None) -> str | None:
        return v or None


def load_settings(**overrides: Any) -> Settings:
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
