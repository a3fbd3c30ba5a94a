"""Signing in with the admin token, and out."""

from __future__ import annotations

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from api.admin import csrf
from api.admin.auth import SESSION_COOKIE
from api.admin.render import render

router = APIRouter()


def _safe_next(request: Request, target: str | None) -> str:
    """Only a path inside the admin pages: never another site."""
    root = request.scope.get("root_path", "") or "/"
    if target and target.startswith(root.rstrip("/") + "/") and not target.startswith("//") and "\\" not in target:
        return target
    return root.rstrip("/") + "/"


@router.get("/sign-in", response_class=HTMLResponse, name="signin")
def sign_in_form(request: Request, next: str | None = None) -> Response:
    auth = request.app.state.authorizer
    if not auth.sign_in_required or auth.principal_for(request) is not None:
        return RedirectResponse(_safe_next(request, next), status_code=303)
    return render(request, "signin.html", next=_safe_next(request, next), failed=False)


@router.post("/sign-in", name="signin:submit")
def sign_in(request: Request, token: str = Form(""), next: str = Form(""), csrf_token: str | None = Form(None)) -> Response:
    csrf.check(request, csrf_token)
    auth = request.app.state.authorizer
    principal = auth.authenticate(token)
    if principal is None:
        # The form again, with the error; no session is set.
        return render(request, "signin.html", status_code=401, next=_safe_next(request, next), failed=True)
    response = RedirectResponse(_safe_next(request, next), status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        auth.session_for(principal),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=request.scope.get("root_path") or "/",
    )
    return response


@router.post("/sign-out", name="signout")
def sign_out(request: Request, csrf_token: str | None = Form(None)) -> Response:
    csrf.check(request, csrf_token)
    response = RedirectResponse(request.scope.get("root_path", "") + "/sign-in", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path=request.scope.get("root_path") or "/")
    return response
