"""Half messages and the outbox: pending half messages with their check-back history, one half
message's life, and the outbox's backlog per partition with its age."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse

from api.admin.deps import broker, viewer
from api.admin.render import render
from app.services import Broker, half_messages, outbox

router = APIRouter(dependencies=[Depends(viewer)])

STATES = ("Prepared", "Committed", "RolledBack")


@router.get("/half-messages", response_class=HTMLResponse, name="half:list")
def half_message_list(
    request: Request,
    state: str = "Prepared",
    group: str = "",
    after: str | None = Query(None, max_length=128),
    b: Broker = Depends(broker),
) -> HTMLResponse:
    page = half_messages.half_messages_page(b, state or None, group or None, after, 100)
    return render(request, "half_messages.html", nav="half", page=page, state=state, group=group, states=STATES)


@router.get("/half-messages/id/{transaction_id:path}", response_class=HTMLResponse, name="half:detail")
def half_message_page(request: Request, transaction_id: str, b: Broker = Depends(broker)) -> HTMLResponse:
    return render(request, "half_message.html", nav="half", d=half_messages.describe(b, transaction_id))


@router.get("/outbox", response_class=HTMLResponse, name="outbox")
def outbox_page(request: Request, b: Broker = Depends(broker)) -> HTMLResponse:
    rows = outbox.backlog(b)
    return render(
        request,
        "outbox.html",
        nav="outbox",
        backlog=rows,
        total=sum(r.rows for r in rows),
        oldest_ms=max((r.age_ms for r in rows), default=None),
        poll_ms=b.settings.outbox_poll_interval_ms,
    )
