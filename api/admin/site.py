"""The admin sub-application: its own FastAPI app (no OpenAPI), HTML errors, security headers,
static files, and one router per entity."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.admin import groups, half_messages, kafka_groups, overview, producers, session, share_groups, topics, transactions
from api.admin.auth import Authorizer
from api.admin.deps import SignInRequired
from api.admin.render import STATIC, render
from app.errors import ErrorCode, TxlogError
from app.services import Broker

SECURITY_HEADERS = [
    # No script at all, styles and images only from here; the pages are usable without JavaScript.
    (
        b"content-security-policy",
        b"default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
        b"frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in SECURITY_HEADERS if k not in names]
                if b"cache-control" not in names:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class CachedStatic(StaticFiles):
    """Static files are versioned by a query string (see ``static_version``): cache them."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        if response.status_code == 200:
            response.headers["cache-control"] = "public, max-age=86400"
        return response


def _error_page(request: Request, err: TxlogError) -> HTMLResponse:
    return render(request, "error.html", status_code=err.code.http_status, error=err, status=err.code.http_status, heading=None)


def create_admin(broker: Broker, authorizer: Authorizer) -> FastAPI:
    admin = FastAPI(title="txlog admin", openapi_url=None, docs_url=None, redoc_url=None)
    admin.state.broker = broker
    admin.state.authorizer = authorizer

    @admin.exception_handler(TxlogError)
    async def _txlog_error(request: Request, exc: TxlogError) -> HTMLResponse:
        return _error_page(request, exc)

    @admin.exception_handler(SignInRequired)
    async def _sign_in(request: Request, exc: SignInRequired) -> Response:
        if request.method in ("GET", "HEAD"):
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            signin = request.scope.get("root_path", "") + "/sign-in?next=" + quote(target, safe="")
            return RedirectResponse(signin, status_code=303)
        return _error_page(request, TxlogError(ErrorCode.SASL_AUTHENTICATION_FAILED, "Sign in first"))

    @admin.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> HTMLResponse:
        parts = []
        for e in exc.errors()[:3]:
            loc = ".".join(str(x) for x in e.get("loc", ()) if x not in ("query", "path", "body"))
            parts.append(f"{loc}: {e.get('msg')}" if loc else str(e.get("msg")))
        return _error_page(request, TxlogError(ErrorCode.INVALID_REQUEST, "; ".join(parts) or "Invalid request"))

    @admin.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> HTMLResponse:
        missing = exc.status_code == 404
        err = TxlogError(
            ErrorCode.INVALID_REQUEST, f"There is no admin page at {request.url.path}." if missing else str(exc.detail)
        )
        return render(
            request,
            "error.html",
            status_code=exc.status_code,
            error=err,
            status=exc.status_code,
            heading="No such page" if missing else None,
        )

    admin.mount("/static", CachedStatic(directory=str(STATIC)), name="static")
    for module in (overview, topics, transactions, producers, groups, kafka_groups, share_groups, half_messages, session):
        admin.include_router(module.router)
    admin.add_middleware(SecurityHeaders)
    return admin
