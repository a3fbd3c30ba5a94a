"""One database URL naming the primary and its standbys: libpq's form and SQLAlchemy's are
accepted alike, each side gets the form it understands, and nothing else in the URL changes."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from app.storage.db import libpq_url, sqlalchemy_url

LIBPQ = "postgresql://txlog:s%40cret@db1:5432,db2:5433/txlog?target_session_attrs=read-write&sslmode=require"
SQLALCHEMY = (
    "postgresql+psycopg://txlog:s%40cret@/txlog?host=db1:5432&host=db2:5433&target_session_attrs=read-write&sslmode=require"
)


@pytest.mark.parametrize("given", [LIBPQ, SQLALCHEMY, SQLALCHEMY.replace(":5432", "%3A5432").replace(":5433", "%3A5433")])
def test_both_forms_reach_psycopg_as_libpq_host_and_port_lists(given):
    assert libpq_url(given) == LIBPQ
    url = make_url(sqlalchemy_url(given))
    args = sa.create_engine(url).dialect.create_connect_args(url)[1]
    assert (args["host"], args["port"]) == ("db1,db2", "5432,5433")
    assert (args["dbname"], args["user"], args["password"]) == ("txlog", "txlog", "s@cret")
    assert (args["target_session_attrs"], args["sslmode"]) == ("read-write", "require")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://postgres@127.0.0.1:5432/txlog",
        "postgresql://u@/db?host=/var/run/postgresql",
        "postgresql://h/db?sslmode=require&options=-c%20statement_timeout%3D0",
    ],
)
def test_single_host_urls_pass_through(url):
    assert libpq_url(url) == url
    assert sqlalchemy_url(url) == "postgresql+psycopg://" + url[len("postgresql://") :]
