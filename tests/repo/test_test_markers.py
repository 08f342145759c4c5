"""The suite marks its own tests ``pg`` and ``slow`` (tests/support/markers.py, via conftest).

Known tests of the suite are collected again, in-process, and their marks checked: without
the conftest hook none would have ``pg``, and only the explicitly marked ``slow``. The rule
itself is shown on small helpers below.
"""

from __future__ import annotations

import asyncio
import functools
import subprocess
from pathlib import Path

import pytest

from tests.support.markers import reach

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parents[1]

KNOWN = {
    # a database fixture (pool -> db -> engine -> database_url -> pg_server_url)
    "test_outbox.py::test_effect_runs_after_commit_and_is_deleted": {"pg"},
    # a Postgres of its own (pgserver in a fixture); and a replica process, marked by hand too
    "test_db_outage.py::test_a_postgres_outage_is_survived_and_logged_as_one_episode": {
        "pg",
        "slow",
    },
    # a real endpointd (tests/fakes/endpointd_process.py) against the in-process fake gateway
    "test_exec.py::test_stdin_env_and_cwd": {"slow"},
    # the endpointd CLI through a module-level helper of its test module
    "test_policy.py::test_policy_init_and_show": {"slow"},
    # the endpointd daemon's command starter, in-process (product code that starts processes)
    "test_supervise.py::test_exit_is_seen_at_once_without_the_poll": {"slow"},
    # the zygote fixture (a product class that starts a process)
    "test_zygote.py::test_a_forked_supervisor_runs_the_command_with_a_clean_slate": {"slow"},
    # pure functions: neither
    "test_settings.py::test_environment_names": set(),
    "test_redact.py::test_no_credentials_is_a_pass_through": set(),
    # neither: its one process is a cached probe (git --list-cmds, once per process)
    "test_policy.py::test_credential_scopes": set(),
}


def _located(test: str) -> str:
    """``file::name`` with the file found under tests/ (test file names are unique)."""
    file, _, name = test.partition("::")
    (found,) = TESTS.rglob(file)
    return f"{found}::{name}"


def test_known_tests_get_exactly_their_marks(pytester: pytest.Pytester) -> None:
    items, _ = pytester.inline_genitems(*(_located(test) for test in KNOWN))
    marks: dict[str, set[str]] = {}
    for item in items:
        test = item.nodeid.split("/")[-1].split("[")[0]  # all parameters alike
        marks.setdefault(test, set()).update(
            m.name for m in item.iter_markers() if m.name in ("pg", "slow")
        )
    assert marks == KNOWN


def _runs_a_command() -> None:
    subprocess.run(["true"], check=True)


def _through_a_helper() -> None:
    _runs_a_command()


async def _an_asyncio_subprocess() -> None:
    proc = await asyncio.create_subprocess_exec("true")
    await proc.wait()


class _Server:
    def start(self) -> None:
        _through_a_helper()


def _uses_the_class() -> None:
    _Server()


def _imports_inside() -> None:
    import subprocess as sp

    sp.check_call(["true"])


@functools.cache
def _a_cached_probe() -> str:
    return subprocess.run(["uname"], capture_output=True, text=True, check=True).stdout


def _uses_the_probe() -> str:
    return _a_cached_probe()


def _only_annotates(proc: subprocess.CompletedProcess[str]) -> int:
    return proc.returncode


def _starts_postgres() -> None:
    from pgserver.postgres_server import get_server

    get_server("/nowhere")


@pytest.mark.parametrize(
    ("sample", "spawns", "pg"),
    [
        ("_runs_a_command", True, False),
        ("_through_a_helper", True, False),
        ("_an_asyncio_subprocess", True, False),
        ("_uses_the_class", True, False),
        ("_imports_inside", True, False),
        ("_uses_the_probe", False, False),
        ("_only_annotates", False, False),
        ("_starts_postgres", False, True),
    ],
)
def test_reach_follows_helpers_classes_and_imports_but_not_annotations(
    sample: str, spawns: bool, pg: bool, request: pytest.FixtureRequest
) -> None:
    found = reach(globals()[sample])
    assert (found.spawns, found.pg) == (spawns, pg)
    # The samples are named by strings, so this test reaches none of them itself.
    assert not [m for m in request.node.iter_markers() if m.name in ("pg", "slow")]
