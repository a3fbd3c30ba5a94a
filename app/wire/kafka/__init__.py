"""Kafka's binary protocol as bytes.

- ``protocol``: request and response structs (the only module that imports kafka-python's codec).
- ``records``: record batches v2 (magic 2), CRC-32C, compression, control batches.
- ``admin_client``: a small synchronous Kafka client asking a gateway about its consumer groups.
"""
