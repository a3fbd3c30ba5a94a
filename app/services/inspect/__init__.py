"""The read side an operator needs: partitions and their offsets, the log with what became of each
record, producer state, transactions and their histories, consumer groups, and what looks stuck.

Read-only: every function reads one snapshot (``broker.db.read()``) through the storage modules
(``app.storage.admin_reads`` and those of each entity) and shapes it into plain values for the admin
pages. Time comes from ``broker.now()``. By page:

- ``overview``: the topics, transactions by state, what looks stuck and the record rate at a glance.
- ``topics``: a topic's partitions, and a partition's log as a reader at each isolation level sees it.
- ``transactions``: transactions that look stuck (alerts), the transactions page, one transaction's
  detail and epochs, and the open transactions on partitions (kafka-transactions.sh find-hanging).
- ``producers``: the producer state of each producer id on each partition.
- ``groups``: consumer groups' committed and pending offsets, and their lag.
- ``rates``: records appended per minute, for the overview and the topic and partition pages.
"""
