"""A real HTTP check-back endpoint for tests, answering what the test tells it to (an answer,
garbage, an error status, or nothing for a while), and recording every check-back it receives."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import orjson


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the server's checker may ask about many half messages at once


# What to do with one check-back: (HTTP status, body, seconds to wait before answering).
Behaviour = Callable[[dict], tuple[int, bytes, float]]


def answer(state: str) -> Behaviour:
    return lambda payload: (200, orjson.dumps({"state": state}), 0.0)


class Endpoint:
    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.calls: list[dict] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                payload = orjson.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                with owner._lock:
                    owner.calls.append(payload)
                status, body, delay = owner.behaviour(payload)
                if delay:
                    time.sleep(delay)
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the checker gave up waiting
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self._server = _Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/check"

    def calls_for(self, transaction_id: str) -> list[dict]:
        with self._lock:
            return [c for c in self.calls if c["transaction_id"] == transaction_id]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "Endpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
