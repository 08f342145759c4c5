"""The device tests' real endpointd and scripted gateway (a module may define its own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.endpointd_process import Endpointd, endpointd_in
from tests.fakes.gateway_server import FakeGateway


@pytest.fixture
def endpointd(tmp_path: Path) -> Iterator[Endpointd]:
    with endpointd_in(tmp_path) as daemon:
        yield daemon


@pytest.fixture
def gw() -> Iterator[FakeGateway]:
    with FakeGateway() as gateway:
        yield gateway
