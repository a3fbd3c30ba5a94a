"""One real local Spark for the whole run (starting one costs seconds), reading the test
PostgreSQL over JDBC (the embedded server listens on 127.0.0.1)."""

from __future__ import annotations

from typing import Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from spark.session import spark_session

    session = spark_session("txlog-tests", "local[2]", {"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()
