"""SCRAM (RFC 5802) with SHA-256 (RFC 7677) and SHA-512, as Kafka speaks it: credentials derived
from a password, the server's side of an exchange, and the rules of Kafka's credential admin APIs.

A credential is what the server keeps of a password: a salt, an iteration count, StoredKey =
H(ClientKey) and ServerKey, where SaltedPassword = PBKDF2-HMAC(password, salt, iterations),
ClientKey = HMAC(SaltedPassword, "Client Key"), ServerKey = HMAC(SaltedPassword, "Server Key").
StoredKey checks the client's proof; ServerKey signs the server's final message, so that the client
knows the server held the credential. Neither lets anyone sign in without the password.

As Kafka's ``ScramSaslServer`` (and unlike RFC 5802, which asks for SASLprep), a password is its
UTF-8 bytes, not normalized: clients derive it that way.

The exchange (``ScramServer``) is two steps over plain bytes:

1. client-first ``n,[a=authzid],n=<saslname>,r=<client nonce>[,ext=value...]``: no channel binding
   (the gs2 flag ``n``; ``y`` and ``p`` refused, the gateway offers no ``-PLUS`` mechanism), an
   authzid only if it names the same user, no mandatory extension (``m=``), and not Kafka's
   ``tokenauth=true`` (txlog has no delegation tokens). The server answers server-first
   ``r=<client nonce><server nonce>,s=<base64 salt>,i=<iterations>``.
2. client-final ``c=<base64 gs2 header>,r=<nonce>[,ext...],p=<base64 proof>``: the channel binding
   must repeat the gs2 header (``biws`` for ``n,,``), the nonce be the server's, and the proof
   XORed with HMAC(StoredKey, AuthMessage) hash to StoredKey (compared in constant time). The
   server answers ``v=<base64 ServerSignature>``.

A failure is SASL_AUTHENTICATION_FAILED with a message, as Kafka answers SaslAuthenticate (no
``e=`` server-final: Kafka's clients read the error code). A wrong proof and a user without
credentials fail alike; the caller hands an unknown user a ``fake_credential`` so that the
exchange runs the same steps either way.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from app.errors import ErrorCode, TxlogError

# Kafka's bounds on a credential's iteration count (``ScramMechanism.minIterations`` for both
# mechanisms, ``ScramControlManager.MAX_ITERATIONS``); 4096 is kafka-configs' default.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 4096
# The salt txlog generates (a client's upsertion brings its own).
SALT_BYTES = 32

# Kafka's answer when a SCRAM exchange fails on its credentials (SaslServerAuthenticator).
INVALID_CREDENTIALS = "Authentication failed during authentication due to invalid credentials with SASL mechanism {}"


@dataclass(frozen=True)
class Mechanism:
    name: str  # as SaslHandshake names it
    hash_name: str  # hashlib's
    kafka_type: int  # as the admin APIs number it (Kafka's ScramMechanism.type)

    def h(self, data: bytes) -> bytes:
        return hashlib.new(self.hash_name, data).digest()

    def hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self.hash_name).digest()

    @property
    def digest_size(self) -> int:
        return hashlib.new(self.hash_name).digest_size


SCRAM_SHA_256 = Mechanism("SCRAM-SHA-256", "sha256", 1)
SCRAM_SHA_512 = Mechanism("SCRAM-SHA-512", "sha512", 2)
MECHANISMS: dict[str, Mechanism] = {m.name: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}
BY_TYPE: dict[int, Mechanism] = {m.kafka_type: m for m in MECHANISMS.values()}


def mechanism(name: str) -> Mechanism:
    """The mechanism named ``SCRAM-SHA-256`` or ``SCRAM-SHA-512``, else UNSUPPORTED_SASL_MECHANISM."""
    found = MECHANISMS.get(name.upper())
    if found is None:
        raise TxlogError(
            ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"Unknown SCRAM mechanism {name!r}: one of {', '.join(MECHANISMS)}"
        )
    return found


@dataclass(frozen=True)
class ScramCredential:
    """What the server keeps of one password for one mechanism."""

    mechanism: str
    salt: bytes = field(repr=False)
    iterations: int
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)


def salted_password(mech: Mechanism, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i) of RFC 5802: PBKDF2 with HMAC of the mechanism's hash."""
    return hashlib.pbkdf2_hmac(mech.hash_name, password.encode("utf-8"), salt, iterations)


def credential_from_salted_password(mech: Mechanism, salt: bytes, salted: bytes, iterations: int) -> ScramCredential:
    """The credential of a SaltedPassword (what AlterUserScramCredentials brings: the client salts
    and iterates, the password never travels)."""
    client_key = mech.hmac(salted, b"Client Key")
    return ScramCredential(mech.name, salt, iterations, mech.h(client_key), mech.hmac(salted, b"Server Key"))


def credential_from_password(mech: Mechanism, password: str, salt: bytes, iterations: int) -> ScramCredential:
    return credential_from_salted_password(mech, salt, salted_password(mech, password, salt, iterations), iterations)


def fake_credential(mech: Mechanism, secret: bytes, username: str) -> ScramCredential:
    """A credential for a user who has none: the same for the same user as long as ``secret`` is
    (so repeated attempts see the same salt), matching no password anyone knows."""

    def part(label: str, size: int) -> bytes:
        return mech.hmac(secret, f"{label}\x00{mech.name}\x00{username}".encode("utf-8", "surrogatepass"))[:size]

    size = mech.digest_size
    return ScramCredential(mech.name, part("salt", SALT_BYTES), DEFAULT_ITERATIONS, part("stored", size), part("server", size))


# --- the admin APIs' rules ------------------------------------------------------------------------


def iterations_error(iterations: int) -> str | None:
    """Why Kafka refuses this iteration count (UNACCEPTABLE_CREDENTIAL), or None."""
    if iterations < MIN_ITERATIONS:
        return "Too few iterations"
    if iterations > MAX_ITERATIONS:
        return "Too many iterations"
    return None


@dataclass(frozen=True)
class Deletion:
    user: str
    mechanism_type: int


@dataclass(frozen=True)
class Upsertion:
    user: str
    mechanism_type: int
    iterations: int
    salt: bytes = field(repr=False)
    salted_password: bytes = field(repr=False)


@dataclass(frozen=True)
class Refusal:
    code: ErrorCode
    message: str


DUPLICATE_ALTERATION = "A user credential cannot be altered twice in the same request"


def alteration_refusals(deletions: Sequence[Deletion], upsertions: Sequence[Upsertion]) -> dict[str, Refusal]:
    """Kafka's checks of an AlterUserScramCredentials request that need no stored state, per user
    (``ScramControlManager.alterCredentials``): a user named twice, in any two alterations, is
    DUPLICATE_RESOURCE for all of them; an empty name or too few or many iterations
    UNACCEPTABLE_CREDENTIAL; an unknown mechanism UNSUPPORTED_SASL_MECHANISM."""
    refused: dict[str, Refusal] = {}
    seen: set[str] = set()
    alterations: list[Deletion | Upsertion] = [*deletions, *upsertions]
    for alteration in alterations:
        user = alteration.user
        if user in seen:
            refused[user] = Refusal(ErrorCode.DUPLICATE_RESOURCE, DUPLICATE_ALTERATION)
            continue
        seen.add(user)
        if not user:
            refused[user] = Refusal(ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
        elif alteration.mechanism_type not in BY_TYPE:
            refused[user] = Refusal(ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
        elif isinstance(alteration, Upsertion) and (why := iterations_error(alteration.iterations)):
            refused[user] = Refusal(ErrorCode.UNACCEPTABLE_CREDENTIAL, why)
    return refused


def users_named(deletions: Sequence[Deletion], upsertions: Sequence[Upsertion]) -> list[str]:
    """Each user an AlterUserScramCredentials request names, once, in the order first named."""
    return list(dict.fromkeys([*(d.user for d in deletions), *(u.user for u in upsertions)]))


DESCRIBE_DUPLICATE = "Cannot describe SCRAM credentials for the same user twice in a single request: "
DESCRIBE_NOT_FOUND = "Attempt to describe a user credential that does not exist: "


def duplicates(users: Iterable[str]) -> set[str]:
    seen: set[str] = set()
    twice: set[str] = set()
    for u in users:
        (twice if u in seen else seen).add(u)
    return twice


# --- the exchange ---------------------------------------------------------------------------------


def _failed(message: str) -> TxlogError:
    return TxlogError(ErrorCode.SASL_AUTHENTICATION_FAILED, f"Authentication failed: {message}")


_SASLNAME = re.compile(r"^(?:[^=,]|=2C|=3D)+$")
_PRINTABLE = re.compile(r"^[\x21-\x2b\x2d-\x7e]+$")  # printable ASCII but ','
_EXTENSION = re.compile(r"^([A-Za-z]+)=([^,]*)$")


def username(saslname: str) -> str:
    """A saslname unescaped (``=2C`` is ``,``, ``=3D`` is ``=``; any other ``=`` is malformed)."""
    if not _SASLNAME.match(saslname):
        raise _failed(f"invalid username {saslname!r}")
    return re.sub("=2C|=3D", lambda m: "," if m.group(0) == "=2C" else "=", saslname)


def saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise _failed(f"{what} is not base64") from None


def _text(message: bytes, which: str) -> str:
    try:
        return message.decode("utf-8")
    except UnicodeDecodeError:
        raise _failed(f"the SCRAM {which} message is not UTF-8") from None


@dataclass(frozen=True)
class ClientFirst:
    username: str
    nonce: str
    gs2_header: str  # "n,," or "n,a=<saslname>,"
    bare: str  # client-first-message-bare, as received
    extensions: dict[str, str]


def parse_client_first(message: bytes) -> ClientFirst:
    text = _text(message, "client first")
    parts = text.split(",", 2)
    if len(parts) != 3:
        raise _failed("invalid SCRAM client first message format")
    flag, authzid_attr, bare = parts
    if flag in ("y", "p") or flag.startswith("p="):
        raise _failed("channel binding is not supported")
    if flag != "n":
        raise _failed("invalid SCRAM client first message format")
    authzid: str | None = None
    if authzid_attr:
        if not authzid_attr.startswith("a="):
            raise _failed("invalid SCRAM client first message format")
        authzid = username(authzid_attr[2:])
    attributes = bare.split(",")
    if attributes[0].startswith("m="):
        raise _failed("mandatory SCRAM extensions are not supported")
    if len(attributes) < 2 or not attributes[0].startswith("n=") or not attributes[1].startswith("r="):
        raise _failed("invalid SCRAM client first message format")
    name = username(attributes[0][2:])
    nonce = attributes[1][2:]
    if not _PRINTABLE.match(nonce):
        raise _failed("invalid SCRAM client first message format: the nonce")
    extensions: dict[str, str] = {}
    for attr in attributes[2:]:
        m = _EXTENSION.match(attr)
        if m is None:
            raise _failed("invalid SCRAM client first message format: an extension")
        extensions[m.group(1)] = m.group(2)
    if extensions.get("tokenauth", "").lower() == "true":
        raise _failed("delegation tokens are not supported")
    if authzid is not None and authzid != name:
        raise TxlogError(
            ErrorCode.SASL_AUTHENTICATION_FAILED,
            "Authentication failed: Client requested an authorization id that is different from username",
        )
    return ClientFirst(name, nonce, f"{flag},{authzid_attr},", bare, extensions)


class ScramServer:
    """The server's side of one exchange: ``client_first`` (the client's first message, parsed),
    then ``server_first`` with the user's credential (or a fake one), then ``client_final``, which
    verifies the proof and answers the server-final message. Any step out of order, or after a
    failure, is ILLEGAL_SASL_STATE."""

    def __init__(self, mech: Mechanism, server_nonce: str) -> None:
        if not _PRINTABLE.match(server_nonce):
            raise ValueError("a server nonce is printable ASCII without ','")
        self.mechanism = mech
        self.server_nonce = server_nonce
        self.first: ClientFirst | None = None
        self.credential: ScramCredential | None = None
        self.server_first_message = ""
        self.state = "client-first"

    def _expect(self, state: str) -> None:
        if self.state != state:
            raise TxlogError(ErrorCode.ILLEGAL_SASL_STATE, f"Unexpected SCRAM message in state {self.state}")

    def client_first(self, message: bytes) -> ClientFirst:
        self._expect("client-first")
        self.state = "failed"
        self.first = parse_client_first(message)
        self.state = "credential"
        return self.first

    def server_first(self, credential: ScramCredential) -> bytes:
        self._expect("credential")
        assert self.first is not None
        if credential.mechanism != self.mechanism.name:
            raise ValueError(f"a {credential.mechanism} credential for a {self.mechanism.name} exchange")
        self.credential = credential
        salt = base64.b64encode(credential.salt).decode("ascii")
        self.server_first_message = f"r={self.first.nonce}{self.server_nonce},s={salt},i={credential.iterations}"
        self.state = "client-final"
        return self.server_first_message.encode("ascii")

    def client_final(self, message: bytes) -> bytes:
        """The server-final message if the proof is right, else SASL_AUTHENTICATION_FAILED."""
        self._expect("client-final")
        self.state = "failed"
        assert self.first is not None and self.credential is not None
        mech, credential = self.mechanism, self.credential
        text = _text(message, "client final")
        without_proof, sep, proof_text = text.rpartition(",p=")
        attributes = without_proof.split(",")
        if not sep or len(attributes) < 2 or not attributes[0].startswith("c=") or not attributes[1].startswith("r="):
            raise _failed("invalid SCRAM client final message format")
        if any(_EXTENSION.match(a) is None for a in attributes[2:]):
            raise _failed("invalid SCRAM client final message format: an extension")
        binding = _b64decode(attributes[0][2:], "the channel binding")
        if not hmac.compare_digest(binding, self.first.gs2_header.encode("utf-8")):
            raise _failed("the channel binding does not match the client first message")
        nonce = f"{self.first.nonce}{self.server_nonce}"
        sent = attributes[1][2:].encode("utf-8")
        # librdkafka before 2.6.1 (Debian's kcat and librdkafka 2.0.2 among them) sends the client
        # nonce twice, before the whole nonce (librdkafka#4895); Kafka 3.8.1 to 3.9 accept it. That
        # one shape is accepted too: the server's nonce is still the end of it, and the proof covers
        # the message as sent.
        if not (hmac.compare_digest(sent, nonce.encode()) or hmac.compare_digest(sent, (self.first.nonce + nonce).encode())):
            raise _failed("Invalid client nonce in the final client message.")
        proof = _b64decode(proof_text, "the client proof")
        if len(proof) != mech.digest_size:
            raise _failed("invalid SCRAM client final message format: the proof's length")
        auth_message = f"{self.first.bare},{self.server_first_message},{without_proof}".encode()
        client_signature = mech.hmac(credential.stored_key, auth_message)
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature))
        if not hmac.compare_digest(mech.h(client_key), credential.stored_key):
            raise TxlogError(ErrorCode.SASL_AUTHENTICATION_FAILED, INVALID_CREDENTIALS.format(mech.name))
        self.state = "complete"
        signature = mech.hmac(credential.server_key, auth_message)
        return b"v=" + base64.b64encode(signature)

    @property
    def complete(self) -> bool:
        return self.state == "complete"
