"""Consumer groups, as plain data and pure functions, no I/O.

- ``offsets``: the offset rules of OffsetCommit and TxnOffsetCommit, and an offset as committed or
  stored.
- ``state``: Kafka's classic group as data: its states and the transitions between them, its
  members, the requests, answers and effects its events exchange, the timers that follow from it.
- ``coordinator``: the classic group coordinator's events (JoinGroup, SyncGroup, Heartbeat,
  LeaveGroup, timers, OffsetCommit's check, unload, delete), each a function to an ``Outcome``.
- ``describe``: a group as DescribeGroups, ListGroups and the admin pages read it.
"""
