"""Per-partition producer state and the idempotence rules, as Kafka's ProducerStateEntry and
ProducerAppendInfo. Pure functions over frozen values; storage persists the result after the append.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from app.errors import ErrorCode, TxlogError

NUM_BATCHES_TO_RETAIN = 5
MAX_SEQUENCE = 2**31 - 1
MAX_EPOCH = 32767  # Kafka's Short.MAX_VALUE: the epoch is an int16 (a smallint in the tables)


def increment_sequence(sequence: int, increment: int) -> int:
    """Sequence arithmetic with Kafka's wrap after 2147483647 to 0."""
    return (sequence + increment) % (MAX_SEQUENCE + 1)


@dataclass(frozen=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp_ms: int

    def to_json(self) -> list[int]:
        return [self.first_seq, self.last_seq, self.first_offset, self.last_offset, self.timestamp_ms]

    @classmethod
    def from_json(cls, v: list[int]) -> "BatchMetadata":
        return cls(*v)


@dataclass(frozen=True)
class ProducerStateEntry:
    """What a partition remembers of one producer id."""

    producer_id: int
    producer_epoch: int
    batches: tuple[BatchMetadata, ...] = ()
    txn_first_offset: int | None = None  # first offset of the producer's open transaction here
    last_timestamp_ms: int = 0

    @property
    def last_seq(self) -> int | None:
        return self.batches[-1].last_seq if self.batches else None


@dataclass(frozen=True)
class Append:
    """The batch is new: append it at ``base_offset``."""

    first_seq: int
    last_seq: int


@dataclass(frozen=True)
class Duplicate:
    """The batch was appended before: answer with its original offsets, append nothing."""

    batch: BatchMetadata


AppendDecision = Append | Duplicate


def fenced(current_epoch: int, epoch: int, reason: str = "newer_epoch", since: str | None = None) -> TxlogError:
    when = f" (changed {since})" if since else ""
    return TxlogError(
        ErrorCode.PRODUCER_FENCED,
        f"Producer epoch {epoch} is fenced: the current epoch is {current_epoch}{when}; reason: {reason}",
        reason=reason,
        current_epoch=current_epoch,
    )


def check_append(
    entry: ProducerStateEntry | None, producer_id: int, producer_epoch: int, base_sequence: int, record_count: int
) -> AppendDecision:
    """Decide whether an idempotent batch is appended, is a duplicate, or is refused."""
    if record_count < 1:
        raise TxlogError(ErrorCode.INVALID_RECORD, "A batch must contain at least one record")
    last_seq = increment_sequence(base_sequence, record_count - 1)
    if entry is None:
        if base_sequence != 0:
            raise TxlogError(
                ErrorCode.UNKNOWN_PRODUCER_ID,
                f"Producer {producer_id} has no state on this partition and sent sequence {base_sequence}, not 0",
            )
        return Append(base_sequence, last_seq)
    if producer_epoch < entry.producer_epoch:
        raise fenced(entry.producer_epoch, producer_epoch)
    if producer_epoch > entry.producer_epoch:
        if base_sequence != 0:
            raise TxlogError(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"Invalid sequence number for new epoch {producer_epoch} of producer {producer_id}: {base_sequence} (expected 0)",
            )
        return Append(base_sequence, last_seq)
    for batch in entry.batches:
        if batch.first_seq == base_sequence and batch.last_seq == last_seq:
            return Duplicate(batch)
    expected = 0 if entry.last_seq is None else increment_sequence(entry.last_seq, 1)
    if base_sequence != expected:
        raise TxlogError(
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
            f"Out of order sequence number for producer {producer_id} at epoch {producer_epoch}: "
            f"{base_sequence} (expected {expected})",
        )
    return Append(base_sequence, last_seq)


def after_append(
    entry: ProducerStateEntry | None,
    producer_id: int,
    producer_epoch: int,
    decision: Append,
    first_offset: int,
    last_offset: int,
    timestamp_ms: int,
    transactional: bool,
) -> ProducerStateEntry:
    """The producer's state once the batch is durably in the log."""
    batch = BatchMetadata(decision.first_seq, decision.last_seq, first_offset, last_offset, timestamp_ms)
    if entry is None or producer_epoch != entry.producer_epoch:
        batches: tuple[BatchMetadata, ...] = (batch,)
        txn_first = entry.txn_first_offset if entry is not None else None
    else:
        batches = (entry.batches + (batch,))[-NUM_BATCHES_TO_RETAIN:]
        txn_first = entry.txn_first_offset
    if transactional and txn_first is None:
        txn_first = first_offset
    return ProducerStateEntry(producer_id, producer_epoch, batches, txn_first, timestamp_ms)


def after_marker(
    entry: ProducerStateEntry | None, producer_id: int, producer_epoch: int, timestamp_ms: int
) -> ProducerStateEntry:
    """A transaction marker closes the producer's open transaction on the partition. A marker at a
    newer epoch moves the entry to that epoch and forgets the older epoch's batches (as Kafka's
    maybeUpdateProducerEpoch): they must not be taken for duplicates at the new epoch."""
    if entry is None:
        return ProducerStateEntry(producer_id, producer_epoch, (), None, timestamp_ms)
    batches = entry.batches if producer_epoch <= entry.producer_epoch else ()
    return replace(
        entry,
        txn_first_offset=None,
        producer_epoch=max(entry.producer_epoch, producer_epoch),
        batches=batches,
        last_timestamp_ms=timestamp_ms,
    )
