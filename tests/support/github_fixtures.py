"""Fixtures shared by the GitHub channel tests: a started ``FakeGitHub`` on a ``FakeClock``.

Import the fixtures into a test module to use them there (they are not conftest-wide)::

    from tests.support.github_fixtures import REPO, clock_fixture, github_fixture  # noqa: F401

``github`` holds the repository ``REPO``, empty; add ``flaky_issue`` (for instance with
``pytestmark = pytest.mark.usefixtures("flaky_issue")``) for issue #1 in it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.github_server import FakeClock, FakeGitHub

__all__ = ["REPO", "clock_fixture", "flaky_issue_fixture", "github_fixture"]

REPO = "acme/app"


@pytest.fixture(name="clock")
def clock_fixture() -> FakeClock:
    """The clock the fake and the code under test share."""
    return FakeClock()


@pytest.fixture(name="github")
def github_fixture(clock: FakeClock) -> Iterator[FakeGitHub]:
    """A started ``FakeGitHub`` on ``clock``, with ``REPO`` in it."""
    with FakeGitHub(clock=clock) as fake:
        fake.add_repo(REPO)
        yield fake


@pytest.fixture(name="flaky_issue")
def flaky_issue_fixture(github: FakeGitHub) -> dict[str, Any]:
    """Issue #1 of ``REPO``."""
    return github.open_issue(REPO, "Flaky test", "It fails on Tuesdays")
