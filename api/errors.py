"""The one place errors become HTTP answers: ``{"error": {"code", "message", "retriable", ...}}``."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.errors import ErrorCode, TxlogError

log = logging.getLogger("txlog.api")

RETRY_AFTER_SECONDS = "1"


def error_response(err: TxlogError) -> JSONResponse:
    headers = {"Retry-After": RETRY_AFTER_SECONDS} if err.code.http_status in (429, 503) else None
    return JSONResponse({"error": err.to_dict()}, status_code=err.code.http_status, headers=headers)


def _describe_validation(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors()[:5]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        parts.append(f"{loc}: {e.get('msg')}" if loc else str(e.get("msg")))
    return "; ".join(parts) or "invalid request"


def install(app: FastAPI) -> None:
    @app.exception_handler(TxlogError)
    async def _txlog_error(request: Request, exc: TxlogError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(
            {"error": TxlogError(ErrorCode.INVALID_REQUEST, _describe_validation(exc)).to_dict()}, status_code=422
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = ErrorCode.INVALID_REQUEST
        return JSONResponse(
            {"error": {"code": code.name, "kafka_code": code.kafka_code, "message": str(exc.detail), "retriable": False}},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(TxlogError(ErrorCode.UNKNOWN_SERVER_ERROR, f"Unexpected server error: {type(exc).__name__}"))
