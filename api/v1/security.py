"""Principals and ACLs over HTTP (Kafka's DescribeAcls, CreateAcls, DeleteAcls; principals created,
listed and revoked): Describe on the cluster to read, Alter on the cluster to change. Routes parse
and shape; ``app.services.security`` decides."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import Field

from api.auth import requires
from api.v1.responses import errors
from api.v1.schemas import Model
from app.domain.acl_bindings import (
    RESOURCE_NAME_MAX,
    AclBinding,
    Operation,
    PatternType,
    PermissionType,
    ResourceType,
    StoredPrincipal,
    principal_name,
)
from app.domain.acls import Api
from app.services import Broker, security

router = APIRouter(prefix="/v1", tags=["security"])

ResourceTypeName = Literal["topic", "group", "transactional_id", "cluster"]
OperationName = Literal[
    "All",
    "Read",
    "Write",
    "Create",
    "Delete",
    "Alter",
    "Describe",
    "IdempotentWrite",
    "DescribeConfigs",
    "AlterConfigs",
    "ClusterAction",
]


def broker(request: Request) -> Broker:
    return request.app.state.broker


class PrincipalOut(Model):
    name: str
    created_at_ms: int
    revoked_at_ms: int | None


class PrincipalList(Model):
    principals: list[PrincipalOut]


class PrincipalCreate(Model):
    name: str = Field(max_length=128, json_schema_extra={"pattern": r"^[A-Za-z0-9._@-]{1,128}$"})


class PrincipalCreated(PrincipalOut):
    token: str = Field(description="The principal's API token, shown this once: only its hash is kept")


class Acl(Model):
    principal: str = Field(max_length=133, description="A principal's name (``User:`` prefix allowed) or ``*``: every principal")
    resource_type: ResourceTypeName
    resource_name: str = Field(
        max_length=RESOURCE_NAME_MAX, description="``txlog-cluster`` for the cluster; ``*`` (literal): every resource"
    )
    pattern_type: Literal["literal", "prefixed"] = "literal"
    operation: OperationName
    permission_type: Literal["allow", "deny"] = "allow"

    def binding(self) -> AclBinding:
        return AclBinding(
            principal_name(self.principal),
            ResourceType(self.resource_type),
            self.resource_name,
            PatternType(self.pattern_type),
            Operation(self.operation),
            PermissionType(self.permission_type),
        )


class AclList(Model):
    acls: list[Acl]


def principal_json(p: StoredPrincipal) -> dict:
    return {"name": p.name, "created_at_ms": p.created_at_ms, "revoked_at_ms": p.revoked_at_ms}


@router.get("/principals", dependencies=[Depends(requires(Api.DESCRIBE_ACLS))], response_model=PrincipalList, responses=errors())
def list_principals(b: Broker = Depends(broker)) -> dict:
    """Every principal, revoked ones included (never a token)."""
    return {"principals": [principal_json(p) for p in security.list_principals(b.db)]}


@router.post(
    "/principals",
    status_code=201,
    dependencies=[Depends(requires(Api.ALTER_ACLS))],
    response_model=PrincipalCreated,
    responses=errors(400, 413),
)
async def create_principal(body: PrincipalCreate, b: Broker = Depends(broker)) -> dict:
    """A principal with a new random token, answered this once. A revoked principal's name may be
    taken again; an active one's is INVALID_REQUEST."""
    created = await run_in_threadpool(security.create_principal, b.db, body.name)
    return {**principal_json(created.principal), "token": created.token}


@router.delete(
    "/principals/{name}", dependencies=[Depends(requires(Api.ALTER_ACLS))], response_model=PrincipalOut, responses=errors(400)
)
def revoke_principal(name: str, b: Broker = Depends(broker)) -> dict:
    """Revoke the principal's token: refused on every server process within a second. Its ACLs stay."""
    return principal_json(security.revoke_principal(b.db, name))


@router.get("/acls", dependencies=[Depends(requires(Api.DESCRIBE_ACLS))], response_model=AclList, responses=errors(400))
def describe_acls(principal: str | None = Query(None, max_length=133), b: Broker = Depends(broker)) -> dict:
    """Every ACL, or one principal's (Kafka's DescribeAcls)."""
    name = principal_name(principal) if principal is not None else None
    return {"acls": [a.to_dict() for a in security.list_acls(b.db, name)]}


@router.post("/acls", dependencies=[Depends(requires(Api.ALTER_ACLS))], response_model=AclList, responses=errors(400, 413))
def create_acls(body: AclList, b: Broker = Depends(broker)) -> dict:
    """Kafka's CreateAcls: answers the ACLs that were new."""
    return {"acls": [a.to_dict() for a in security.add_acls(b.db, [a.binding() for a in body.acls])]}


@router.delete("/acls", dependencies=[Depends(requires(Api.ALTER_ACLS))], response_model=AclList, responses=errors(400))
def delete_acls(
    principal: str = Query(max_length=133),
    resource_type: ResourceTypeName = Query(),
    resource_name: str = Query(max_length=RESOURCE_NAME_MAX),
    operation: OperationName = Query(),
    pattern_type: Literal["literal", "prefixed"] = "literal",
    permission_type: Literal["allow", "deny"] = "allow",
    b: Broker = Depends(broker),
) -> dict:
    """Kafka's DeleteAcls of one exact ACL: answers it if it existed (else an empty list)."""
    acl = Acl(
        principal=principal,
        resource_type=resource_type,
        resource_name=resource_name,
        pattern_type=pattern_type,
        operation=operation,
        permission_type=permission_type,
    )
    return {"acls": [a.to_dict() for a in security.remove_acls(b.db, [acl.binding()])]}
