"""Consumer groups: committed offsets, pending transactional offsets, lag against the LSO."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from api.admin.deps import broker, viewer
from api.admin.render import render
from app.services import Broker
from app.services.inspect import groups as inspect

router = APIRouter(dependencies=[Depends(viewer)])


@router.get("/groups", response_class=HTMLResponse, name="groups")
def groups_page(request: Request, b: Broker = Depends(broker)) -> HTMLResponse:
    return render(request, "groups.html", nav="groups", groups=inspect.groups(b))


@router.get("/groups/{group_id:path}", response_class=HTMLResponse, name="group")
def group_page(request: Request, group_id: str, b: Broker = Depends(broker)) -> HTMLResponse:
    return render(request, "group.html", nav="groups", group=inspect.group_detail(b, group_id))
