"""Kafka consumer groups: their coordinators, states, protocols and members with the partitions
assigned to each, as the live gateways describe them over Kafka's protocol, beside the committed
offsets and the lag against the LSO."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from api.admin.deps import broker, viewer
from api.admin.render import render
from app.services import Broker, kafka_groups

router = APIRouter(dependencies=[Depends(viewer)])


@router.get("/kafka-groups", response_class=HTMLResponse, name="kafka:groups")
def kafka_groups_page(request: Request, b: Broker = Depends(broker)) -> HTMLResponse:
    return render(request, "kafka_groups.html", nav="kafka", view=kafka_groups.describe_kafka_groups(b))


@router.get("/kafka-groups/{group_id:path}", response_class=HTMLResponse, name="kafka:group")
def kafka_group_page(request: Request, group_id: str, b: Broker = Depends(broker)) -> HTMLResponse:
    view = kafka_groups.describe_kafka_groups(b, group_id)
    return render(request, "kafka_group.html", nav="kafka", group_id=group_id, view=view)
