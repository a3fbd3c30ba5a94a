"""TXLOG_AUTH=token against a real server with two workers: authentication, Kafka's ACL rules for
each request, listings filtered to what a principal may describe, management over HTTP, and
revocation and ACL changes taking effect on every worker."""

from __future__ import annotations

import httpx

from app.domain.acl_bindings import Operation as O
from app.domain.acl_bindings import ResourceType as R
from app.services import security
from tests.security.conftest import Principals, client, code, eventually, on_new_connections
from tests.support import ServerProcess, wait_until


def records(*values: str) -> dict:
    return {"records": [{"key": None, "value": v} for v in values]}


def test_no_or_a_bad_token_is_refused_and_health_stays_open(server: ServerProcess) -> None:
    with (
        client(server, None) as anonymous,
        client(server, "txlog_0123456789abcdef_wrong") as wrong,
        client(server, "nonsense") as other,
    ):
        for c in (anonymous, wrong, other):
            r = c.get("/v1/topics")
            assert r.status_code == 401 and code(r) == "SASL_AUTHENTICATION_FAILED", r.text
        r = anonymous.get("/v1/topics", headers={"Authorization": "Basic YWxpY2U6cHc="})
        assert r.status_code == 401
        assert anonymous.get("/healthz").status_code == 200
        assert anonymous.get("/readyz").status_code == 200
        assert anonymous.get("/openapi.json").status_code == 200
        assert anonymous.get("/metrics").status_code == 401


def test_a_principal_that_may_write_one_topic_and_read_nothing_else(admin: httpx.Client, principals: Principals) -> None:
    for name in ("w-only", "w-other"):
        assert admin.post("/v1/topics", json={"name": name, "partitions": 1}).status_code == 201
    writer = principals.create("writer")
    principals.grant("writer", R.TOPIC, "w-only", O.WRITE)
    with writer:
        r = eventually(lambda: writer.post("/v1/topics/w-only/records", json=records("a")), 200)
        assert r.json()["base_offset"] >= 0
        r = writer.post("/v1/topics/w-only/partitions/0/records", json=records("b"))
        assert r.status_code == 200, r.text
        # Everything else is refused with the error of the resource it lacks.
        for r in (
            writer.post("/v1/topics/w-other/records", json=records("x")),
            writer.get("/v1/topics/w-only/partitions/0/records"),
            writer.get("/v1/topics/w-other/partitions/0/records"),
            writer.get("/v1/topics/w-other"),
            writer.patch("/v1/topics/w-only", json={"config": {"retention.ms": "1"}}),
            writer.post("/v1/topics/w-only/partitions/0/delete-records", json={"before_offset": 1}),
            writer.post("/v1/topics", json={"name": "w-new"}),
        ):
            assert r.status_code == 403 and code(r) == "TOPIC_AUTHORIZATION_FAILED", (r.request.url, r.text)
        r = writer.post("/v1/producers", json={})
        assert r.status_code == 403 and code(r) == "CLUSTER_AUTHORIZATION_FAILED"
        r = writer.post(
            "/v1/topics/w-only/partitions/0/records",
            json={"producer_id": 1, "producer_epoch": 0, "base_sequence": 0, **records("c")},
        )
        assert r.status_code == 403 and code(r) == "CLUSTER_AUTHORIZATION_FAILED"
        r = writer.get("/v1/groups/g/offsets")
        assert r.status_code == 403 and code(r) == "GROUP_AUTHORIZATION_FAILED"
        for path in (
            "/v1/open-transactions",
            "/v1/topics/w-only/partitions/0/producers",
            "/v1/acls",
            "/v1/principals",
            "/metrics",
        ):
            r = writer.get(path)
            assert r.status_code == 403 and code(r) == "CLUSTER_AUTHORIZATION_FAILED", path
        # Write implies Describe: the topic it may write is the only one it sees.
        assert writer.get("/v1/topics").json() == {"topics": [{"name": "w-only", "partitions": 1}]}
        assert writer.get("/v1/topics/w-only").status_code == 200
        assert writer.get("/v1/transactions").json() == {"transactions": []}
        assert writer.get("/v1/groups").json() == {"groups": []}


def test_transactions_need_write_on_the_transactional_id(admin: httpx.Client, principals: Principals) -> None:
    assert admin.post("/v1/topics", json={"name": "tx-in", "partitions": 1}).status_code == 201
    assert admin.post("/v1/topics", json={"name": "tx-out", "partitions": 1}).status_code == 201
    app = principals.create("app")
    principals.grant("app", R.TOPIC, "tx-", O.READ, O.WRITE, prefixed=True)
    principals.grant("app", R.GROUP, "app-group", O.READ)
    with app:
        r = eventually(lambda: app.post("/v1/producers", json={"transactional_id": "app-1"}), 403)
        assert code(r) == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
        principals.grant("app", R.TRANSACTIONAL_ID, "app-", O.WRITE, prefixed=True)
        pid = eventually(lambda: app.post("/v1/producers", json={"transactional_id": "app-1"}), 200).json()
        ids = {"producer_id": pid["producer_id"], "producer_epoch": pid["producer_epoch"]}
        batch = {**ids, "base_sequence": 0, "transactional_id": "app-1", **records("v")}
        assert app.post("/v1/topics/tx-out/partitions/0/records", json=batch).status_code == 200
        offsets = {**ids, "group_id": "app-group", "offsets": [{"topic": "tx-in", "partition": 0, "offset": 0}]}
        assert app.post("/v1/transactions/app-1/offsets", json=offsets).status_code == 200
        r = app.post("/v1/transactions/app-1/offsets", json={**offsets, "group_id": "other-group"})
        assert r.status_code == 403 and code(r) == "GROUP_AUTHORIZATION_FAILED"
        r = app.post("/v1/transactions/app-1/partitions", json={**ids, "partitions": [{"topic": "w-other", "partition": 0}]})
        assert r.status_code == 403 and code(r) == "TOPIC_AUTHORIZATION_FAILED"
        end = app.post("/v1/transactions/app-1/end", json={**ids, "result": "commit"})
        assert end.status_code == 200 and end.json()["state"] == "CompleteCommit", end.text
        assert app.get("/v1/transactions/app-1").status_code == 200
        assert [t["transactional_id"] for t in app.get("/v1/transactions").json()["transactions"]] == ["app-1"]
        # Another's transactional id: every transaction request is refused.
        for r in (
            app.post("/v1/producers", json={"transactional_id": "bank-1"}),
            app.post("/v1/transactions/bank-1/end", json={**ids, "result": "abort"}),
            app.post("/v1/transactions/bank-1/partitions", json={**ids, "partitions": [{"topic": "tx-out", "partition": 0}]}),
            app.get("/v1/transactions/bank-1"),
            app.post("/v1/topics/tx-out/partitions/0/records", json={**batch, "transactional_id": "bank-1"}),
        ):
            assert r.status_code == 403 and code(r) == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", (r.request.url, r.text)
        # The operator's abort needs Alter on the cluster.
        r = app.post("/v1/transactions/app-1/abort")
        assert r.status_code == 403 and code(r) == "CLUSTER_AUTHORIZATION_FAILED"
        r = app.post("/v1/topics/tx-out/partitions/0/abort-transaction", json={})
        assert r.status_code == 403 and code(r) == "CLUSTER_AUTHORIZATION_FAILED"
        # read_committed fetch and group offsets with Read on the topic and the group.
        fetched = app.get("/v1/topics/tx-out/partitions/0/records", params={"isolation_level": "read_committed"}).json()
        assert [r["value"] for r in fetched["records"]] == ["v"]
        assert app.get("/v1/groups/app-group/offsets").json()["offsets"][0]["offset"] == 0
        assert (
            app.post(
                "/v1/groups/app-group/offsets", json={"offsets": [{"topic": "tx-in", "partition": 0, "offset": 1}]}
            ).status_code
            == 200
        )
        r = app.post("/v1/groups/app-group/offsets", json={"offsets": [{"topic": "w-only", "partition": 0, "offset": 1}]})
        assert r.status_code == 403 and code(r) == "TOPIC_AUTHORIZATION_FAILED"


def test_idempotent_produce_needs_idempotent_write_on_the_cluster(admin: httpx.Client, principals: Principals) -> None:
    assert admin.post("/v1/topics", json={"name": "idem", "partitions": 1}).status_code == 201
    producer = principals.create("idem-producer")
    principals.grant("idem-producer", R.TOPIC, "idem", O.WRITE)
    with producer:
        r = eventually(lambda: producer.post("/v1/producers", json={}), 403)
        assert code(r) == "CLUSTER_AUTHORIZATION_FAILED"
        principals.grant("idem-producer", R.CLUSTER, "", O.IDEMPOTENT_WRITE)
        pid = eventually(lambda: producer.post("/v1/producers", json={}), 200).json()
        batch = {"producer_id": pid["producer_id"], "producer_epoch": pid["producer_epoch"], "base_sequence": 0, **records("a")}
        assert producer.post("/v1/topics/idem/partitions/0/records", json=batch).status_code == 200


def test_deny_wins_and_acl_changes_reach_every_worker(admin: httpx.Client, principals: Principals) -> None:
    for name in ("public-news", "secret-plans"):
        assert admin.post("/v1/topics", json={"name": name, "partitions": 1}).status_code == 201
    reader = principals.create("reader")
    principals.grant("reader", R.TOPIC, "*", O.ALL)
    with reader:
        eventually(lambda: reader.get("/v1/topics/secret-plans/partitions/0/records"), 200)
        denial = principals.grant("reader", R.TOPIC, "secret", O.READ, deny=True, prefixed=True)
        r = eventually(lambda: reader.get("/v1/topics/secret-plans/partitions/0/records"), 403)
        assert code(r) == "TOPIC_AUTHORIZATION_FAILED"
        eventually(on_new_connections(reader, "/v1/topics/secret-plans/partitions/0/records"), 403, times=16)
        assert reader.get("/v1/topics/public-news/partitions/0/records").status_code == 200
        assert reader.post("/v1/topics/secret-plans/records", json=records("w")).status_code == 200  # only Read is denied
        security.remove_acls(principals.db, denial)
        eventually(lambda: reader.get("/v1/topics/secret-plans/partitions/0/records"), 200)
        eventually(on_new_connections(reader, "/v1/topics/secret-plans/partitions/0/records"), 200, times=16)


def test_revocation_takes_effect_on_a_running_server(admin: httpx.Client, principals: Principals, server: ServerProcess) -> None:
    assert admin.post("/v1/topics", json={"name": "revoked-topic", "partitions": 1}).status_code == 201
    user = principals.create("soon-revoked")
    principals.grant("soon-revoked", R.TOPIC, "revoked-topic", O.READ)
    with user:
        eventually(lambda: user.get("/v1/topics/revoked-topic/partitions/0/records"), 200, times=16)
        security.revoke_principal(principals.db, "soon-revoked")
        r = eventually(on_new_connections(user, "/v1/topics/revoked-topic/partitions/0/records"), 401, times=16)
        assert code(r) == "SASL_AUTHENTICATION_FAILED"
    # A new token for the name works; the old one stays refused.
    with principals.create("soon-revoked") as again:
        eventually(lambda: again.get("/v1/topics/revoked-topic/partitions/0/records"), 200)
        assert user.headers["Authorization"] != again.headers["Authorization"]


def test_principals_and_acls_over_http_need_alter_on_the_cluster(
    admin: httpx.Client, principals: Principals, server: ServerProcess
) -> None:
    created = admin.post("/v1/principals", json={"name": "http-made"})
    assert created.status_code == 201, created.text
    token = created.json()["token"]
    assert token.startswith("txlog_")
    assert "token" not in admin.get("/v1/principals").json()["principals"][0]
    acl = {"principal": "User:http-made", "resource_type": "topic", "resource_name": "w-only", "operation": "Read"}
    assert admin.post("/v1/acls", json={"acls": [acl]}).json()["acls"][0]["principal"] == "http-made"
    listed = admin.get("/v1/acls", params={"principal": "http-made"}).json()["acls"]
    assert listed == [{**acl, "principal": "http-made", "pattern_type": "literal", "permission_type": "allow"}]
    with client(server, token) as made:
        eventually(lambda: made.get("/v1/topics/w-only/partitions/0/records"), 200)
        r = made.post("/v1/acls", json={"acls": [{**acl, "resource_name": "w-other"}]})
        assert r.status_code == 403 and code(r) == "CLUSTER_AUTHORIZATION_FAILED"
        r = made.delete("/v1/principals/writer")
        assert r.status_code == 403 and code(r) == "CLUSTER_AUTHORIZATION_FAILED"
        removed = admin.delete(
            "/v1/acls",
            params={"principal": "http-made", "resource_type": "topic", "resource_name": "w-only", "operation": "Read"},
        )
        assert len(removed.json()["acls"]) == 1
        eventually(lambda: made.get("/v1/topics/w-only/partitions/0/records"), 403)
        assert admin.delete("/v1/principals/http-made").json()["revoked_at_ms"] is not None
        eventually(lambda: made.get("/v1/topics"), 401)


def _sign_in(c: httpx.Client, token: str) -> httpx.Response:
    from tests.admin.conftest import csrf_of

    form = c.get("/admin/sign-in")
    assert form.status_code == 200, form.text
    return c.post("/admin/sign-in", data={"token": token, "csrf_token": csrf_of(form.text), "next": "/admin/"})


def test_admin_pages_sign_in_with_a_principal_token(principals: Principals, server: ServerProcess) -> None:
    from app.services import security as svc

    viewer_token = svc.create_principal(principals.db, "page-viewer").token
    principals.grant("page-viewer", R.CLUSTER, "", O.DESCRIBE)
    outsider_token = svc.create_principal(principals.db, "page-outsider").token
    with httpx.Client(base_url=server.url, timeout=30) as anonymous:
        assert anonymous.get("/admin/").status_code == 303  # to the sign-in form
        assert _sign_in(anonymous, "txlog_0000_wrong").status_code == 401
    with httpx.Client(base_url=server.url, timeout=30) as outsider:
        # A principal just created: every worker knows it within a second.
        wait_until(lambda: _sign_in(outsider, outsider_token).status_code == 303, 5, 0.05, "sign-in")
        assert outsider.get("/admin/").status_code == 403  # no Describe on the cluster
    with httpx.Client(base_url=server.url, timeout=30) as viewer:
        # A principal just created: every worker knows it within a second.
        wait_until(lambda: _sign_in(viewer, viewer_token).status_code == 303, 5, 0.05, "sign-in")
        page = eventually(lambda: viewer.get("/admin/"), 200, times=4)
        assert "page-viewer" in page.text
        # Viewing is not aborting: that needs Alter on the cluster.
        from tests.admin.conftest import csrf_of

        r = viewer.post("/admin/transactions/abort/app-1", data={"csrf_token": csrf_of(page.text)})
        assert r.status_code == 403 and "CLUSTER_AUTHORIZATION_FAILED" in r.text
        svc.revoke_principal(principals.db, "page-viewer")
        eventually(lambda: viewer.get("/admin/"), 303, times=4)  # the session ended with the token


def test_admin_token_is_the_principal_admin(admin: httpx.Client, server: ServerProcess) -> None:
    from tests.security.conftest import ADMIN_TOKEN

    names = [p["name"] for p in admin.get("/v1/principals").json()["principals"]]
    assert "admin" in names
    with httpx.Client(base_url=server.url, timeout=30) as operator:
        assert _sign_in(operator, ADMIN_TOKEN).status_code == 303
        page = operator.get("/admin/transactions")
        assert page.status_code == 200
        from tests.admin.conftest import csrf_of

        r = operator.post("/admin/transactions/abort/app-1", data={"csrf_token": csrf_of(page.text)})
        assert r.status_code != 403, r.text  # All on the cluster includes Alter
