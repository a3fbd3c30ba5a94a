"""The Kafka wire gateway: Kafka's binary protocol over TCP, translated into txlog's services.

- ``protocol``: request and response structs (the only module that imports kafka-python's codec).
- ``records``: record batches v2 (magic 2), CRC-32C, compression, control batches.
- ``versions``: the one table of served API keys and versions (dispatch and ApiVersions).
- ``server``: the asyncio listener, one request at a time per connection, answers in order.
- ``handlers``: one module per area; each handler turns a decoded request into service calls and
  the response body. No SQL and no copy of a rule here: the services own both.
- ``group_coordinator``: the consumer-group coordinator's timers and waiting members, around the
  pure state machine in ``app.domain.groups``.
"""
