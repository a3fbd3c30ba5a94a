"""RocketMQ 5's gRPC protocol, ``apache.rocketmq.v2``: messages (``definition``, ``service``) and
the MessagingService's server binding (``service_grpc``).

They are the generated modules that the official Python client, ``rocketmq-python-client``,
ships in ``rocketmq.grpc_protocol`` (pinned in pyproject.toml): the protocol as RocketMQ's own
clients speak it, not a copy of its ``.proto`` files. This is the only module that imports them.

Importing ``rocketmq.grpc_protocol`` the ordinary way runs the client package's ``__init__``
first, which starts the whole client: OpenTelemetry's SDK, a directory made under ``~/logs`` and
``logging.config.dictConfig``, which closes every logging handler the process has. A server wants
none of that, so the three generated modules are loaded from the installed distribution under
their own names (``rocketmq.grpc_protocol.definition_pb2`` …), with the two parent packages
stood in for by bare placeholders while they load and removed afterwards. A process that imports
the real client later (a test, say) gets the same module objects, and protobuf's descriptor pool
holds each file once. A process that imported the client first is served its modules as they are.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import types
from pathlib import Path
from typing import Any

DISTRIBUTION = "rocketmq-python-client"
PACKAGE = "rocketmq.grpc_protocol"


class ProtocolUnavailable(ImportError):
    """The distribution that carries the generated protocol is not installed."""


def _load(name: str) -> Any:
    qualified = f"{PACKAGE}.{name}"
    loaded = sys.modules.get(qualified)
    if loaded is not None:
        return loaded
    try:
        root = Path(str(importlib.metadata.distribution(DISTRIBUTION).locate_file("rocketmq")))
    except importlib.metadata.PackageNotFoundError as exc:
        raise ProtocolUnavailable(f"the RocketMQ gateway needs {DISTRIBUTION} (pip install txlog's dependencies)") from exc
    placeholders: dict[str, types.ModuleType] = {}
    for package, path in (("rocketmq", root), (PACKAGE, root / "grpc_protocol")):
        if package not in sys.modules:
            module = types.ModuleType(package)
            module.__path__ = [str(path)]
            sys.modules[package] = placeholders[package] = module
    try:
        return importlib.import_module(qualified)
    finally:
        for package, module in placeholders.items():
            if sys.modules.get(package) is module:
                del sys.modules[package]


# The order matters: each imports the one before it by its full name.
definition: Any = _load("definition_pb2")
service: Any = _load("service_pb2")
service_grpc: Any = _load("service_pb2_grpc")

Code = definition.Code
MessageType = definition.MessageType
ClientType = definition.ClientType
Permission = definition.Permission
AddressScheme = definition.AddressScheme
Encoding = definition.Encoding
SERVICE_NAME = "apache.rocketmq.v2.MessagingService"
