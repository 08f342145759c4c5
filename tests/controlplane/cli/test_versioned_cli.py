"""``superagent admission`` and ``superagent prompts``: immutable versions, conflicts refused."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

SUPERAGENT = [sys.executable, "-m", "controlplane.cli"]


def _cli(
    database_url: str, *args: str, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SUPERAGENT, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DATABASE_URL": database_url, **env},
    )


def _version_id(output: str) -> str:
    match = re.search(r"\((pol_\w+|prm_\w+)\)", output)
    assert match, output
    return match.group(1)


def test_policy_edits_are_versions_and_a_stale_edit_is_refused(
    db: async_sessionmaker[AsyncSession], database_url: str, tmp_path: Path
) -> None:
    shown = _cli(database_url, "admission", "show")
    assert shown.returncode == 0, shown.stderr
    assert "built-in default" in shown.stderr
    assert json.loads(shown.stdout)["default"]["mode"] == "explicit"

    first = tmp_path / "policy.json"
    # Allowlisted by Matrix ids: ids need no lookup (handles are resolved on save, see
    # tests/controlplane/identities/test_identities.py).
    alice, bob, mallory = "@alice:example.org", "@bob:example.org", "@mallory:example.org"
    first.write_text(json.dumps({"default": {"users": [alice]}}))
    saved = _cli(database_url, "admission", "edit", "--file", str(first), "--author", "alice")
    assert saved.returncode == 0, saved.stderr
    assert "version 1" in saved.stdout
    v1 = _version_id(saved.stdout)

    shown = _cli(database_url, "admission", "show")
    assert f"version 1 ({v1}), by alice" in shown.stderr
    body = json.loads(shown.stdout)
    assert body["default"]["users"] == [alice]
    assert body["default"]["inferred"] == "off"  # stored complete, defaults filled in

    second = tmp_path / "second.json"
    second.write_text(json.dumps({"default": {"users": [alice, bob]}}))
    saved = _cli(database_url, "admission", "edit", "--file", str(second), "--base", v1)
    assert saved.returncode == 0, saved.stderr
    assert "version 2" in saved.stdout

    # Someone else's edit, still based on version 1: refused, naming the latest.
    third = tmp_path / "third.json"
    third.write_text(json.dumps({"default": {"users": [mallory]}}))
    refused = _cli(database_url, "admission", "edit", "--file", str(third), "--base", v1)
    assert refused.returncode == 1
    assert "latest is version 2" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert "mallory" not in _cli(database_url, "admission", "show").stdout

    # An old version stays readable.
    # The old name still answers (`superagent policy` before the rename).
    old = _cli(database_url, "policy", "show", "--version", v1)
    assert json.loads(old.stdout)["default"]["users"] == [alice]


def test_an_invalid_policy_is_refused_with_the_field_named(
    db: async_sessionmaker[AsyncSession], database_url: str, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"sources": {"slack": {"mode": "sometimes"}}}))
    refused = _cli(database_url, "admission", "edit", "--file", str(bad))
    assert refused.returncode == 1
    assert "sources.slack.mode" in refused.stderr
    assert "nothing saved" in refused.stderr
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    refused = _cli(database_url, "admission", "edit", "--file", str(broken))
    assert "not valid JSON" in refused.stderr
    assert "built-in default" in _cli(database_url, "admission", "show").stderr


def test_policy_edit_in_the_editor(db: async_sessionmaker[AsyncSession], database_url: str) -> None:
    # The "editor" switches the default source mode from explicit to candidate.
    editor = 'sed -i s/\\"explicit\\"/\\"candidate\\"/'
    saved = _cli(database_url, "admission", "edit", EDITOR=editor, VISUAL=editor)
    assert saved.returncode == 0, saved.stderr
    assert "version 1" in saved.stdout
    shown = _cli(database_url, "admission", "show")
    assert json.loads(shown.stdout)["default"]["mode"] == "candidate"
    unchanged = _cli(database_url, "admission", "edit", EDITOR="true", VISUAL="true")
    assert "nothing saved" in unchanged.stdout


def test_prompts_have_defaults_and_versions(
    db: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    shown = _cli(database_url, "prompts", "show", "router")
    assert shown.returncode == 0, shown.stderr
    assert "built-in default" in shown.stderr
    assert shown.stdout.strip()
    saved = _cli(database_url, "prompts", "edit", "router", "--file", "-", stdin="Be brief.\n")
    assert saved.returncode == 0, saved.stderr
    first = _version_id(saved.stdout)
    shown = _cli(database_url, "prompts", "show", "router")
    assert shown.stdout == "Be brief.\n"
    assert first in shown.stderr
    # A version of another document is not this one's.
    other = _cli(database_url, "prompts", "show", "worker", "--version", first)
    assert other.returncode == 1
    assert "not of worker" in other.stderr
    unknown = _cli(database_url, "prompts", "show", "nobody")
    assert unknown.returncode == 2
    assert "router" in unknown.stderr  # the choices are named
    empty = _cli(database_url, "prompts", "edit", "worker", "--file", "-", stdin="  \n")
    assert "cannot be empty" in empty.stderr


def test_a_conflicting_prompt_save_is_refused(
    db: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    first = _cli(database_url, "prompts", "edit", "router", "--file", "-", stdin="Version one.\n")
    base = _version_id(first.stdout)
    mine = _cli(
        database_url, "prompts", "edit", "router", "--file", "-", "--base", base, stdin="Mine.\n"
    )
    assert mine.returncode == 0, mine.stderr
    theirs = _cli(
        database_url, "prompts", "edit", "router", "--file", "-", "--base", base, stdin="Theirs.\n"
    )
    assert theirs.returncode == 1
    assert "latest is version 2" in theirs.stderr
    assert _cli(database_url, "prompts", "show", "router").stdout == "Mine.\n"
