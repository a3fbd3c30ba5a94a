"""RocketMQ 5's gRPC protocol (``apache.rocketmq.v2``) as Python messages.

- ``protocol``: the generated message classes and the MessagingService's server binding, those of
  the official Python client (``rocketmq-python-client``), loaded without the client itself.
"""
