#!/usr/bin/env python3
"""Regenerate the committed Python stubs of the device protocol from proto/**/*.proto.

The stubs are committed (not built at install time) so that `pip install ./endpointd` needs
no protoc, and so that reviewers see wire changes as code diffs. This script is the only
way they should change:

    python scripts/gen_proto.py           # rewrite stubs that differ, delete stale ones
    python scripts/gen_proto.py --check   # CI: exit 1 if the committed stubs are out of date
    python scripts/gen_proto.py --check --diff   # ... and show the full diff

Generation always happens in a temporary directory first and files are compared byte for
byte, so running it twice is a no-op and --check can never touch the working tree. Output
depends only on the .proto sources and the generator versions (grpcio-tools, mypy-protobuf),
which a failing --check prints so a mismatch can be told apart from a forgotten regen.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# The include root: .proto files live at proto/superagent_proto/v1/… so that generated
# imports read `from superagent_proto.v1 import endpoint_pb2`, the installed package name.
PROTO_ROOT = REPO_ROOT / "proto"
PROTO_PACKAGE = "superagent_proto"
# What protoc plus the two mypy-protobuf plugins emit for each `x.proto`.
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
GENERATOR_DISTRIBUTIONS = ("grpcio-tools", "protobuf", "mypy-protobuf")


@dataclass(frozen=True)
class Change:
    """One generated file whose committed state differs from a fresh generation."""

    path: str  # relative to PROTO_ROOT, POSIX separators
    kind: str  # "changed" | "missing" (not committed yet) | "stale" (no longer generated)
    old: bytes | None
    new: bytes | None


def proto_sources() -> list[str]:
    """Every .proto under the package, relative to PROTO_ROOT, sorted for stable argv."""
    return sorted(p.relative_to(PROTO_ROOT).as_posix() for p in _rglob(PROTO_ROOT, "*.proto"))


def _rglob(root: Path, pattern: str) -> list[Path]:
    return sorted(p for p in (root / PROTO_PACKAGE).rglob(pattern) if p.is_file())


def committed_stubs() -> dict[str, bytes]:
    """The generated files currently in the working tree, keyed by path relative to proto/."""
    found: dict[str, bytes] = {}
    for suffix in GENERATED_SUFFIXES:
        for path in _rglob(PROTO_ROOT, f"*{suffix}"):
            found[path.relative_to(PROTO_ROOT).as_posix()] = path.read_bytes()
    return found


def _plugin(name: str) -> str:
    # Look next to this interpreter first: running `.venv/bin/python scripts/gen_proto.py`
    # without activating the venv leaves its bin/ off PATH, and a protoc-gen-mypy from some
    # other environment would silently produce different stubs.
    scripts_dir = sysconfig.get_path("scripts")
    found = shutil.which(name, path=scripts_dir) or shutil.which(name)
    if found is None:
        raise SystemExit(
            f"gen_proto: {name} not found; install the dev extras (mypy-protobuf provides it)"
        )
    return found


def _normalise(data: bytes) -> bytes:
    # protoc on Windows may emit CRLF; committed stubs are LF everywhere so --check agrees
    # across platforms.
    return data.replace(b"\r\n", b"\n")


def generate(out_dir: Path) -> dict[str, bytes]:
    """Run protoc into `out_dir` and return every file it produced, keyed like committed_stubs.

    protoc runs with cwd=repo root and repo-relative paths so no absolute path of this
    checkout can leak into the output.
    """
    sources = proto_sources()
    if not sources:
        raise SystemExit(f"gen_proto: no .proto files under {PROTO_ROOT / PROTO_PACKAGE}")
    out = str(out_dir)
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-I",
        PROTO_ROOT.relative_to(REPO_ROOT).as_posix(),
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out}",
        f"--mypy_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_grpc_out={out}",
        *(f"{PROTO_ROOT.relative_to(REPO_ROOT).as_posix()}/{src}" for src in sources),
    ]
    # A fixed hash seed removes the one source of run-to-run variation a Python plugin
    # could have (set/dict iteration over str keys).
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"gen_proto: protoc failed with exit code {proc.returncode}")
    return {
        p.relative_to(out_dir).as_posix(): _normalise(p.read_bytes())
        for p in sorted(out_dir.rglob("*"))
        if p.is_file()
    }


def compare(committed: dict[str, bytes], fresh: dict[str, bytes]) -> list[Change]:
    changes: list[Change] = []
    for path in sorted(committed.keys() | fresh.keys()):
        old, new = committed.get(path), fresh.get(path)
        if old == new:
            continue
        kind = "missing" if old is None else "stale" if new is None else "changed"
        changes.append(Change(path=path, kind=kind, old=old, new=new))
    return changes


def _lines(data: bytes | None) -> list[str]:
    return [] if data is None else data.decode("utf-8", errors="replace").splitlines(True)


def _diff(change: Change) -> list[str]:
    name = f"proto/{change.path}"
    return list(
        difflib.unified_diff(_lines(change.old), _lines(change.new), f"a/{name}", f"b/{name}", n=2)
    )


def summarise(change: Change) -> str:
    diff = _diff(change)
    added = sum(1 for line in diff if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in diff if line.startswith("-") and not line.startswith("---"))
    return f"  {change.kind:8} proto/{change.path} (+{added} -{removed} lines)"


def generator_versions() -> str:
    parts = []
    for dist in GENERATOR_DISTRIBUTIONS:
        try:
            parts.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{dist} (not installed)")
    return ", ".join(parts)


def apply(changes: list[Change]) -> None:
    for change in changes:
        target = PROTO_ROOT / change.path
        if change.new is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(change.new)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check",
        action="store_true",
        help="generate into a temp dir and exit 1 if the committed stubs differ",
    )
    parser.add_argument(
        "--diff", action="store_true", help="with --check, also print the full unified diff"
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="gen_proto-") as tmp:
        fresh = generate(Path(tmp))
    changes = compare(committed_stubs(), fresh)

    if args.check:
        if not changes:
            print(f"gen_proto: {len(fresh)} generated files are up to date")
            return 0
        print(f"gen_proto: {len(changes)} generated file(s) out of date:")
        for change in changes:
            print(summarise(change))
            if args.diff:
                sys.stdout.writelines(_diff(change))
        print(f"generators here: {generator_versions()}")
        print("run `python scripts/gen_proto.py` and commit the result")
        return 1

    apply(changes)
    for change in changes:
        print(summarise(change))
    print(f"gen_proto: {len(changes)} file(s) written or removed, {len(fresh)} generated in total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
