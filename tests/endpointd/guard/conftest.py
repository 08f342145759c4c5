"""The sandbox tests' endpointd: a real daemon whose home directory is a scratch one (a
module may plant in it by its own ``home`` fixture, or add to the daemon's environment by
its own ``endpointd`` fixture asking for this one)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.endpointd_process import Endpointd, endpointd_in


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return home


@pytest.fixture
def endpointd(tmp_path: Path, home: Path) -> Iterator[Endpointd]:
    with endpointd_in(tmp_path) as daemon:
        daemon.env["HOME"] = str(home)
        yield daemon
