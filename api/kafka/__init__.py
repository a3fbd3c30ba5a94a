"""The Kafka wire gateway: Kafka's binary protocol over TCP, translated into txlog's services.

- ``versions``: the one table of served API keys and versions (dispatch and ApiVersions).
- ``server``: the asyncio listener, one request at a time per connection, answers in order.
- ``cluster``: this process's view of the node registry (live gateways, leaders, coordinators).
- ``handlers``: one module per area; each handler turns a decoded request into service calls and
  the response body. No SQL and no copy of a rule here: the services own both.

The bytes themselves — request and response structs, record batches — are ``app.wire.kafka``'s;
the consumer-group coordinator's timers and waiting members are ``app.services.group_coordinator``.
"""
