"""``commands.spec``: the JSON a queued command is stored as reads back as the command, and
rows written by earlier releases read back, and are written again, byte for byte."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.gateway import specs
from superagent_shared import messages
from tests.shared.test_messages import FUZZ, strategy

# As the control plane stored each kind before the protocol had one model: the format
# rows in existing databases have.
STORED: list[tuple[str, dict[str, Any]]] = [
    (
        "exec",
        {
            "argv": ["sh", "-c", "echo hi"],
            "cwd": "/work",
            "env": {"A": "1"},
            "timeout_seconds": 5,
            "stdin": "aGk=",
            "credentials": [
                {"name": "gh", "delivery": "git_helper", "env_var": ""},
                {"name": "api", "delivery": "env", "env_var": "API_KEY"},
            ],
        },
    ),
    (
        "exec",
        {
            "argv": ["true"],
            "cwd": "",
            "env": {},
            "timeout_seconds": 0,
            "stdin": None,
            "credentials": [],
        },
    ),
    ("read_file", {"path": "/a", "offset": 3, "limit": None}),
    (
        "write_file",
        {
            "path": "/a",
            "content": "aGk=",
            "mode": 420,
            "create_parents": True,
            "expected_sha256": "",
        },
    ),
    ("list_dir", {"path": "/a", "depth": 1}),
    ("cancel", {"target_command_id": "cmd_8f3k2q", "grace_seconds": 0}),
    (
        "prepare_workspace",
        {
            "ticket_id": "tkt_8f3k2q",
            "repo": "github.com/acme/app",
            "base": "pull_request",
            "ref": "feature",
            "path": "",
            "setup": True,
        },
    ),
    ("release_workspace", {"ticket_id": "tkt_8f3k2q"}),
    (
        "search",
        {
            "pattern": "x",
            "path": "/a",
            "glob": "*.py",
            "literal": False,
            "ignore_case": True,
            "max_matches": 0,
        },
    ),
    ("glob", {"pattern": "*", "path": "/a", "max_entries": 10}),
    (
        "run_harness",
        {
            "harness": "qwen",
            "cwd": "/work",
            "prompt": "fix it",
            "resume_session": "",
            "max_turns": 0,
            "timeout_seconds": 0,
        },
    ),
]


@pytest.mark.parametrize(
    ("kind", "row"), STORED, ids=[f"{k}-{i}" for i, (k, _) in enumerate(STORED)]
)
def test_a_stored_row_reads_back_and_is_written_again_byte_for_byte(
    kind: str, row: dict[str, Any]
) -> None:
    spec = specs.from_json(kind, row)
    assert kind == spec.KIND
    assert json.dumps(specs.to_json(spec)) == json.dumps(row)


def test_what_a_stored_exec_means() -> None:
    spec = specs.from_json(*STORED[0])
    assert spec == messages.Exec(
        argv=("sh", "-c", "echo hi"),
        cwd="/work",
        env={"A": "1"},
        timeout_seconds=5,
        stdin=b"hi",
        credentials=(
            messages.CredentialRef("gh", messages.Delivery.GIT_HELPER),
            messages.CredentialRef("api", messages.Delivery.ENV, "API_KEY"),
        ),
    )


def test_a_key_an_older_row_lacks_means_what_it_meant_then() -> None:
    assert specs.from_json("list_dir", {"path": "/a"}) == messages.ListDir("/a", depth=1)
    prepared = specs.from_json("prepare_workspace", {"ticket_id": "tkt_1", "repo": "r"})
    assert isinstance(prepared, messages.PrepareWorkspace)
    assert prepared.setup


_CREDENTIALS = st.lists(
    st.builds(
        messages.CredentialRef,
        st.text(max_size=8),
        st.sampled_from([d for d in messages.Delivery if d != messages.Delivery.UNSPECIFIED]),
        st.text(max_size=8),
    ),
    max_size=2,
)


def _named(spec: Any) -> bool:
    base = getattr(spec, "base", messages.WorkspaceBase.DEFAULT_BRANCH)
    return isinstance(base, messages.WorkspaceBase)


@FUZZ
@given(
    st.one_of([strategy(c) for c in (messages.Exec, *specs.KINDS.values())]).filter(_named),
    _CREDENTIALS,
)
def test_every_spec_reads_back_as_stored(spec: specs.Spec, credentials: list[Any]) -> None:
    if isinstance(spec, messages.Exec):
        spec = dataclasses.replace(spec, credentials=credentials)
    stored = json.loads(json.dumps(specs.to_json(spec)))
    assert specs.from_json(spec.KIND, stored) == spec
