"""``txlog serve``: no unauthenticated server off loopback unless --insecure, and HTTPS with
--tls-cert/--tls-key, checked against a self-signed certificate made here."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.cli.listeners import is_loopback_host
from tests.support import ROOT, free_port, wait_until


def serve(*args: str, env: dict[str, str] | None = None) -> list[str]:
    return [sys.executable, "-m", "app.cli", "serve", *args]


def test_loopback_hosts() -> None:
    assert is_loopback_host("127.0.0.1") and is_loopback_host("::1") and is_loopback_host("localhost")
    assert is_loopback_host("127.3.2.1") and is_loopback_host("[::1]")
    assert not is_loopback_host("0.0.0.0") and not is_loopback_host("::") and not is_loopback_host("192.168.1.9")


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_serve_refuses_an_open_server_off_loopback(host: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TXLOG_AUTH"}
    run = subprocess.run(serve("--host", host, "--port", "1"), cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "without authentication" in run.stderr and "--insecure" in run.stderr and "TXLOG_AUTH=token" in run.stderr


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made with the openssl command."""
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key_path),
            "-out",
            str(cert_path),
            "-days",
            "1",
            "-subj",
            "/CN=txlog test",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert_path, key_path


needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command makes the certificate")


@needs_openssl
def test_tls_with_a_self_signed_certificate(db_url: str, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    port = free_port()
    env = {**os.environ, "TXLOG_DATABASE_URL": db_url, "TXLOG_AUTH": "token", "TXLOG_ADMIN_TOKEN": "tls-admin"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.Popen(
        serve("--port", str(port), "--tls-cert", str(cert), "--tls-key", str(key), "--log-level", "warning"),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    trusted = ssl.create_default_context(cafile=str(cert))
    url = f"https://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, f"server exited with {proc.returncode}"
            try:
                return httpx.get(url + "/readyz", verify=trusted, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, 60, 0.1, "the HTTPS server")
        with httpx.Client(base_url=url, verify=trusted, headers={"Authorization": "Bearer tls-admin"}) as c:
            assert c.post("/v1/topics", json={"name": "over-tls"}).status_code == 201
            assert c.get("/v1/topics").json()["topics"] == [{"name": "over-tls", "partitions": 1}]
        with pytest.raises(httpx.ConnectError):  # the certificate is not one the system trusts
            httpx.get(url + "/healthz", timeout=5)
        with pytest.raises(httpx.HTTPError):  # no plain HTTP on the port
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


@needs_openssl
def test_tls_flags_go_together(tmp_path: Path) -> None:
    cert, _ = _self_signed(tmp_path)
    run = subprocess.run(serve("--tls-cert", str(cert)), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--tls-key" in run.stderr
