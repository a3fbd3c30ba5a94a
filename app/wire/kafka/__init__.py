"""Kafka's binary protocol as bytes.

- Request and response structs, every version, through kafka-python's generated codec:
  ``messages`` (each API's message classes, ours loaded from ``schemas/`` beside kafka-python's;
  the only module that imports kafka-python), ``requests`` (a request's header and body, read),
  ``structs`` (a handler's plain data built into a response and encoded), ``direct_responses``
  (Produce's and Fetch's answers, written directly), ``error_responses`` (error answers and
  ApiVersions' quirks).
- ``records``: record batches v2 (magic 2): decoding (CRC-32C, decompression), encoding, control batches.
- ``admin_client``: a small synchronous Kafka client asking a gateway about its consumer groups.
"""
