"""Kafka's binary protocol as bytes.

- ``protocol``: request and response structs (the only module that imports kafka-python's codec).
- ``records``: record batches v2 (magic 2): decoding (CRC-32C, decompression), encoding, control batches.
- ``admin_client``: a small synchronous Kafka client asking a gateway about its consumer groups.
"""
