"""Share groups (KIP-932's queues on the log): each group's share partitions with their start and
end offsets and records by state, and the records in flight with their lock holders (member ids),
the time left on each lock and delivery counts — as ``app.services.share_admin`` describes them."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from api.admin.deps import broker, viewer
from api.admin.render import render
from app.domain.share_configs import DEFAULTS
from app.services import Broker, share_admin

router = APIRouter(dependencies=[Depends(viewer)])

# The groups the list page describes, at most (each is one read of its share partitions).
LISTED = 200


@dataclass(frozen=True)
class GroupSummary:
    group_id: str
    partitions: int
    counts: dict[str, int]  # records in flight per state name
    holders: tuple[str, ...]  # members holding locks
    max_delivery_count: int


def _summary(d: share_admin.ShareGroupDescription) -> GroupSummary:
    counts = {"AVAILABLE": 0, "ACQUIRED": 0, "ACKNOWLEDGED": 0, "ARCHIVED": 0}
    holders: set[str] = set()
    top = 0
    for p in d.partitions:
        for name, n in p.counts.items():
            counts[name] = counts.get(name, 0) + n
        for r in p.in_flight:
            if r.member_id is not None:
                holders.add(r.member_id)
            top = max(top, r.delivery_count)
    return GroupSummary(d.group_id, len(d.partitions), counts, tuple(sorted(holders)), top)


@router.get("/share-groups", response_class=HTMLResponse, name="share:groups")
def share_groups_page(request: Request, b: Broker = Depends(broker)) -> HTMLResponse:
    names = share_admin.list_share_groups(b)
    groups = [_summary(share_admin.describe(b, g)) for g in names[:LISTED]]
    return render(request, "share_groups.html", nav="share", groups=groups, total=len(names), listed=LISTED)


@router.get("/share-groups/{group_id:path}", response_class=HTMLResponse, name="share:group")
def share_group_page(request: Request, group_id: str, b: Broker = Depends(broker)) -> HTMLResponse:
    d = share_admin.describe(b, group_id)
    return render(
        request,
        "share_group.html",
        nav="share",
        group_id=group_id,
        group=d,
        summary=_summary(d),
        configs=sorted({**DEFAULTS, **d.configs}.items()),
        set_configs=set(d.configs),
        now_ms=b.now(),
    )
