"""SCRAM credentials on the Kafka wire: DescribeUserScramCredentials and AlterUserScramCredentials
through confluent-kafka's and kafka-python's admin clients and raw frames against a real gateway,
with Kafka's per-user answers; the SCRAM exchanges of ``app.services.sasl`` on the same database,
driven by kafka-python's SCRAM client, over what those APIs stored.

- An upsertion stores StoredKey and ServerKey derived from the client's SaltedPassword (never a
  password); a user that is no principal becomes one, with a token no one is told; a revoked
  principal is refused, and revoking deletes its credentials.
- Kafka's errors per user: DUPLICATE_RESOURCE for a user named twice, RESOURCE_NOT_FOUND for a
  credential that is not there, UNACCEPTABLE_CREDENTIAL for iterations out of 4096..16384,
  UNSUPPORTED_SASL_MECHANISM for an unknown mechanism; CLUSTER_AUTHORIZATION_FAILED without
  Describe / Alter on the cluster.
- A SCRAM sign-in succeeds with the password, fails alike for a wrong password and an unknown user,
  and fails for a revoked principal or a credential changed during the exchange.
- End to end, on a gateway with TXLOG_AUTH=token: the admin (PLAIN) sets a user's passwords with
  confluent-kafka's AdminClient; that user signs in with SCRAM-SHA-256 and -512 from confluent-kafka,
  kafka-python and aiokafka and produces and consumes; a wrong password is refused; a principal
  without Alter on the cluster may not set passwords.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import shutil
import struct
import subprocess
import uuid
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

from api.kafka.handlers import Node, RequestContext
from api.kafka.handlers import scram as scram_handlers
from app.domain import scram as scram_domain
from app.domain.acl_bindings import CLUSTER_NAME, AclBinding, Operation, PatternType, PermissionType, ResourceType
from app.errors import ErrorCode
from app.services import Broker, sasl, security
from app.services import scram as scram_service
from app.services.security import Authorizer
from app.wire.kafka.messages import ApiKey
from tests.conftest import make_broker
from tests.kafka.conftest import GatewayProcess, RawConnection
from tests.kafka.test_sasl import ADMIN_TOKEN, _topic, secured
from tests.support import wait_until

KCAT = shutil.which("kcat")
__all__ = ["secured"]  # the gateway with TXLOG_AUTH=token, shared with test_sasl.py

SHA256, SHA512 = 1, 2
E = {0: "NONE", **{code.kafka_code: code.name for code in ErrorCode}}


def _user(what: str) -> str:
    return f"scram-{what}-{uuid.uuid4().hex[:8]}"


def _salted(mechanism: int, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac({SHA256: "sha256", SHA512: "sha512"}[mechanism], password.encode(), salt, iterations)


def _upsertion(user: str, mechanism: int, password: str, iterations: int = 4096, salt: bytes = b"pepper") -> dict:
    return {
        "name": user,
        "mechanism": mechanism,
        "iterations": iterations,
        "salt": salt,
        "salted_password": _salted(mechanism if mechanism in (SHA256, SHA512) else SHA256, password, salt, iterations),
    }


def _alter(raw: RawConnection, deletions: list[dict] = [], upsertions: list[dict] = []) -> dict[str, tuple[str, str | None]]:  # noqa: B006
    answer = raw.request(ApiKey.AlterUserScramCredentials, 0, {"deletions": deletions, "upsertions": upsertions})
    return {r.user: (E[r.error_code], r.error_message) for r in answer.results}


def _describe(raw: RawConnection, users: list[str] | None) -> Any:
    return raw.request(ApiKey.DescribeUserScramCredentials, 0, {"users": None if users is None else [{"name": u} for u in users]})


def _stored(url: str, user: str) -> dict[str, tuple]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT mechanism, salt, iterations, stored_key, server_key FROM txlog.scram_credentials WHERE principal = %s",
            (user,),
        ).fetchall()
    return {r[0]: (bytes(r[1]), r[2], bytes(r[3]), bytes(r[4])) for r in rows}


def test_raw_alter_and_describe_with_kafkas_answers(raw: RawConnection, gateway_db: str, store: Broker) -> None:
    alice, bob = _user("alice"), _user("bob")
    assert _alter(raw, upsertions=[_upsertion(alice, SHA256, "pw-256", 8192), _upsertion(bob, SHA512, "pw-512")]) == {
        alice: ("NONE", None),
        bob: ("NONE", None),
    }
    # the keys Kafka derives from the SaltedPassword, never the password
    salted = _salted(SHA256, "pw-256", b"pepper", 8192)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    assert _stored(gateway_db, alice) == {
        "SCRAM-SHA-256": (
            b"pepper",
            8192,
            hashlib.sha256(client_key).digest(),
            hmac.new(salted, b"Server Key", "sha256").digest(),
        )
    }
    # both users are principals now (created implicitly), with tokens no one knows
    assert {alice, bob} <= {p.name for p in security.list_principals(store.db) if p.revoked_at_ms is None}

    described = _describe(raw, [alice, bob, "nobody-" + alice, alice])
    assert described.error_code == 0
    by_user = {
        r.user: (E[r.error_code], r.error_message, [(c.mechanism, c.iterations) for c in r.credential_infos])
        for r in described.results
    }
    assert by_user == {
        alice: (
            "DUPLICATE_RESOURCE",
            f"Cannot describe SCRAM credentials for the same user twice in a single request: {alice}",
            [],
        ),
        bob: ("NONE", None, [(SHA512, 4096)]),
        "nobody-" + alice: (
            "RESOURCE_NOT_FOUND",
            f"Attempt to describe a user credential that does not exist: nobody-{alice}",
            [],
        ),
    }
    everyone = {r.user: [(c.mechanism, c.iterations) for c in r.credential_infos] for r in _describe(raw, None).results}
    assert everyone[alice] == [(SHA256, 8192)] and everyone[bob] == [(SHA512, 4096)]
    assert {r.user for r in _describe(raw, []).results} == set(everyone)  # empty: everyone too

    # a second mechanism for alice, then per-user refusals in one request
    assert _alter(raw, upsertions=[_upsertion(alice, SHA512, "pw-512")]) == {alice: ("NONE", None)}
    few, many, mech, twice, missing = (_user(w) for w in ("few", "many", "mech", "twice", "missing"))
    answered = _alter(
        raw,
        deletions=[
            {"name": twice, "mechanism": SHA256},
            {"name": missing, "mechanism": SHA512},
            {"name": bob, "mechanism": SHA256},
        ],
        upsertions=[
            _upsertion(twice, SHA512, "x"),
            _upsertion(few, SHA256, "x", 4095),
            _upsertion(many, SHA512, "x", 16385),
            _upsertion(mech, 3, "x"),
        ],
    )
    assert answered == {
        twice: ("DUPLICATE_RESOURCE", "A user credential cannot be altered twice in the same request"),
        missing: ("RESOURCE_NOT_FOUND", "Attempt to delete a user credential that does not exist"),
        bob: ("RESOURCE_NOT_FOUND", "Attempt to delete a user credential that does not exist"),  # bob has SHA-512 only
        few: ("UNACCEPTABLE_CREDENTIAL", "Too few iterations"),
        many: ("UNACCEPTABLE_CREDENTIAL", "Too many iterations"),
        mech: ("UNSUPPORTED_SASL_MECHANISM", "Unknown SCRAM mechanism"),
    }
    assert not {few, many, mech, twice, missing} & {p.name for p in security.list_principals(store.db)}  # none created
    assert _alter(raw, deletions=[{"name": alice, "mechanism": SHA256}, {"name": bob, "mechanism": SHA512}]) == {
        alice: ("NONE", None),
        bob: ("NONE", None),
    }
    assert set(_stored(gateway_db, alice)) == {"SCRAM-SHA-512"} and _stored(gateway_db, bob) == {}
    assert E[_describe(raw, [bob]).results[0].error_code] == "RESOURCE_NOT_FOUND"


def test_a_revoked_principal_has_no_credentials_and_gets_none(raw: RawConnection, store: Broker, gateway_db: str) -> None:
    carol = _user("carol")
    created = security.create_principal(store.db, carol)
    assert _alter(raw, upsertions=[_upsertion(carol, SHA256, "pw")]) == {carol: ("NONE", None)}
    security.revoke_principal(store.db, carol)
    assert _stored(gateway_db, carol) == {}
    assert _alter(raw, upsertions=[_upsertion(carol, SHA256, "pw")]) == {
        carol: ("UNACCEPTABLE_CREDENTIAL", f"Principal {carol!r} is revoked: create it again first")
    }
    again = security.create_principal(store.db, carol)  # a new token, no credentials carried over
    assert again.token != created.token and _stored(gateway_db, carol) == {}
    bad = "not a principal name"
    assert _alter(raw, upsertions=[_upsertion(bad, SHA256, "pw")])[bad][0] == "UNACCEPTABLE_CREDENTIAL"


def test_confluent_kafka_admin_client(gateway: GatewayProcess, gateway_db: str) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    dave, erin = _user("dave"), _user("erin")
    futures = admin.alter_user_scram_credentials(
        [
            UserScramCredentialUpsertion(
                dave, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 10000), b"dave-pw", b"salt-dave"
            ),
            UserScramCredentialUpsertion(erin, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"erin-pw"),
        ]
    )
    for f in futures.values():
        assert f.result(30) is None
    stored = _stored(gateway_db, dave)["SCRAM-SHA-256"]
    assert stored[:2] == (b"salt-dave", 10000)
    assert (
        stored[2] == scram_domain.credential_from_password(scram_domain.SCRAM_SHA_256, "dave-pw", b"salt-dave", 10000).stored_key
    )

    described = admin.describe_user_scram_credentials([dave, erin])
    infos = {u: [(i.mechanism, i.iterations) for i in f.result(30).scram_credential_infos] for u, f in described.items()}
    assert infos == {dave: [(ScramMechanism.SCRAM_SHA_256, 10000)], erin: [(ScramMechanism.SCRAM_SHA_512, 4096)]}
    everyone = admin.describe_user_scram_credentials().result(30)
    assert {dave, erin} <= set(everyone)

    missing = admin.describe_user_scram_credentials([_user("missing")])
    with pytest.raises(KafkaException) as info:
        next(iter(missing.values())).result(30)
    assert info.value.args[0].code() == ErrorCode.RESOURCE_NOT_FOUND.kafka_code

    deleted = admin.alter_user_scram_credentials([UserScramCredentialDeletion(dave, ScramMechanism.SCRAM_SHA_512)])
    with pytest.raises(KafkaException) as info:
        deleted[dave].result(30)
    assert info.value.args[0].code() == ErrorCode.RESOURCE_NOT_FOUND.kafka_code
    assert (
        admin.alter_user_scram_credentials([UserScramCredentialDeletion(dave, ScramMechanism.SCRAM_SHA_256)])[dave].result(30)
        is None
    )
    assert _stored(gateway_db, dave) == {}


def test_kafka_python_admin_client(gateway: GatewayProcess, gateway_db: str) -> None:
    from kafka.admin import UserScramCredentialDeletion, UserScramCredentialUpsertion

    from kafka import KafkaAdminClient

    frank = _user("frank")
    admin = KafkaAdminClient(bootstrap_servers=gateway.bootstrap)
    try:
        assert admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion(frank, "SCRAM-SHA-512", "frank-pw", iterations=16384)]
        ) == {frank: None}
        described = admin.describe_user_scram_credentials([frank])
        assert described[frank]["error"] is None
        assert [(int(c["mechanism"]), c["iterations"]) for c in described[frank]["credential_infos"]] == [(SHA512, 16384)]
        answered = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(frank, "SCRAM-SHA-256", "x", iterations=100)])
        assert answered == {frank: "Too few iterations"}
        assert admin.alter_user_scram_credentials([UserScramCredentialDeletion(frank, "SCRAM-SHA-512")]) == {frank: None}
        assert admin.describe_user_scram_credentials([frank])[frank]["error"].startswith("Attempt to describe a user credential")
    finally:
        admin.close()


# --- authorization, in process --------------------------------------------------------------------


def _ctx(store: Broker, api_key: int, authorizer: Authorizer | None, principal: str | None) -> RequestContext:
    return RequestContext(
        broker=store,
        node=Node(0, "127.0.0.1", 9092),
        api_key=api_key,
        api_version=0,
        correlation_id=1,
        client_id=None,
        client_host="127.0.0.1",
        authorizer=authorizer,
        principal=principal,
    )


def test_describe_needs_describe_and_alter_needs_alter_on_the_cluster(store: Broker) -> None:
    reader, writer, stranger = _user("reader"), _user("writer"), _user("stranger")
    for name in (reader, writer, stranger):
        security.create_principal(store.db, name)
    security.add_acls(
        store.db,
        [
            AclBinding(reader, ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL, Operation.DESCRIBE, PermissionType.ALLOW),
            AclBinding(writer, ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL, Operation.ALTER, PermissionType.ALLOW),
        ],
    )
    authorizer = Authorizer(store.db)
    target = _user("target")
    alter = SimpleNamespace(deletions=[], upsertions=[SimpleNamespace(**_upsertion(target, SHA256, "pw"))])
    describe = SimpleNamespace(users=[SimpleNamespace(name=target)])

    def run(handler: Any, api_key: int, who: str, request: Any) -> dict:
        return asyncio.run(handler(_ctx(store, api_key, authorizer, who), request))

    denied = ErrorCode.CLUSTER_AUTHORIZATION_FAILED.kafka_code
    assert run(scram_handlers.handle_alter_user_scram_credentials, ApiKey.AlterUserScramCredentials, reader, alter)[
        "results"
    ] == [{"user": target, "error_code": denied, "error_message": ErrorCode.CLUSTER_AUTHORIZATION_FAILED.value.default_message}]
    assert (
        run(scram_handlers.handle_describe_user_scram_credentials, ApiKey.DescribeUserScramCredentials, stranger, describe)[
            "error_code"
        ]
        == denied
    )
    assert (
        run(scram_handlers.handle_alter_user_scram_credentials, ApiKey.AlterUserScramCredentials, writer, alter)["results"][0][
            "error_code"
        ]
        == 0
    )
    for who in (reader, writer):  # an ALLOW of Alter implies Describe (Kafka's rule)
        described = run(scram_handlers.handle_describe_user_scram_credentials, ApiKey.DescribeUserScramCredentials, who, describe)
        assert described["error_code"] == 0 and described["results"][0]["credential_infos"] == [
            {"mechanism": SHA256, "iterations": 4096}
        ]


# --- the SASL exchanges, in process, with kafka-python's SCRAM client ------------------------------


def _scram_client(user: str, password: str, mechanism: str) -> Any:
    from kafka.net.sasl.scram import ScramClient

    return ScramClient(user, password, mechanism)


def _sign_in(authorizer: Authorizer, user: str, password: str, mechanism: str) -> tuple[str | None, str | None]:
    """(principal, None) after a whole exchange, or (None, the failure's message)."""
    client = _scram_client(user, password, mechanism)
    exchange = sasl.start(mechanism, authorizer)
    try:
        client.process_server_first_message(exchange.respond(client.first_message()))
        final = exchange.respond(client.final_message())
    except Exception as exc:  # noqa: BLE001  (the TxlogError the gateway answers)
        assert getattr(exc, "code", None) is ErrorCode.SASL_AUTHENTICATION_FAILED, exc
        return None, exc.message
    client.process_server_final_message(final)  # raises if the server's signature is wrong
    assert exchange.principal is not None
    return exchange.principal.name, None


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_exchanges_over_stored_credentials(store: Broker, mechanism: str) -> None:
    grace = _user("grace")
    security.create_principal(store.db, grace)
    scram_service.set_password(store.db, grace, mechanism, "grace-pw", 4096)
    authorizer = Authorizer(store.db)
    invalid = scram_domain.INVALID_CREDENTIALS.format(mechanism)

    assert _sign_in(authorizer, grace, "grace-pw", mechanism) == (grace, None)
    assert _sign_in(authorizer, grace, "wrong", mechanism) == (None, invalid)
    other = "SCRAM-SHA-512" if mechanism == "SCRAM-SHA-256" else "SCRAM-SHA-256"
    assert _sign_in(authorizer, grace, "grace-pw", other) == (
        None,
        scram_domain.INVALID_CREDENTIALS.format(other),
    )  # no credential there
    assert _sign_in(authorizer, "nobody-" + grace, "grace-pw", mechanism) == (None, invalid)  # as a wrong password

    # an unknown user is answered a salt and iterations as a known one is, the same each time
    def server_first(user: str) -> bytes:
        return sasl.start(mechanism, authorizer).respond(_scram_client(user, "x", mechanism).first_message())

    unknown = [dict(p.split("=", 1) for p in server_first("nobody-" + grace).decode().split(",")) for _ in range(2)]
    assert unknown[0]["s"] == unknown[1]["s"] and unknown[0]["i"] == "4096" and unknown[0]["r"] != unknown[1]["r"]

    # the credential changes between the two steps: the exchange under the old one fails
    client = _scram_client(grace, "grace-pw", mechanism)
    exchange = sasl.start(mechanism, authorizer)
    client.process_server_first_message(exchange.respond(client.first_message()))
    scram_service.set_password(store.db, grace, mechanism, "grace-pw", 4096)  # a new salt
    authorizer.refresh()
    with pytest.raises(Exception) as info:
        exchange.respond(client.final_message())
    assert getattr(info.value, "code", None) is ErrorCode.SASL_AUTHENTICATION_FAILED
    with pytest.raises(Exception) as info:
        exchange.respond(client.final_message())
    assert getattr(info.value, "code", None) is ErrorCode.ILLEGAL_SASL_STATE

    # revoked: refused
    security.revoke_principal(store.db, grace)
    authorizer.refresh()
    assert _sign_in(authorizer, grace, "grace-pw", mechanism) == (None, invalid)


def test_plain_and_scram_are_one_identity(store: Broker) -> None:
    heidi = _user("heidi")
    token = security.create_principal(store.db, heidi).token
    scram_service.set_password(store.db, heidi, "SCRAM-SHA-256", "heidi-pw")
    authorizer = Authorizer(store.db)
    plain = sasl.start("PLAIN", authorizer)
    plain.respond(f"\x00{heidi}\x00{token}".encode())
    assert plain.principal is not None and plain.principal.name == heidi
    assert _sign_in(authorizer, heidi, "heidi-pw", "SCRAM-SHA-256") == (heidi, None)
    assert sasl.enabled() == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


# --- end to end: signing in with SCRAM on a gateway that authenticates ----------------------------

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


@pytest.fixture(scope="module")
def scram_user(secured: GatewayProcess) -> tuple[str, str]:
    """A user whose SCRAM passwords the admin set over the wire (AlterUserScramCredentials from
    confluent-kafka, signed in with PLAIN): the principal is created by it, then given All on every
    resource."""
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    name, password = _user("wire"), "wire-" + uuid.uuid4().hex
    broker = make_broker(secured.database_url)
    try:  # its ACLs first: any snapshot of the gateway's that has the user has them too
        security.add_acls(broker.db, security.admin_bindings(name))
    finally:
        broker.db.dispose()
    admin = AdminClient(
        {
            "bootstrap.servers": secured.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "admin",
            "sasl.password": ADMIN_TOKEN,
        }
    )
    for mechanism, iterations in ((ScramMechanism.SCRAM_SHA_256, 4096), (ScramMechanism.SCRAM_SHA_512, 8192)):
        # one request each: Kafka refuses a user altered twice in one request (DUPLICATE_RESOURCE)
        futures = admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion(name, ScramCredentialInfo(mechanism, iterations), password.encode())]
        )
        assert futures[name].result(30) is None
    described = admin.describe_user_scram_credentials([name])[name].result(30)
    assert sorted((i.mechanism.value, i.iterations) for i in described.scram_credential_infos) == [(SHA256, 4096), (SHA512, 8192)]
    # every gateway process takes up a change within its poll of security_version
    for mechanism in MECHANISMS:
        wait_until(
            lambda: _signs_in(secured, mechanism, name, password), 10, 0.05, f"the gateway to know {name}'s {mechanism} password"
        )
    return name, password


def _signs_in(secured: GatewayProcess, mechanism: str, name: str, password: str) -> bool:
    """One SCRAM sign-in over raw frames (SaslHandshake v1, SaslAuthenticate v2): did it succeed?"""
    with secured.connect() as conn:
        assert conn.request(ApiKey.SaslHandshake, 1, {"mechanism": mechanism}).error_code == 0
        client = _scram_client(name, password, mechanism)
        first = conn.request(ApiKey.SaslAuthenticate, 2, {"auth_bytes": client.first_message()})
        assert first.error_code == 0, first.error_message
        client.process_server_first_message(first.auth_bytes)
        final = conn.request(ApiKey.SaslAuthenticate, 2, {"auth_bytes": client.final_message()})
        if final.error_code != 0:
            return False
        client.process_server_final_message(final.auth_bytes)
        return True


def _confluent_scram(secured: GatewayProcess, mechanism: str, name: str, password: str) -> dict[str, object]:
    return {
        "bootstrap.servers": secured.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": name,
        "sasl.password": password,
    }


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_confluent_kafka_signs_in_with_scram(secured: GatewayProcess, scram_user: tuple[str, str], mechanism: str) -> None:
    from confluent_kafka import Consumer, Producer

    name, password = scram_user
    topic = _topic(secured)
    producer = Producer({**_confluent_scram(secured, mechanism, name, password), "enable.idempotence": True})
    producer.produce(topic, mechanism.encode())
    assert producer.flush(30) == 0
    consumer = Consumer(
        {**_confluent_scram(secured, mechanism, name, password), "group.id": _user("group"), "auto.offset.reset": "earliest"}
    )
    try:
        consumer.subscribe([topic])
        message = None
        for _ in range(60):
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                break
        assert message is not None and message.error() is None and message.value() == mechanism.encode()
    finally:
        consumer.close()


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (apt-get install kcat)")
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kcat_signs_in_with_scram(secured: GatewayProcess, scram_user: tuple[str, str], mechanism: str) -> None:
    assert KCAT is not None
    name, password = scram_user
    topic = _topic(secured)
    sasl_args = [
        "-X",
        "security.protocol=SASL_PLAINTEXT",
        "-X",
        f"sasl.mechanism={mechanism}",
        "-X",
        f"sasl.username={name}",
        "-X",
        f"sasl.password={password}",
    ]
    done = subprocess.run(
        [KCAT, "-b", secured.bootstrap, *sasl_args, "-P", "-t", topic],
        input=f"{mechanism} from kcat\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    done = subprocess.run(
        [KCAT, "-b", secured.bootstrap, *sasl_args, "-C", "-t", topic, "-o", "beginning", "-e"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.splitlines() == [f"{mechanism} from kcat"], done.stderr
    wrong = [a.replace(f"sasl.password={password}", "sasl.password=wrong") for a in sasl_args]
    refused = subprocess.run([KCAT, "-b", secured.bootstrap, *wrong, "-L", "-m", "5"], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "Authentication failed" in refused.stderr, refused.stderr


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_confluent_kafka_with_a_wrong_scram_password_fails(
    secured: GatewayProcess, scram_user: tuple[str, str], mechanism: str
) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    name, _ = scram_user
    for user in (name, "nobody-" + name):  # a wrong password and an unknown user: the same answer
        errors: list[KafkaError] = []
        admin = AdminClient({**_confluent_scram(secured, mechanism, user, "wrong"), "error_cb": errors.append})

        def refused() -> list[KafkaError]:
            admin.poll(0.2)  # serves error_cb
            return [e for e in errors if e.code() == KafkaError._AUTHENTICATION]

        failures = wait_until(refused, 20, 0, f"{user}'s sign-in to be refused")
        assert all(scram_domain.INVALID_CREDENTIALS.format(mechanism) in e.str() for e in failures), failures
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=0.5)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_signs_in_with_scram(secured: GatewayProcess, scram_user: tuple[str, str], mechanism: str) -> None:
    from kafka.errors import KafkaError

    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    name, password = scram_user
    topic = _topic(secured)
    conf = {
        "bootstrap_servers": secured.bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": name,
        "sasl_plain_password": password,
    }
    producer = KafkaProducer(**conf)
    producer.send(topic, b"kafka-python " + mechanism.encode()).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=30_000, **conf)
    try:
        assert next(iter(consumer)).value == b"kafka-python " + mechanism.encode()
    finally:
        consumer.close()
    with pytest.raises(KafkaError):
        KafkaAdminClient(**{**conf, "sasl_plain_password": "wrong"}, bootstrap_timeout_ms=3000).close()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_aiokafka_signs_in_with_scram(secured: GatewayProcess, scram_user: tuple[str, str], mechanism: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    name, password = scram_user
    topic = _topic(secured)
    conf = {
        "bootstrap_servers": secured.bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": name,
        "sasl_plain_password": password,
    }

    async def run() -> bytes:
        producer = AIOKafkaProducer(**conf)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"aiokafka")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, auto_offset_reset="earliest", **conf)
        await consumer.start()
        try:
            return (await asyncio.wait_for(consumer.getone(), 30)).value
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == b"aiokafka"


def test_a_principal_without_alter_on_the_cluster_may_not_set_passwords(
    secured: GatewayProcess, scram_user: tuple[str, str]
) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    broker = make_broker(secured.database_url)
    try:  # the ACL before the principal: any snapshot with the principal has it
        reader_name = _user("reader")
        security.add_acls(
            broker.db,
            [
                AclBinding(
                    reader_name, ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL, Operation.DESCRIBE, PermissionType.ALLOW
                )
            ],
        )
        reader = security.create_principal(broker.db, reader_name)
    finally:
        broker.db.dispose()
    name, _ = scram_user
    admin = AdminClient(
        {
            "bootstrap.servers": secured.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": reader.principal.name,
            "sasl.password": reader.token,
        }
    )
    futures = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"taken over")]
    )
    with pytest.raises(KafkaException) as info:
        futures[name].result(30)
    assert info.value.args[0].code() == ErrorCode.CLUSTER_AUTHORIZATION_FAILED.kafka_code
    described = admin.describe_user_scram_credentials([name])[name].result(30)  # Describe it may
    assert len(described.scram_credential_infos) == 2


@pytest.mark.parametrize("handshake_version", [0, 1])
def test_raw_scram_sign_in_over_sasl_authenticate_and_bare_tokens(
    secured: GatewayProcess, scram_user: tuple[str, str], handshake_version: int
) -> None:
    """SaslHandshake v1 then two SaslAuthenticate requests; v0 then two bare tokens: the server's
    first and final messages come back, then requests are served. A wrong password is refused
    with Kafka's message and the connection closed."""
    name, password = scram_user

    def token(conn: RawConnection, data: bytes) -> tuple[int, bytes]:
        if handshake_version == 0:
            conn.send_bytes(struct.pack(">i", len(data)) + data)
            frame = conn.read_frame()
            assert frame is not None
            return 0, frame
        answer = conn.request(ApiKey.SaslAuthenticate, 2, {"auth_bytes": data})
        return answer.error_code, answer.auth_bytes

    with secured.connect() as conn:
        assert conn.request(ApiKey.SaslHandshake, handshake_version, {"mechanism": "SCRAM-SHA-512"}).error_code == 0
        client = _scram_client(name, password, "SCRAM-SHA-512")
        code, server_first = token(conn, client.first_message())
        assert code == 0 and server_first.startswith(b"r=")
        client.process_server_first_message(server_first)
        code, server_final = token(conn, client.final_message())
        assert code == 0
        client.process_server_final_message(server_final)  # the server proved it holds the credential
        assert conn.request(ApiKey.Metadata, 1, {"topics": None}).brokers

    if handshake_version == 1:
        with secured.connect() as conn:
            assert conn.request(ApiKey.SaslHandshake, 1, {"mechanism": "SCRAM-SHA-256"}).error_code == 0
            client = _scram_client(name, "wrong", "SCRAM-SHA-256")
            client.process_server_first_message(token(conn, client.first_message())[1])
            answer = conn.request(ApiKey.SaslAuthenticate, 2, {"auth_bytes": client.final_message()})
            assert (answer.error_code, answer.error_message) == (
                ErrorCode.SASL_AUTHENTICATION_FAILED.kafka_code,
                scram_domain.INVALID_CREDENTIALS.format("SCRAM-SHA-256"),
            )
            assert conn.closed_by_peer()
