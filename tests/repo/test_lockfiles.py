"""The lockfiles (requirements/*.lock, written by requirements/compile) cover what the
pyproject files ask for, at versions they allow, and are what CI and the image install.

A dependency added to a pyproject.toml without running requirements/compile would make
scripts/bootstrap's hash-checked install miss it; this says which one, offline.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCKS = REPO_ROOT / "requirements"
OURS = {"endpointd", "superagent-server"}
TOOLING = ("dev", "bench")


def _pins(lock: str) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (LOCKS / lock).read_text(encoding="utf-8").splitlines():
        found = re.match(r"^([A-Za-z0-9_.\-]+)==([^ ;\\]+)", line)
        if found:
            pins[canonicalize_name(found[1])] = Version(found[2])
    return pins


def _project(path: str) -> dict[str, Any]:
    with open(REPO_ROOT / path, "rb") as f:
        project: dict[str, Any] = tomllib.load(f)["project"]
    return project


def _requirements(*, extras: bool, tooling: bool) -> list[Requirement]:
    found = []
    for path in ("endpointd/pyproject.toml", "pyproject.toml"):
        project = _project(path)
        found += [Requirement(r) for r in project["dependencies"]]
        groups: dict[str, list[str]] = project.get("optional-dependencies", {})
        for extra, requirements in groups.items():
            if (extras and extra not in TOOLING) or (tooling and extra in TOOLING):
                found += [Requirement(r) for r in requirements]
    return [r for r in found if canonicalize_name(r.name) not in OURS]


def _uncovered(lock: str, requirements: list[Requirement]) -> list[str]:
    pins = _pins(lock)
    return [
        str(r)
        for r in requirements
        if canonicalize_name(r.name) not in pins
        or not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)
    ]


@pytest.mark.parametrize(
    ("lock", "extras", "tooling"),
    [("server.lock", False, False), ("dev.lock", True, True)],
)
def test_each_lock_pins_every_requirement_at_an_allowed_version(
    lock: str, extras: bool, tooling: bool
) -> None:
    assert _uncovered(lock, _requirements(extras=extras, tooling=tooling)) == [], (
        "run requirements/compile"
    )


def test_the_image_lock_has_no_extra_and_every_pin_is_hashed() -> None:
    pins = _pins("server.lock")
    extra_only = {canonicalize_name(r.name) for r in _requirements(extras=True, tooling=False)}
    extra_only -= {canonicalize_name(r.name) for r in _requirements(extras=False, tooling=False)}
    assert extra_only, "the server declares extras"
    assert sorted(extra_only & pins.keys()) == []
    for lock in ("server.lock", "dev.lock"):
        text = (LOCKS / lock).read_text(encoding="utf-8")
        entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
        unhashed = [e.split()[0] for e in entries if "==" in e and "--hash=sha256:" not in e]
        assert unhashed == [], lock


def test_ci_and_the_image_install_from_the_locks() -> None:
    bootstrap = (REPO_ROOT / "scripts" / "bootstrap").read_text(encoding="utf-8")
    assert "--require-hashes -r requirements/dev.lock" in bootstrap
    dockerfile = (REPO_ROOT / "deploy" / "Dockerfile").read_text(encoding="utf-8")
    assert "--require-hashes --wheel-dir /wheels -r requirements/server.lock" in dockerfile
    assert "--no-deps --wheel-dir /wheels ./endpointd ." in dockerfile
