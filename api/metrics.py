"""Prometheus metrics. With several workers, ``txlog serve`` sets PROMETHEUS_MULTIPROC_DIR so that
/metrics adds up every worker's counters."""

from __future__ import annotations

import os
import time

from fastapi import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest, multiprocess
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUESTS = Counter("txlog_http_requests_total", "HTTP requests", ["method", "route", "status"])
LATENCY = Histogram(
    "txlog_http_request_duration_seconds",
    "HTTP request latency",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RECORDS_APPENDED = Counter("txlog_records_appended_total", "Records appended to partition logs", ["topic"])
DUPLICATES = Counter("txlog_duplicate_batches_total", "Idempotent batches answered as duplicates", ["topic"])
TXN_ENDED = Counter("txlog_transactions_ended_total", "Transactions ended by EndTxn", ["result"])


def metrics_response() -> Response:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        data = generate_latest(registry)
    else:
        data = generate_latest()
    return Response(data, media_type=CONTENT_TYPE_LATEST)


class RequestMetrics:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            REQUESTS.labels(scope["method"], path, str(status)).inc()
            LATENCY.labels(scope["method"], path).observe(time.perf_counter() - start)
