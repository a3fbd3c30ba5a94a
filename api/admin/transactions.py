"""Transactions: the filterable list, one transaction's life, and the operator's abort (a
confirmation page, then a POST carrying the anti-forgery token)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from api.admin import csrf, svg
from api.admin.auth import Action, Principal, Resource
from api.admin.deps import broker, parse_duration_ms, require, viewer
from api.admin.render import render, url
from app.domain.transactions import OPEN_STATE_NAMES
from app.services import Broker, transaction_aborts
from app.services.inspect import transactions as inspect

router = APIRouter(dependencies=[Depends(viewer)])

AGES = ("", "10s", "1m", "5m", "15m", "1h", "1d")
PAGE = 100


@router.get("/transactions", response_class=HTMLResponse, name="txn:list")
def transaction_list(
    request: Request,
    state: str = "",
    older_than: str = "",
    prefix: str = "",
    after: str | None = None,
    b: Broker = Depends(broker),
) -> HTMLResponse:
    states = list(OPEN_STATE_NAMES) if state == "open" else ([state] if state else None)
    page = inspect.transactions_page(b, states, parse_duration_ms(older_than), prefix or None, after, PAGE)
    return render(
        request,
        "transactions.html",
        nav="transactions",
        page=page,
        state=state,
        older_than=older_than,
        prefix=prefix,
        after=after,
        ages=AGES,
        hanging={a.transactional_id for a in inspect.hanging_transactions(b)},
    )


@router.get("/transactions/id/{tid:path}", response_class=HTMLResponse, name="txn:detail")
def transaction_page(request: Request, tid: str, b: Broker = Depends(broker)) -> HTMLResponse:
    detail = inspect.transaction_detail(b, tid)
    return render(
        request,
        "transaction.html",
        nav="transactions",
        now_ms=detail.now_ms,
        d=detail,
        timeline=svg.timeline(detail.events, detail.now_ms, detail.deadline_ms),
        aborted=request.query_params.get("aborted") == "1",
    )


@router.get("/transactions/abort/{tid:path}", response_class=HTMLResponse, name="txn:abort-confirm")
def abort_confirm(
    request: Request, tid: str, principal: Principal = Depends(viewer), b: Broker = Depends(broker)
) -> HTMLResponse:
    require(request, principal, Action.ABORT_TRANSACTION, Resource("transactional_id", tid))
    detail = inspect.transaction_detail(b, tid)
    return render(request, "abort_confirm.html", nav="transactions", now_ms=detail.now_ms, d=detail)


@router.post("/transactions/abort/{tid:path}", name="txn:abort")
def abort(
    request: Request,
    tid: str,
    csrf_token: str | None = Form(None),
    principal: Principal = Depends(viewer),
    b: Broker = Depends(broker),
) -> RedirectResponse:
    csrf.check(request, csrf_token)
    require(request, principal, Action.ABORT_TRANSACTION, Resource("transactional_id", tid))
    transaction_aborts.abort_by_operator(b, tid)
    return RedirectResponse(url(request, "txn:detail", {"aborted": "1"}, tid=tid), status_code=303)
