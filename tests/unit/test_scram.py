"""SCRAM's server side (app.domain.scram): RFC 7677's SCRAM-SHA-256 example byte for byte, RFC
5802's message structure (gs2 header, saslname escaping, extensions, channel binding, nonces), the
credentials Kafka stores, its admin APIs' rules, and kafka-python's SCRAM client driving the
server for both mechanisms."""

from __future__ import annotations

import base64
import hashlib
import hmac
import warnings

import pytest

from app.domain import scram
from app.domain.scram import Deletion, ScramServer, Upsertion
from app.errors import ErrorCode, TxlogError

# RFC 7677 section 3: user "user", password "pencil".
RFC7677_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC7677_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC7677_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC7677_SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC7677_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC7677_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def rfc7677_credential() -> scram.ScramCredential:
    return scram.credential_from_password(scram.SCRAM_SHA_256, "pencil", RFC7677_SALT, 4096)


def failure(excinfo: pytest.ExceptionInfo[TxlogError]) -> tuple[ErrorCode, str]:
    return excinfo.value.code, excinfo.value.message


def test_rfc7677_example_byte_for_byte() -> None:
    server = ScramServer(scram.SCRAM_SHA_256, RFC7677_SERVER_NONCE)
    first = server.client_first(RFC7677_CLIENT_FIRST)
    assert (first.username, first.nonce, first.gs2_header) == ("user", "rOprNGfwEbeRWgbNEkqO", "n,,")
    assert server.server_first(rfc7677_credential()) == RFC7677_SERVER_FIRST
    assert server.client_final(RFC7677_CLIENT_FINAL) == RFC7677_SERVER_FINAL
    assert server.complete


def test_credentials_are_kafkas_derivation() -> None:
    """StoredKey = H(HMAC(SaltedPassword, "Client Key")), ServerKey = HMAC(SaltedPassword, "Server
    Key"), SaltedPassword = PBKDF2; from a SaltedPassword (AlterUserScramCredentials) the same."""
    for mech, name in ((scram.SCRAM_SHA_256, "sha256"), (scram.SCRAM_SHA_512, "sha512")):
        salted = hashlib.pbkdf2_hmac(name, "pässword".encode(), b"salt", 4096)
        cred = scram.credential_from_password(mech, "pässword", b"salt", 4096)
        assert cred.stored_key == hashlib.new(name, hmac.new(salted, b"Client Key", name).digest()).digest()
        assert cred.server_key == hmac.new(salted, b"Server Key", name).digest()
        assert scram.credential_from_salted_password(mech, b"salt", salted, 4096) == cred
        assert "stored_key" not in repr(cred) and "salt=" not in repr(cred)


def test_wrong_proof_fails_with_kafkas_message() -> None:
    server = ScramServer(scram.SCRAM_SHA_256, RFC7677_SERVER_NONCE)
    server.client_first(RFC7677_CLIENT_FIRST)
    server.server_first(scram.credential_from_password(scram.SCRAM_SHA_256, "pencils", RFC7677_SALT, 4096))
    with pytest.raises(TxlogError) as e:
        server.client_final(RFC7677_CLIENT_FINAL)
    assert failure(e) == (
        ErrorCode.SASL_AUTHENTICATION_FAILED,
        "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256",
    )
    with pytest.raises(TxlogError) as e:
        server.client_final(RFC7677_CLIENT_FINAL)
    assert e.value.code is ErrorCode.ILLEGAL_SASL_STATE


@pytest.mark.parametrize(
    ("message", "why"),
    [
        (b"y,,n=user,r=abc", "channel binding is not supported"),
        (b"p=tls-unique,,n=user,r=abc", "channel binding is not supported"),
        (b"n,,m=ext,n=user,r=abc", "mandatory SCRAM extensions are not supported"),
        (b"n,,n=user,r=abc,tokenauth=true", "delegation tokens are not supported"),
        (b"n,a=other,n=user,r=abc", "Client requested an authorization id that is different from username"),
        (b"n,,n=us=er,r=abc", "invalid username"),
        (b"n,,n=user", "invalid SCRAM client first message format"),
        (b"n,,r=abc,n=user", "invalid SCRAM client first message format"),
        (b"n,,n=user,r=a\x7fb", "the nonce"),
        (b"n,,n=user,r=abc,1x=2", "an extension"),
        (b"\xff,,n=user,r=abc", "not UTF-8"),
        (b"n,x=y,n=user,r=abc", "invalid SCRAM client first message format"),
    ],
)
def test_client_first_refusals(message: bytes, why: str) -> None:
    with pytest.raises(TxlogError) as e:
        scram.parse_client_first(message)
    code, text = failure(e)
    assert code is ErrorCode.SASL_AUTHENTICATION_FAILED
    assert why in text


def test_saslname_escaping_and_authzid() -> None:
    first = scram.parse_client_first(b"n,a=a=2Cb=3Dc,n=a=2Cb=3Dc,r=xyz,ext=1")
    assert first.username == "a,b=c"
    assert first.gs2_header == "n,a=a=2Cb=3Dc,"
    assert first.bare == "n=a=2Cb=3Dc,r=xyz,ext=1"
    assert first.extensions == {"ext": "1"}
    assert scram.saslname("a,b=c") == "a=2Cb=3Dc"
    assert scram.username(scram.saslname("=,==2C")) == "=,==2C"
    assert scram.parse_client_first(b"n,,n=user,r=abc,tokenauth=false").username == "user"


def _client_final(server: ScramServer, gs2: bytes, nonce: str, password: str, extra: str = "") -> bytes:
    """A client-final message computed as a client does (for the structure tests)."""
    assert server.first is not None
    mech = server.mechanism
    without_proof = f"c={base64.b64encode(gs2).decode()},r={nonce}{extra}"
    auth = f"{server.first.bare},{server.server_first_message},{without_proof}".encode()
    salted = scram.salted_password(mech, password, RFC7677_SALT, 4096)
    client_key = mech.hmac(salted, b"Client Key")
    signature = mech.hmac(mech.h(client_key), auth)
    proof = bytes(a ^ b for a, b in zip(client_key, signature))
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def test_authzid_binds_the_channel_binding_and_extensions_are_signed() -> None:
    server = ScramServer(scram.SCRAM_SHA_256, "srv")
    server.client_first(b"n,a=user,n=user,r=cli")
    server.server_first(rfc7677_credential())
    answer = server.client_final(_client_final(server, b"n,a=user,", "clisrv", "pencil", ",ext=1"))
    assert answer.startswith(b"v=")


def test_the_client_nonce_twice_as_librdkafka_before_2_6_1_sends_it() -> None:
    server = ScramServer(scram.SCRAM_SHA_256, "srv")
    server.client_first(b"n,,n=user,r=cli")
    server.server_first(rfc7677_credential())
    assert server.client_final(_client_final(server, b"n,,", "cliclisrv", "pencil")).startswith(b"v=")


@pytest.mark.parametrize(
    ("gs2", "nonce", "why"),
    [
        (b"n,,", "clisrvX", "Invalid client nonce"),
        (b"n,,", "cli", "Invalid client nonce"),
        (b"n,,", "clicli", "Invalid client nonce"),
        (b"n,,", "Xclisrv", "Invalid client nonce"),
        (b"n,,", "clisrvclisrv", "Invalid client nonce"),
        (b"y,,", "clisrv", "channel binding does not match"),
        (b"n,a=user,", "clisrv", "channel binding does not match"),
    ],
)
def test_client_final_refusals(gs2: bytes, nonce: str, why: str) -> None:
    server = ScramServer(scram.SCRAM_SHA_256, "srv")
    server.client_first(b"n,,n=user,r=cli")
    server.server_first(rfc7677_credential())
    with pytest.raises(TxlogError) as e:
        server.client_final(_client_final(server, gs2, nonce, "pencil"))
    assert e.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED and why in e.value.message


@pytest.mark.parametrize(
    "message",
    [
        b"c=biws,r=clisrv",
        b"r=clisrv,c=biws,p=AAAA",
        b"c=b!ws,r=clisrv,p=AAAA",
        b"c=biws,r=clisrv,p=AAAA",
        b"c=biws,r=clisrv,p=%%%",
    ],
)
def test_malformed_client_final(message: bytes) -> None:
    server = ScramServer(scram.SCRAM_SHA_256, "srv")
    server.client_first(b"n,,n=user,r=cli")
    server.server_first(rfc7677_credential())
    with pytest.raises(TxlogError) as e:
        server.client_final(message)
    assert e.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED


def test_steps_out_of_order_are_illegal_state() -> None:
    server = ScramServer(scram.SCRAM_SHA_512, "srv")
    with pytest.raises(TxlogError) as e:
        server.client_final(b"c=biws,r=x,p=AAAA")
    assert e.value.code is ErrorCode.ILLEGAL_SASL_STATE
    server = ScramServer(scram.SCRAM_SHA_512, "srv")
    server.client_first(b"n,,n=user,r=cli")
    with pytest.raises(ValueError):
        server.server_first(rfc7677_credential())  # a SHA-256 credential for a SHA-512 exchange


def test_fake_credentials_are_stable_per_user_and_secret() -> None:
    a = scram.fake_credential(scram.SCRAM_SHA_512, b"k1", "nobody")
    assert a == scram.fake_credential(scram.SCRAM_SHA_512, b"k1", "nobody")
    assert a != scram.fake_credential(scram.SCRAM_SHA_512, b"k2", "nobody")
    assert a.salt != scram.fake_credential(scram.SCRAM_SHA_512, b"k1", "somebody").salt
    assert len(a.stored_key) == len(a.server_key) == 64 and len(a.salt) == scram.SALT_BYTES
    assert a.iterations == scram.DEFAULT_ITERATIONS and a.mechanism == "SCRAM-SHA-512"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("user", ["alice", "a,b=c", "ünï"])
def test_kafka_python_scram_client_signs_in(mechanism: str, user: str) -> None:
    ScramClient = kafka_python_scram_client()
    mech = scram.mechanism(mechanism)
    client = ScramClient(user, "s3cret", mechanism)
    client.user = scram.saslname(user).encode()  # kafka-python sends the name unescaped
    server = ScramServer(mech, "server-nonce")
    first = server.client_first(client.first_message())
    assert first.username == user
    client.process_server_first_message(server.server_first(scram.credential_from_password(mech, "s3cret", b"NaCl", 8192)))
    client.process_server_final_message(server.client_final(client.final_message()))  # raises on a wrong signature
    assert server.complete

    wrong = ScramClient(user, "s3cret!", mechanism)
    wrong.user = scram.saslname(user).encode()
    server = ScramServer(mech, "server-nonce")
    server.client_first(wrong.first_message())
    wrong.process_server_first_message(server.server_first(scram.credential_from_password(mech, "s3cret", b"NaCl", 8192)))
    with pytest.raises(TxlogError) as e:
        server.client_final(wrong.final_message())
    assert e.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED


def kafka_python_scram_client() -> type:
    with warnings.catch_warnings():  # kafka-python's codec reads its schemas with a deprecated call
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.net.sasl.scram import ScramClient

    return ScramClient


def test_alteration_refusals_are_kafkas() -> None:
    ok = Upsertion("ok", 1, 4096, b"s", b"p")
    refused = scram.alteration_refusals(
        [Deletion("twice", 1), Deletion("bad-mech", 0), Deletion("", 1)],
        [
            ok,
            Upsertion("twice", 2, 4096, b"s", b"p"),
            Upsertion("few", 1, 4095, b"s", b"p"),
            Upsertion("many", 2, 16385, b"s", b"p"),
            Upsertion("edge", 2, 16384, b"s", b"p"),
            Upsertion("mech", 3, 4096, b"s", b"p"),
        ],
    )
    assert {u: (r.code, r.message) for u, r in refused.items()} == {
        "twice": (ErrorCode.DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request"),
        "bad-mech": (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"),
        "": (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"),
        "few": (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations"),
        "many": (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations"),
        "mech": (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"),
    }
    assert scram.duplicates(["a", "b", "a", "c", "a"]) == {"a"}
    with pytest.raises(TxlogError) as e:
        scram.mechanism("SCRAM-SHA-1")
    assert e.value.code is ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert scram.mechanism("scram-sha-512") is scram.SCRAM_SHA_512
