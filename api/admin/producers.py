"""Producer state per partition: id, epoch, last sequence and offset, expiry, open transaction."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse

from api.admin.deps import broker, viewer
from api.admin.render import render
from app.services import Broker
from app.services.inspect import producers as inspect

router = APIRouter(dependencies=[Depends(viewer)])


@router.get("/producers", response_class=HTMLResponse, name="producers")
def producers_page(
    request: Request,
    topic: str | None = None,
    producer_id: str | None = None,
    open_only: bool = False,
    after_topic: str | None = None,
    after_partition: int | None = Query(None, ge=0),
    after_pid: int | None = Query(None, ge=0),
    b: Broker = Depends(broker),
) -> HTMLResponse:
    pid = int(producer_id) if producer_id and producer_id.strip().isdigit() else None
    after = (
        (after_topic, after_partition, after_pid)
        if after_topic is not None and after_partition is not None and after_pid is not None
        else None
    )
    page = inspect.producers_page(b, after, 100, topic or None, open_only, pid)
    return render(
        request,
        "producers.html",
        nav="producers",
        page=page,
        topic=topic or "",
        producer_id=producer_id or "",
        open_only=open_only,
        expiration_ms=b.settings.producer_id_expiration_ms,
        bad_pid=bool(producer_id and producer_id.strip() and pid is None),
    )
