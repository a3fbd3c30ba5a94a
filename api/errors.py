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


def response_for(request: Request, exc: Exception) -> JSONResponse:
    """The answer to a request whose handling raised ``exc``: every route's, whether FastAPI's
    exception handlers call this or the hot routes (``api.v1.hot``) do."""
    if isinstance(exc, TxlogError):
        return error_response(exc)
    if isinstance(exc, RequestValidationError):
        return JSONResponse(
            {"error": TxlogError(ErrorCode.INVALID_REQUEST, _describe_validation(exc)).to_dict()}, status_code=422
        )
    if isinstance(exc, StarletteHTTPException):
        code = ErrorCode.INVALID_REQUEST
        return JSONResponse(
            {"error": {"code": code.name, "kafka_code": code.kafka_code, "message": str(exc.detail), "retriable": False}},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(TxlogError(ErrorCode.UNKNOWN_SERVER_ERROR, f"Unexpected server error: {type(exc).__name__}"))


def install(app: FastAPI) -> None:
    async def handler(request: Request, exc: Exception) -> JSONResponse:
        return response_for(request, exc)

    for kind in (TxlogError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(kind, handler)
