"""The Spark session that reads txlog: the PostgreSQL JDBC driver on its class path for
:mod:`spark.reader`, and the ``txlog`` Python data source of :mod:`spark.datasource` registered."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JDBC_JAR_ENV = "TXLOG_JDBC_JAR"
JDBC_JAR_DEFAULT = "/usr/share/java/postgresql.jar"  # Debian/Ubuntu: apt install libpostgresql-jdbc-java
JDBC_PACKAGE = "org.postgresql:postgresql:42.7.4"  # fetched from Maven Central when no jar is found


def jdbc_driver_conf() -> tuple[str, str]:
    """Where Spark gets the PostgreSQL JDBC driver: ``$TXLOG_JDBC_JAR``, else the system jar, else
    Maven Central (``spark.jars.packages``; needs network access at session start)."""
    given = os.environ.get(JDBC_JAR_ENV)
    if given:
        if not Path(given).is_file():
            raise FileNotFoundError(f"{JDBC_JAR_ENV}={given} is not a file")
        return "spark.jars", given
    if Path(JDBC_JAR_DEFAULT).is_file():
        return "spark.jars", JDBC_JAR_DEFAULT
    return "spark.jars.packages", JDBC_PACKAGE


def spark_session(
    app_name: str = "txlog",
    master: str | None = "local[2]",
    config: Mapping[str, str] | None = None,
    register_datasource: bool = True,
) -> "SparkSession":
    """A SparkSession that can read txlog: the JDBC driver on its class path, Python workers on
    this interpreter (unless ``PYSPARK_PYTHON`` says otherwise), timestamps in UTC, and the
    ``txlog`` Python data source registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master and master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # a local job needs no other interface
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    key, value = jdbc_driver_conf()
    settings = {
        key: value,
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        **(config or {}),
    }
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if register_datasource:
        from spark.datasource import register

        register(spark)
    return spark
