"""Kafka record batches v2 (magic 2), as producers send them and consumers fetch them.

- ``batch``: the layout (header, records, control records), its constants, a batch as decoded.
- ``decode``: a produce request's records read and checked, and handed to the produce service.
- ``decompress``: a produced batch's records decompressed, never past a budget.
- ``encode``: a fetch's records cut into runs and encoded as batches; transaction markers' batches.
"""
