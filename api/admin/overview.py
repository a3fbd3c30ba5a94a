"""The overview: topics and partitions, records/s, transactions by state, and what looks stuck."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from api.admin.deps import broker, viewer
from api.admin.render import render
from app.services import Broker
from app.services.inspect import overview as inspect

router = APIRouter(dependencies=[Depends(viewer)])

PARTITIONS_SHOWN = 12  # per topic on the overview; the topic page shows them all


@router.get("/", response_class=HTMLResponse, name="overview")
def overview_page(request: Request, b: Broker = Depends(broker)) -> HTMLResponse:
    data = inspect.overview(b)
    return render(
        request,
        "overview.html",
        nav="overview",
        now_ms=data.now_ms,
        data=data,
        partitions_shown=PARTITIONS_SHOWN,
        refresh=request.query_params.get("refresh") == "1",
    )
