"""Consumer groups, as plain data and pure functions, no I/O.

- ``offsets``: the offset rules of OffsetCommit and TxnOffsetCommit, and an offset as committed or
  stored.
- ``state``: Kafka's classic group as data: its states and the transitions between them, its
  members, the requests, answers and effects its events exchange, the timers that follow from it.
- ``rebalance``: the steps of the join and sync phases the events are made of: a group's small
  changes (a member put, kept alive, answered, parked, removed), the choice of its protocol, a join
  phase from start to end, the members a JoinGroup adds, updates or replaces.
- ``coordinator``: the classic group coordinator's events (JoinGroup, SyncGroup, Heartbeat,
  LeaveGroup, timers, OffsetCommit's check, unload, delete), each a function to an ``Outcome``.
- ``describe``: a group as DescribeGroups, ListGroups and the admin pages read it.
- ``consumer_group``: a consumer group of the next-generation protocol (KIP-848): its state, the
  heartbeat, fencing, and the member-epoch checks of offset commits and fetches; ``assignors``: its
  server-side assignors (uniform, range); ``consumer_group_describe``: ConsumerGroupDescribe's view.
"""
