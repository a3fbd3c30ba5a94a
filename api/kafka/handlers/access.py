"""The gateway's side of the ACLs: a handler asks these with the ``Api`` whose rules its request
reads (``app.domain.acls.REQUIRED``, ``KAFKA_APIS``), and answers Kafka's error where Kafka puts it:
for the whole request (``check``, ``refusal``) or in each refused item's place (``refused``).

Without an authorizer (TXLOG_AUTH=none) every function answers at once, as if everything were
allowed: no principal, no check, no cost. With one, each decision comes from the authorizer's
cache (``Authorizer.allowed``): no database round trip. A connection that authenticated no one is
Kafka's ``User:ANONYMOUS``, which only ACLs of ``*`` allow anything.
"""

from __future__ import annotations

from typing import Iterable

from api.kafka.handlers import RequestContext
from app.domain.acl_bindings import ANONYMOUS, CLUSTER_NAME, Operation, ResourceType, authorized_operations
from app.domain.acls import Api, item_denied, request_denied, shown
from app.errors import TxlogError
from app.services.security import denied_error

# Kafka's "not provided" for authorized operations: the codec writes INT32_MIN for None.
NOT_PROVIDED = None


def principal(ctx: RequestContext) -> str:
    return ctx.principal or ANONYMOUS


def refusal(ctx: RequestContext, api: Api, **names: str | None) -> TxlogError | None:
    """The error refusing the whole request (the rules of ``api`` that read only ``names`` and the
    cluster), or None."""
    if ctx.authorizer is None:
        return None
    who = principal(ctx)
    refused = request_denied(ctx.authorizer.decisions(who), api, names)
    return None if refused is None else denied_error(who, api, refused)


def check(ctx: RequestContext, api: Api, **names: str | None) -> None:
    """Raise ``refusal``'s error: the request is answered with it, in every place it has for one."""
    error = refusal(ctx, api, **names)
    if error is not None:
        raise error


def refused(ctx: RequestContext, api: Api, key: str, names: Iterable[str]) -> dict[str, TxlogError]:
    """The items among ``names`` (topics, or groups or transactional ids) that ``api``'s rules
    reading ``key`` refuse, each with its error; empty when all are allowed."""
    if ctx.authorizer is None:
        return {}
    who = principal(ctx)
    decide = ctx.authorizer.decisions(who)
    out: dict[str, TxlogError] = {}
    for name in set(names):
        denial = item_denied(decide, api, key, name)
        if denial is not None:
            out[name] = denied_error(who, api, denial)
    return out


def shows(ctx: RequestContext, api: Api, name: str) -> bool:
    """May the item ``name`` be in ``api``'s answer (``app.domain.acls.FILTERED``)?"""
    return ctx.authorizer is None or shown(ctx.authorizer.decisions(principal(ctx)), api, name)


def allows(ctx: RequestContext, operation: Operation, resource_type: ResourceType, name: str = CLUSTER_NAME) -> bool:
    return ctx.authorizer is None or ctx.authorizer.allowed(principal(ctx), operation, resource_type, name)


def operations(ctx: RequestContext, resource_type: ResourceType, name: str = CLUSTER_NAME) -> int | None:
    """The authorized operations of a resource an answer names, as Kafka's bit set; not provided
    without an authorizer."""
    if ctx.authorizer is None:
        return NOT_PROVIDED
    return authorized_operations(ctx.authorizer.decisions(principal(ctx)), resource_type, name)


def cluster_operations(ctx: RequestContext) -> int | None:
    """The cluster's authorized operations, as Metadata and DescribeCluster answer them: 0 without
    Describe on the cluster."""
    if ctx.authorizer is None:
        return NOT_PROVIDED
    if not allows(ctx, Operation.DESCRIBE, ResourceType.CLUSTER):
        return 0
    return operations(ctx, ResourceType.CLUSTER)
