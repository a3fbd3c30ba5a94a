"""DescribeAcls, CreateAcls and DeleteAcls (v0 to v3): the ACLs of the one model both doors share
(``app.domain.acl_bindings``), kept by ``app.services.security``, in Kafka's words on the wire.

- DescribeAcls needs Describe on the cluster, CreateAcls and DeleteAcls Alter on it (else
  CLUSTER_AUTHORIZATION_FAILED). Without ACLs (TXLOG_AUTH=none) each is answered
  SECURITY_DISABLED, as a Kafka broker without an authorizer answers.
- Principals are Kafka's ``User:name`` (``User:*``: every principal); the cluster is Kafka's
  ``kafka-cluster`` (txlog's own name for it, ``txlog-cluster``, is accepted too). An ACL holds for
  every host: one is created only for the host ``*``, and a filter's host matches only when null
  or ``*``.
- A filter is Kafka's AclBindingFilter: ANY (and null) fields match everything, the MATCH pattern
  type every pattern that covers the name (itself, the literal ``*``, its prefixes). A resource type
  or operation Kafka has and txlog does not (DELEGATION_TOKEN and USER resources, CreateTokens and
  DescribeTokens) matches no ACL in a filter, and an ACL of one is refused INVALID_REQUEST, as Kafka
  refuses an ACL of a type it cannot keep; so is an UNKNOWN code, and ANY or MATCH in an ACL.
- DeleteAcls deletes in one database transaction what each of its filters matches; CreateAcls
  answers each ACL with its own error, storing the valid ones (one that exists already stays).
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

from api.kafka.handlers import RequestContext, access
from app.domain.acl_bindings import (
    ANY_CODE,
    CLUSTER_NAME,
    KAFKA_ONLY_OPERATIONS,
    KAFKA_ONLY_RESOURCE_TYPES,
    MATCH_CODE,
    OPERATION_CODES,
    PATTERN_TYPE_CODES,
    PERMISSION_TYPE_CODES,
    RESOURCE_TYPE_CODES,
    WILDCARD,
    AclBinding,
    AclFilter,
    PatternFilter,
    PatternType,
    ResourceType,
    validate_binding,
)
from app.domain.acls import Api
from app.errors import ErrorCode, TxlogError
from app.services import security

KAFKA_CLUSTER_NAME = "kafka-cluster"  # the cluster resource's name in Kafka's tools and clients
USER = "User:"
_LITERAL = PATTERN_TYPE_CODES[PatternType.LITERAL]  # a v0 request's only pattern type

_RESOURCE_TYPES = {code: rt for rt, code in RESOURCE_TYPE_CODES.items()}
_PATTERN_TYPES = {code: pt for pt, code in PATTERN_TYPE_CODES.items()}
_OPERATIONS = {code: op for op, code in OPERATION_CODES.items()}
_PERMISSIONS = {code: p for p, code in PERMISSION_TYPE_CODES.items()}
_PATTERN_FILTERS = {ANY_CODE: PatternFilter.ANY, MATCH_CODE: PatternFilter.MATCH} | {
    code: PatternFilter(pt.value) for pt, code in PATTERN_TYPE_CODES.items()
}


class _MatchesNothing(Exception):
    """A filter naming what txlog does not keep: it matches no ACL."""


def _invalid(message: str) -> TxlogError:
    return TxlogError(ErrorCode.INVALID_REQUEST, message)


def _refusal(ctx: RequestContext, api: Api) -> TxlogError | None:
    """Kafka's order: the cluster's ACL first (allowed by a broker without an authorizer), then
    SECURITY_DISABLED without one. Answered in each creation's or filter's place (a client reads
    one result for each)."""
    refused = access.refusal(ctx, api)
    if refused is None and ctx.authorizer is None:
        return TxlogError(ErrorCode.SECURITY_DISABLED, "No Authorizer is configured on the broker")
    return refused


# -- Kafka's codes and names to the model, and back --------------------------------------------------


def _resource_type(code: int) -> ResourceType:
    if code in KAFKA_ONLY_RESOURCE_TYPES:
        raise _invalid(
            f"Unsupported resource type {KAFKA_ONLY_RESOURCE_TYPES[code]}: ACLs are kept on topics, groups, transactional ids and the cluster"
        )
    if code not in _RESOURCE_TYPES:
        raise _invalid(f"Invalid resourceType {_code_name(code)}")
    return _RESOURCE_TYPES[code]


def _code_name(code: int) -> str:
    return {0: "UNKNOWN", ANY_CODE: "ANY", MATCH_CODE: "MATCH"}.get(code, str(code))


def _resource_name(resource_type: ResourceType | None, name: str) -> str:
    """Kafka's cluster name as txlog's."""
    return CLUSTER_NAME if resource_type is ResourceType.CLUSTER and name == KAFKA_CLUSTER_NAME else name


def _principal(text: str) -> str:
    if not text.startswith(USER):
        raise _invalid(f"Invalid principal {text!r}: a principal is User:<name>, or User:* for every one")
    return text[len(USER) :]


def binding(creation: Any, version: int) -> AclBinding:
    """A CreateAcls creation as an ACL of the model, or INVALID_REQUEST as Kafka refuses it."""
    rt = _resource_type(creation.resource_type)
    pattern_code = creation.resource_pattern_type if version >= 1 else _LITERAL
    if pattern_code not in _PATTERN_TYPES:
        raise _invalid(f"Invalid patternType {_code_name(pattern_code)}")
    if creation.operation in KAFKA_ONLY_OPERATIONS:
        raise _invalid(f"Unsupported operation {KAFKA_ONLY_OPERATIONS[creation.operation]}: it applies to delegation tokens")
    if creation.operation not in _OPERATIONS:
        raise _invalid(f"Invalid operation {_code_name(creation.operation)}")
    if creation.permission_type not in _PERMISSIONS:
        raise _invalid(f"Invalid permissionType {_code_name(creation.permission_type)}")
    if creation.host != WILDCARD:
        raise _invalid(f"Invalid host {creation.host!r}: an ACL holds for every host, '*'")
    name = creation.resource_name or ""
    if not name:
        raise _invalid("Resource name should not be empty")
    if rt is ResourceType.CLUSTER and name not in (KAFKA_CLUSTER_NAME, CLUSTER_NAME):
        raise _invalid(f"The only valid name for the CLUSTER resource is {KAFKA_CLUSTER_NAME}")
    acl = AclBinding(
        _principal(creation.principal or ""),
        rt,
        _resource_name(rt, name),
        _PATTERN_TYPES[pattern_code],
        _OPERATIONS[creation.operation],
        _PERMISSIONS[creation.permission_type],
    )
    why = validate_binding(acl)
    if why:
        raise _invalid(f"Invalid ACL: {why}")
    return acl


def acl_filter(f: Any, version: int) -> AclFilter:
    """A DescribeAcls or DeleteAcls filter as the model's; INVALID_REQUEST for an UNKNOWN or
    undefined code, ``_MatchesNothing`` for what txlog does not keep."""
    rt_code = f.resource_type_filter
    pattern_code = f.pattern_type_filter if version >= 1 else _LITERAL
    if rt_code in KAFKA_ONLY_RESOURCE_TYPES or f.operation in KAFKA_ONLY_OPERATIONS:
        raise _MatchesNothing
    if rt_code != ANY_CODE and rt_code not in _RESOURCE_TYPES:
        raise _invalid(f"Invalid resourceType filter {_code_name(rt_code)}")
    if pattern_code not in _PATTERN_FILTERS:
        raise _invalid(f"Invalid patternType filter {_code_name(pattern_code)}")
    if f.operation != ANY_CODE and f.operation not in _OPERATIONS:
        raise _invalid(f"Invalid operation filter {_code_name(f.operation)}")
    if f.permission_type != ANY_CODE and f.permission_type not in _PERMISSIONS:
        raise _invalid(f"Invalid permissionType filter {_code_name(f.permission_type)}")
    rt = None if rt_code == ANY_CODE else _RESOURCE_TYPES[rt_code]
    principal = f.principal_filter
    if principal is not None and not principal.startswith(USER):
        raise _MatchesNothing  # another principal type than User: txlog has none
    return AclFilter(
        resource_type=rt,
        resource_name=None if f.resource_name_filter is None else _resource_name(rt, f.resource_name_filter),
        pattern=_PATTERN_FILTERS[pattern_code],
        principal=None if principal is None else principal[len(USER) :],
        operation=None if f.operation == ANY_CODE else _OPERATIONS[f.operation],
        permission=None if f.permission_type == ANY_CODE else _PERMISSIONS[f.permission_type],
        host=f.host_filter,
    )


def _wire_name(acl: AclBinding) -> str:
    return KAFKA_CLUSTER_NAME if acl.resource_type is ResourceType.CLUSTER else acl.resource_name


def _entry(acl: AclBinding) -> dict:
    return {
        "principal": USER + acl.principal,
        "host": WILDCARD,
        "operation": OPERATION_CODES[acl.operation],
        "permission_type": PERMISSION_TYPE_CODES[acl.permission],
    }


def _pattern(acl: AclBinding) -> tuple[int, str, int]:
    return RESOURCE_TYPE_CODES[acl.resource_type], _wire_name(acl), PATTERN_TYPE_CODES[acl.pattern_type]


# -- the handlers ------------------------------------------------------------------------------------


async def handle_describe_acls(ctx: RequestContext, request: Any) -> dict:
    refused = _refusal(ctx, Api.DESCRIBE_ACLS)
    if refused is not None:
        raise refused
    try:
        found = await ctx.call(security.describe_acls, ctx.broker.db, acl_filter(request, ctx.api_version))
    except _MatchesNothing:
        found = []
    resources = []
    for (rt, name, pt), acls in groupby(sorted(found, key=_pattern), key=_pattern):
        resources.append({"resource_type": rt, "resource_name": name, "pattern_type": pt, "acls": [_entry(a) for a in acls]})
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "resources": resources}


async def handle_create_acls(ctx: RequestContext, request: Any) -> dict:
    refused = _refusal(ctx, Api.ALTER_ACLS)
    if refused is not None:
        error = {"error_code": refused.code.kafka_code, "error_message": refused.message}
        return {"throttle_time_ms": 0, "results": [error for _ in request.creations]}
    results: list[dict] = []
    valid: list[AclBinding] = []
    for creation in request.creations:
        try:
            valid.append(binding(creation, ctx.api_version))
        except TxlogError as exc:
            results.append({"error_code": exc.code.kafka_code, "error_message": exc.message})
        else:
            results.append({"error_code": 0, "error_message": None})
    if valid:
        await ctx.call(security.add_acls, ctx.broker.db, valid)
    return {"throttle_time_ms": 0, "results": results}


async def handle_delete_acls(ctx: RequestContext, request: Any) -> dict:
    refused = _refusal(ctx, Api.ALTER_ACLS)
    if refused is not None:
        error = {"error_code": refused.code.kafka_code, "error_message": refused.message, "matching_acls": []}
        return {"throttle_time_ms": 0, "filter_results": [error for _ in request.filters]}
    parsed: list[AclFilter | TxlogError | None] = []
    for f in request.filters:
        try:
            parsed.append(acl_filter(f, ctx.api_version))
        except _MatchesNothing:
            parsed.append(None)
        except TxlogError as exc:
            parsed.append(exc)
    filters = [p for p in parsed if isinstance(p, AclFilter)]
    matched = iter(await ctx.call(security.delete_acls, ctx.broker.db, filters) if filters else ())
    results = []
    for p in parsed:
        if isinstance(p, TxlogError):
            results.append({"error_code": p.code.kafka_code, "error_message": p.message, "matching_acls": []})
            continue
        acls = next(matched) if p is not None else []
        results.append(
            {
                "error_code": 0,
                "error_message": None,
                "matching_acls": [
                    {
                        "error_code": 0,
                        "error_message": None,
                        "resource_type": RESOURCE_TYPE_CODES[a.resource_type],
                        "resource_name": _wire_name(a),
                        "pattern_type": PATTERN_TYPE_CODES[a.pattern_type],
                        **_entry(a),
                    }
                    for a in acls
                ],
            }
        )
    return {"throttle_time_ms": 0, "filter_results": results}
