"""The templates, and ``render``: a page with what every page needs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fastapi.templating import Jinja2Templates
from starlette.requests import Request
from starlette.responses import HTMLResponse

from api.admin import csrf, svg
from api.admin.auth import CLUSTER, Action, Resource
from api.admin.fmt import clock, control_name, duration, iso, num, rate, show_bytes, state_cls, ts
from app.domain.transactions import OPEN_STATE_NAMES, STATE_NAMES

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"


def url(request: Request, name: str, query: dict[str, Any] | None = None, **params: Any) -> str:
    """The path of a named admin route (path parameters percent-encoded), with an optional query."""
    quoted = {k: quote(str(v), safe="") if k != "path" else str(v) for k, v in params.items()}
    path = request.scope.get("root_path", "") + str(request.app.url_path_for(name, **quoted))
    if query:
        kept = {k: v for k, v in query.items() if v is not None and v != ""}
        if kept:
            path += "?" + urlencode(kept, doseq=True)
    return path


def _static_version() -> str:
    digest = hashlib.sha256()
    for f in sorted(STATIC.iterdir()):
        if f.is_file():
            digest.update(f.read_bytes())
    return digest.hexdigest()[:10]


templates = Jinja2Templates(directory=str(TEMPLATES))
templates.env.trim_blocks = True
templates.env.lstrip_blocks = True
templates.env.filters.update(
    ts=ts,
    clock=clock,
    iso=iso,
    duration=duration,
    num=num,
    rate=rate,
    state_cls=state_cls,
    show_bytes=show_bytes,
    control_name=control_name,
)
templates.env.globals.update(STATE_ORDER=STATE_NAMES, OPEN_STATES=OPEN_STATE_NAMES, svg=svg, static_version=_static_version())


def render(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """Render a page with what every page needs: who is looking, what they may do, the anti-forgery
    token for forms and a ``url`` helper for named routes."""
    authorizer = request.app.state.authorizer
    principal = getattr(request.state, "principal", None)
    context.update(
        request=request,
        principal=principal,
        sign_in_required=authorizer.sign_in_required,
        can_abort=lambda tid: authorizer.can(principal, Action.ABORT_TRANSACTION, Resource("transactional_id", tid)),
        can_act=authorizer.can(principal, Action.ABORT_TRANSACTION, CLUSTER),
        csrf_token=csrf.token_for(request),
        url=lambda name, query=None, **params: url(request, name, query, **params),
        now_ms=context.get("now_ms") or request.app.state.broker.now(),
    )
    response = templates.TemplateResponse(request, template, context, status_code=status_code)
    csrf.set_cookie_if_new(request, response)
    return response
