"""Where protobuf is touched, read from the source: the walks behind the protobuf boundary
tests (tests/repo/test_protobuf_boundary.py). import-linter checks the imports too
([tool.importlinter]); only these walks also see message methods called past a wire module.
"""

from __future__ import annotations

import ast
from pathlib import Path

# The generated stubs and protobuf's own types: only the wire module converts them.
PROTOBUF = ("superagent_proto", "google.protobuf")
# Message methods of protobuf: called elsewhere, they would mean a message got past the wire.
PROTOBUF_METHODS = {
    "ByteSize",
    "ClearField",
    "CopyFrom",
    "DiscardUnknownFields",
    "FromDatetime",
    "FromNanoseconds",
    "FromString",
    "HasField",
    "ListFields",
    "MergeFrom",
    "MergeFromString",
    "ParseFromString",
    "SerializePartialToString",
    "SerializeToString",
    "ToDatetime",
    "ToJsonString",
    "ToNanoseconds",
    "WhichOneof",
}


def imports(tree: ast.AST) -> list[tuple[int, str]]:
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


def is_protobuf(name: str) -> bool:
    return any(name == root or name.startswith(root + ".") for root in PROTOBUF)


def _modules(package: Path) -> list[tuple[str, ast.AST]]:
    """``(path relative to the repository, its syntax tree)`` for every module under
    ``package``."""
    return [
        (
            path.relative_to(package.parent).as_posix(),
            ast.parse(path.read_text(encoding="utf-8"), filename=str(path)),
        )
        for path in sorted(package.rglob("*.py"))
    ]


def protobuf_importers(package: Path) -> dict[str, list[int]]:
    """``{module path: [line, …]}`` for every module under ``package`` with an import of
    the protocol stubs or of protobuf."""
    offenders: dict[str, list[int]] = {}
    for where, tree in _modules(package):
        lines = sorted({line for line, name in imports(tree) if is_protobuf(name)})
        if lines:
            offenders[where] = lines
    return offenders


def protobuf_callers(package: Path, wire: str) -> dict[str, list[str]]:
    """``{module path: ["line: method", …]}`` for every module under ``package`` but the
    ``wire`` module that names a protobuf message method."""
    offenders: dict[str, list[str]] = {}
    for where, tree in _modules(package):
        if where == wire:
            continue
        calls = [
            f"{node.lineno}: {node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in PROTOBUF_METHODS
        ]
        if calls:
            offenders[where] = calls
    return offenders
