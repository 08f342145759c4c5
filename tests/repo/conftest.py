"""Fixtures of the repository-level tests: the two distributions, built once per session."""

from __future__ import annotations

import pytest

from tests.support.distributions import Distributions, build_distributions


@pytest.fixture(scope="session")
def distributions(tmp_path_factory: pytest.TempPathFactory) -> Distributions:
    """Both sdists, and each wheel built from its sdist (tests/support/distributions.py)."""
    return build_distributions(tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("build"))
