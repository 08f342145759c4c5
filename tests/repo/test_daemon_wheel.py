"""The endpointd wheel is what a developer's laptop installs: lean, namespaced, complete.

The wheel is built once per module from a clean copy of the three source trees it draws
from, so stale `endpointd/build/` leftovers in a working tree can neither leak into nor be
created by the test.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO_ROOT = Path(__file__).resolve().parents[2]
# hyperscan: the secret redactor's matcher (every byte that leaves the device passes it).
DAEMON_DEPENDENCIES = {
    "grpcio",
    "protobuf",
    "keyring",
    "cryptography",
    "click",
    "hyperscan",
    "pathspec",  # .gitignore matching (endpointd/commands/globs.py)
}
# Control-plane dependencies named explicitly, so a failure says exactly what leaked in.
CONTROL_PLANE_ONLY = {"fastapi", "sqlalchemy", "asyncpg", "openai", "uvicorn", "pgserver"}
TOP_LEVEL_PACKAGES = {"endpointd", "superagent_shared", "superagent_proto"}
# What the wheel's setup draws from, relative to the repo root (see endpointd/setup.py).
SOURCE_TREES = ("endpointd", "shared/superagent_shared", "proto/superagent_proto")
BUILD_LEFTOVERS = shutil.ignore_patterns(
    "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache"
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for tree in SOURCE_TREES:
        shutil.copytree(REPO_ROOT / tree, src / tree, ignore=BUILD_LEFTOVERS)
    out = tmp_path_factory.mktemp("wheelhouse")
    # --no-build-isolation uses this venv's setuptools (an isolated build would need the
    # network); --no-index makes sure nothing is fetched regardless.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "--wheel-dir",
            str(out),
            str(src / "endpointd"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = out.glob("endpointd-*.whl")
    return built


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def _dist_info(wheel: Path) -> str:
    (dist_info,) = {n.split("/", 1)[0] for n in _names(wheel) if ".dist-info/" in n}
    return dist_info


def _read(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(name).decode("utf-8")


def _metadata(wheel: Path) -> Message:
    return Parser().parsestr(_read(wheel, f"{_dist_info(wheel)}/METADATA"))


def _requirements(wheel: Path) -> dict[str, Requirement]:
    reqs = (Requirement(r) for r in _metadata(wheel).get_all("Requires-Dist") or [])
    return {canonicalize_name(r.name): r for r in reqs}


def test_depends_only_on_daemon_libraries(wheel: Path) -> None:
    names = set(_requirements(wheel))
    assert names <= DAEMON_DEPENDENCIES, f"unexpected dependencies: {names - DAEMON_DEPENDENCIES}"
    assert not names & CONTROL_PLANE_ONLY


def _floor(req: Requirement) -> Version:
    floors = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
    assert floors, f"{req} has no lower bound"
    return max(floors)


def test_runtime_floors_cover_the_generated_stubs(wheel: Path) -> None:
    # The stubs raise at import time on an older runtime than the generators targeted, so a
    # lower floor would let pip install a daemon that cannot start.
    pb2 = _read(wheel, "superagent_proto/v1/endpoint_pb2.py")
    grpc_stub = _read(wheel, "superagent_proto/v1/endpoint_pb2_grpc.py")
    protobuf_gencode = re.search(r"^# Protobuf Python Version: (\S+)$", pb2, re.M)
    grpc_gencode = re.search(r"^GRPC_GENERATED_VERSION = '([^']+)'$", grpc_stub, re.M)
    assert protobuf_gencode, "no protobuf gencode version in endpoint_pb2.py"
    assert grpc_gencode, "no GRPC_GENERATED_VERSION in endpoint_pb2_grpc.py"
    reqs = _requirements(wheel)
    assert _floor(reqs["protobuf"]) >= Version(protobuf_gencode.group(1))
    assert _floor(reqs["grpcio"]) >= Version(grpc_gencode.group(1))


def test_top_level_packages_are_namespaced(wheel: Path) -> None:
    tops = {n.split("/", 1)[0] for n in _names(wheel)}
    assert tops == TOP_LEVEL_PACKAGES | {_dist_info(wheel)}
    # Generic names would collide with other projects' modules in site-packages.
    assert not tops & {"shared", "proto"}


def test_ships_generated_stubs_and_typing_markers(wheel: Path) -> None:
    names = set(_names(wheel))
    for generated in ("endpoint_pb2.py", "endpoint_pb2.pyi", "endpoint_pb2_grpc.py"):
        assert f"superagent_proto/v1/{generated}" in names
    assert "superagent_proto/v1/endpoint_pb2_grpc.pyi" in names
    assert "superagent_proto/v1/endpoint.proto" in names
    assert "superagent_shared/protocol.py" in names
    assert "endpointd/guard/landlock.py" in names  # subpackages ship too
    for package in ("endpointd", "superagent_shared", "superagent_proto", "superagent_proto.v1"):
        assert f"{package.replace('.', '/')}/py.typed" in names


def test_ships_every_module_of_its_source_trees(wheel: Path) -> None:
    """Packages are discovered, not listed: a new subpackage can never be left out."""
    names = set(_names(wheel))
    expected = {
        module.relative_to(REPO_ROOT / root).as_posix()
        for root in ("endpointd", "shared", "proto")
        for module in (REPO_ROOT / root).glob("*/**/*.py")
        if not {"build", "__pycache__"} & set(module.relative_to(REPO_ROOT / root).parts)
    }
    assert "endpointd/workspaces/__init__.py" in expected
    assert sorted(expected - names) == []


def test_console_script_entry_point(wheel: Path) -> None:
    entry_points = configparser.ConfigParser()
    entry_points.read_string(_read(wheel, f"{_dist_info(wheel)}/entry_points.txt"))
    assert entry_points["console_scripts"]["endpointd"].strip() == "endpointd.cli:main"


def test_unpacked_wheel_is_self_sufficient(wheel: Path, tmp_path: Path) -> None:
    unpacked = tmp_path / "unpacked"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(unpacked)
    # This interpreter supplies the third-party dependencies; our own packages must come
    # from the unpacked wheel. PYTHONPATH precedes site-packages (including an editable
    # install of this repo), -P keeps the cwd off sys.path, and the cwd is an empty dir.
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(unpacked)

    def run(*args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-P", *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    probe = (
        "import json, endpointd.cli, superagent_shared.protocol, superagent_proto.v1.endpoint_pb2"
        " as pb, superagent_proto.v1.endpoint_pb2_grpc as grpc_pb;"
        "print(json.dumps({m.__name__: m.__file__ for m in"
        " (endpointd.cli, superagent_shared.protocol, pb, grpc_pb)}))"
    )
    files = json.loads(run("-c", probe))
    for module, file in files.items():
        assert Path(file).is_relative_to(unpacked), f"{module} imported from {file}"

    help_text = run("-m", "endpointd", "--help")
    section = help_text.split("Commands:", 1)[1]
    commands = {line.split()[0] for line in section.splitlines() if line.strip()}
    assert {"info", "version"} <= commands
    assert "superagent.endpoint.v1" in run("-m", "endpointd", "version")
