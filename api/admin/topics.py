"""A topic's partitions, and the record browser of one partition."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse

from api.admin.deps import broker, viewer
from api.admin.render import render
from app.domain import topic_configs
from app.services import Broker, topics
from app.services.inspect import topics as inspect

router = APIRouter(dependencies=[Depends(viewer)])

PAGE_SIZES = (25, 50, 100, 250)


@router.get("/topics/{topic}", response_class=HTMLResponse, name="topic")
def topic_page(request: Request, topic: str, b: Broker = Depends(broker)) -> HTMLResponse:
    detail = inspect.topic_detail(b, topic)
    configs = topics.describe_topic_config(b, topic)
    return render(
        request,
        "topic.html",
        nav="overview",
        now_ms=detail.now_ms,
        detail=detail,
        configs=configs,
        applied={c.name for c in topic_configs.TOPIC_CONFIGS if c.applied},
    )


@router.get("/topics/{topic}/{partition:int}", response_class=HTMLResponse, name="partition")
def partition_page(
    request: Request,
    topic: str,
    partition: int,
    mode: Literal["read_uncommitted", "read_committed", "all"] = "all",
    offset: int | None = Query(None, ge=0, le=2**63 - 1),
    before: int | None = Query(None, ge=0, le=2**63 - 1),
    limit: int = Query(50, ge=1, le=1000),
    b: Broker = Depends(broker),
) -> HTMLResponse:
    page = inspect.browse_partition(b, topic, partition, mode, offset, before, limit)
    return render(
        request,
        "partition.html",
        nav="overview",
        topic=topic,
        partition=partition,
        page=page,
        limit=limit,
        page_sizes=PAGE_SIZES,
        modes=inspect.BROWSE_MODES,
    )
