"""A TCP proxy that loses answers: it forwards each request to the server, and drops a share of
the answers the server sends back by closing the connection instead. The server has acted on
every request whose answer is lost, so the client cannot know whether it did."""

from __future__ import annotations

import contextlib
import random
import socket
import threading


class _Connection:
    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.awaiting_answer = False

    def close(self) -> None:
        for s in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


class LossyProxy:
    def __init__(self, upstream_port: int, drop_answer: float, seed: int = 0) -> None:
        self.upstream_port = upstream_port
        self.drop_answer = drop_answer
        self.dropped_answers = 0
        self.answers = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._connections: list[_Connection] = []
        self._closed = False

    def __enter__(self) -> "LossyProxy":
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for c in self._connections:
                c.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:  # the server is down (killed, restarting): refuse this one, keep serving
                client.close()
                continue
            conn = _Connection(client, upstream)
            with self._lock:
                self._connections.append(conn)
            threading.Thread(target=self._requests, args=(conn,), daemon=True).start()
            threading.Thread(target=self._answers, args=(conn,), daemon=True).start()

    def _requests(self, conn: _Connection) -> None:
        try:
            while data := conn.client.recv(65536):
                conn.awaiting_answer = True
                conn.upstream.sendall(data)
        except OSError:
            pass
        finally:
            conn.close()

    def _answers(self, conn: _Connection) -> None:
        try:
            while data := conn.upstream.recv(65536):
                if conn.awaiting_answer:  # the first bytes of an answer: the server has acted
                    conn.awaiting_answer = False
                    with self._lock:
                        self.answers += 1
                        drop = self._rng.random() < self.drop_answer
                        self.dropped_answers += drop
                    if drop:
                        return
                conn.client.sendall(data)
        except OSError:
            pass
        finally:
            conn.close()
