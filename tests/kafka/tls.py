"""Test certificates, made at test time with the ``openssl`` command: a CA, a server certificate
for 127.0.0.1 and localhost, and client certificates signed by that CA (or by another one).

Each certificate carries the extensions strict verifiers ask for (basic constraints and key usage
on the CA, subject and authority key identifiers), so Python's ``ssl``, librdkafka and kcat all
take them as they would a real deployment's."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

OPENSSL = shutil.which("openssl")
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _run(*args: str, cwd: Path) -> None:
    assert OPENSSL is not None, "the openssl command is needed to make test certificates"
    done = subprocess.run([OPENSSL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"openssl {' '.join(args)}: {done.stderr}"


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Authority:
    """A CA that signs certificates in ``folder``."""

    folder: Path
    name: str

    @property
    def cert(self) -> Path:
        return self.folder / f"{self.name}.pem"

    @property
    def key(self) -> Path:
        return self.folder / f"{self.name}.key"

    @classmethod
    def make(cls, folder: Path, name: str) -> "Authority":
        folder.mkdir(parents=True, exist_ok=True)
        ca = cls(folder, name)
        _run(
            "req",
            "-x509",
            *_KEY,
            "-keyout",
            ca.key.name,
            "-out",
            ca.cert.name,
            "-days",
            "2",
            "-subj",
            f"/CN=txlog test {name}",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-addext",
            "subjectKeyIdentifier=hash",
            cwd=folder,
        )
        return ca

    def issue(self, name: str, subject: str, *, server: bool = False) -> Pair:
        """A certificate for ``subject`` (``/CN=alice/O=acme``), a server's for 127.0.0.1 and
        localhost when ``server``, else a client's."""
        extensions = self.folder / f"{name}.ext"
        usage = "serverAuth" if server else "clientAuth"
        lines = [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={usage}",
            "subjectKeyIdentifier=hash",
            "authorityKeyIdentifier=keyid:always",
        ]
        if server:
            lines.append("subjectAltName=DNS:localhost,IP:127.0.0.1")
        extensions.write_text("\n".join(lines) + "\n")
        _run("req", *_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=self.folder)
        _run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            self.cert.name,
            "-CAkey",
            self.key.name,
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            extensions.name,
            cwd=self.folder,
        )
        return Pair(self.folder / f"{name}.pem", self.folder / f"{name}.key")
