"""The RocketMQ gateway: RocketMQ 5's gRPC protocol (``apache.rocketmq.v2.MessagingService``),
the one its own clients speak to a proxy, translated into txlog's services.

- ``server``: the gRPC server (grpc.aio) and the MessagingService's RPCs, each a translation into
  service calls; RPCs not served yet answer gRPC's UNIMPLEMENTED.
- ``messages``: a RocketMQ message as a record of the log (body, tag, keys, properties, id).
- ``clients``: the clients this gateway knows (heartbeats, settings, their Telemetry streams, on
  which the gateway pushes commands to a client).
- ``transactions``: transactional messages on the half-message store: EndTransaction, and the
  check-backs this gateway claims and pushes to its live producers.
- ``status``: txlog's errors as RocketMQ's status codes.

The protocol's messages are ``app.wire.rocketmq``'s. No SQL and no copy of a rule here: the
services own both.
"""
