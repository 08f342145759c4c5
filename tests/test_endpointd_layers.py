"""endpointd's layering, read from its source: which modules may import what."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "endpointd" / "endpointd"
# The generated stubs and protobuf's own types: only the wire module converts them.
PROTOBUF = ("superagent_proto", "google.protobuf")
WIRE = "endpointd/wire.py"
# Message methods of protobuf: called elsewhere, they would mean a message got past the wire.
PROTOBUF_METHODS = {
    "ByteSize",
    "ClearField",
    "CopyFrom",
    "FromDatetime",
    "FromNanoseconds",
    "FromString",
    "HasField",
    "MergeFrom",
    "ParseFromString",
    "SerializeToString",
    "ToDatetime",
    "ToJsonString",
    "ToNanoseconds",
    "WhichOneof",
}


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    """Every module an import statement names, anywhere (functions included): for
    ``from a.b import c``, both ``a.b`` and ``a.b.c`` (c may be a module)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _protobuf(name: str) -> bool:
    return any(name == root or name.startswith(root + ".") for root in PROTOBUF)


def protobuf_importers(package: Path) -> dict[str, list[int]]:
    """``{module path: [line, …]}`` for every module under ``package`` with an import of
    the protocol stubs or of protobuf."""
    offenders: dict[str, list[int]] = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        lines = sorted({line for line, name in _imports(tree) if _protobuf(name)})
        if lines:
            offenders[path.relative_to(package.parent).as_posix()] = lines
    return offenders


def test_only_the_wire_module_imports_protobuf() -> None:
    offenders = protobuf_importers(PACKAGE)
    wire = offenders.pop(WIRE, None)
    assert offenders == {}, (
        "only endpointd/wire.py may touch protobuf; convert to endpointd.model there instead"
    )
    assert wire, "the wire module imports no protobuf: is the walk broken?"


def test_only_the_wire_module_calls_protobuf_methods() -> None:
    offenders: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE.parent).as_posix()
        if where == WIRE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        calls = [
            f"{node.lineno}: {node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in PROTOBUF_METHODS
        ]
        if calls:
            offenders[where] = calls
    assert offenders == {}


def test_the_walk_finds_every_form_of_import() -> None:
    source = """
import superagent_proto.v1.endpoint_pb2 as pb
from superagent_proto.v1 import endpoint_pb2
from superagent_proto import v1
from google import protobuf
import os, google.protobuf.timestamp_pb2
from endpointd import wire

def late() -> None:
    from superagent_proto.v1 import endpoint_pb2_grpc
    import google.protobuf
"""
    flagged = sorted({line for line, name in _imports(ast.parse(source)) if _protobuf(name)})
    assert flagged == [2, 3, 4, 5, 6, 10, 11]
