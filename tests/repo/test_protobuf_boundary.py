"""The protobuf boundary on both sides of the device protocol: only the two wire modules
(controlplane/gateway/wire.py, endpointd/endpointd/wire.py) touch the generated stubs or
protobuf; everything else works on plain data (superagent_shared.messages) and passes each
side's ``wire.Outgoing`` on.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.protobuf_boundary import (
    imports,
    is_protobuf,
    protobuf_callers,
    protobuf_importers,
)

ROOT = Path(__file__).resolve().parents[2]
SIDES = [
    pytest.param(ROOT / "controlplane", "controlplane/gateway/wire.py", id="control-plane"),
    pytest.param(ROOT / "endpointd" / "endpointd", "endpointd/wire.py", id="endpointd"),
]


@pytest.mark.parametrize(("package", "wire"), SIDES)
def test_only_the_wire_module_imports_protobuf(package: Path, wire: str) -> None:
    offenders = protobuf_importers(package)
    found = offenders.pop(wire, None)
    assert offenders == {}, f"only {wire} may touch protobuf: convert to plain data there"
    assert found, "the wire module imports no protobuf: is the walk broken?"


@pytest.mark.parametrize(("package", "wire"), SIDES)
def test_only_the_wire_module_calls_protobuf_methods(package: Path, wire: str) -> None:
    assert protobuf_callers(package, wire) == {}


def test_the_walk_finds_every_form_of_import() -> None:
    source = """
import superagent_proto.v1.endpoint_pb2 as pb
from superagent_proto.v1 import endpoint_pb2
from superagent_proto import v1
from google import protobuf
import os, google.protobuf.timestamp_pb2
from controlplane.gateway import wire
from google.auth import credentials

def late() -> None:
    from superagent_proto.v1 import endpoint_pb2_grpc
    import google.protobuf
"""
    flagged = sorted({line for line, name in imports(ast.parse(source)) if is_protobuf(name)})
    assert flagged == [2, 3, 4, 5, 6, 11, 12]


def test_the_walk_flags_a_stray_import_and_a_stray_call(tmp_path: Path) -> None:
    """On a copy of the package with one module that imports the stubs inside a function
    and one that looks into a message, both walks name exactly those."""
    package = tmp_path / "controlplane"
    (package / "gateway").mkdir(parents=True)
    (package / "gateway" / "wire.py").write_text("from superagent_proto.v1 import endpoint_pb2\n")
    (package / "gateway" / "stream.py").write_text(
        "def kind(message: object) -> str:\n"
        "    from superagent_proto.v1 import endpoint_pb2_grpc  # noqa\n"
        "    return message.WhichOneof('msg')\n"
    )
    (package / "worker.py").write_text("import grpc\n")
    assert protobuf_importers(package) == {
        "controlplane/gateway/stream.py": [2],
        "controlplane/gateway/wire.py": [1],
    }
    assert protobuf_callers(package, "controlplane/gateway/wire.py") == {
        "controlplane/gateway/stream.py": ["3: WhichOneof"]
    }
