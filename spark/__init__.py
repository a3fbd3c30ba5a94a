"""Read txlog topics into Spark over JDBC: committed snapshots, incremental jobs, exports.

from spark import read_topic, spark_session
df = read_topic(spark_session("report"), "postgresql://…/txlog", "orders")
"""

from spark.reader import commit_offsets, read_topic, snapshot
from spark.session import spark_session

__all__ = ["commit_offsets", "read_topic", "snapshot", "spark_session"]
