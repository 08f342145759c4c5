"""Worker tools and limits: background jobs, Inline & Spill, patches, files, limits,
speculative tickets, and bad tool input.

Each test drives a real ``WorkerService`` over real Postgres, with a ``LocalDevice`` that
really runs commands from the real queue, and the fake OpenAI server scripted as the model.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from controlplane.domain import TERMINAL_COMMAND_STATES
from controlplane.gateway import specs, wire
from controlplane.gateway.queue import CommandQueue
from controlplane.tools.registry import Refused
from controlplane.workers.tools import shell_syntax
from controlplane.workers.tools.toolbox import TOOL_SPECS
from superagent_proto.v1 import endpoint_pb2 as pb
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer, Reply, ToolCall
from tests.support.helpers import assert_eventually
from tests.support.worker_harness import (  # noqa: F401 - fixtures
    LocalDevice,
    device_fixture,
    dsn_fixture,
    local_device,
    queue_fixture,
    report_reply,
    state_is,
    ticket,
    ticket_state,
    tool_results,
    workers_running,
)

# -- fixtures (as in test_workers.py) ----------------------------------------------------


# -- helpers -----------------------------------------------------------------------------


def _last_result(request: ChatRequest) -> dict[str, Any]:
    results = tool_results(request)
    assert results, "no tool result yet"
    return results[-1]


async def _router_reports(pool: asyncpg.Pool, ticket_id: str) -> list[asyncpg.Record]:
    """The router-inbox triggers a ticket's worker produced."""
    return await pool.fetch(
        "SELECT kind, text, thread_id FROM triggers WHERE source = 'agent' AND actor_id = $1 "
        "ORDER BY created_at",
        ticket_id,
    )


async def _until_state(pool: asyncpg.Pool, ticket_id: str, state: str) -> None:
    await assert_eventually(
        lambda: state_is(pool, ticket_id, state), timeout=12, message=f"{ticket_id} {state}"
    )


async def _assert_blocked_by(pool: asyncpg.Pool, ticket_id: str, *words: str) -> None:
    """The worker stopped with a blocked report naming the limit, and the ticket waits."""
    await _until_state(pool, ticket_id, "waiting_human")
    assert await ticket_state(pool, ticket_id) == ("waiting_human", "blocked")
    (report,) = await _router_reports(pool, ticket_id)
    assert report["kind"] == "report.blocked"
    assert "limit reached" in report["text"]
    for word in words:
        assert word in report["text"], (word, report["text"])
    outcome = await pool.fetchval(
        "SELECT outcome FROM assignments WHERE ticket_id = $1 AND ended_at IS NOT NULL",
        ticket_id,
    )
    assert outcome == "blocked"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


# -- 1. background jobs ------------------------------------------------------------------


async def test_a_long_command_becomes_a_background_job_whose_end_is_an_event(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    """Asynchronous ReAct: shell returns a job after foreground_seconds; the worker's turn
    ends while the job runs but it keeps its slot; the job's end arrives as an event."""
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    fake_llm.script(
        Reply(tool_calls=[ToolCall("shell", {"command": "sleep 3; echo done"})]),
        Reply(content="The build runs; I wait for it."),
        report_reply("ready", "built"),
    )
    async with workers_running(pool, queue, fake_llm, dsn, foreground_seconds=1):
        await assert_eventually(
            lambda: len(fake_llm.chat_requests) >= 2, timeout=10, message="second model call"
        )
        pending = _last_result(fake_llm.chat_requests[1])
        job = pending["job"]
        assert job.startswith("cmd_")
        assert pending["state"] not in TERMINAL_COMMAND_STATES
        assert "background" in pending["note"]
        assert "exit_code" not in pending
        # The turn is over (plain text) but the job runs: the round holds its slot.
        row = await pool.fetchrow(
            "SELECT a.ended_at IS NULL AS open, a.slot, c.state, t.state AS ticket "
            "FROM assignments a JOIN commands c ON c.ticket_id = a.ticket_id "
            "JOIN tickets t ON t.id = a.ticket_id WHERE a.ticket_id = $1 AND c.id = $2",
            ticket_id,
            job,
        )
        assert row is not None
        assert row["state"] not in TERMINAL_COMMAND_STATES, (
            "the job ended too soon to observe the wait"
        )
        assert row["open"] is True
        assert row["slot"] == "regular"
        assert row["ticket"] == "running"
        await _until_state(pool, ticket_id, "completed")
    assert len(fake_llm.chat_requests) == 3
    third = fake_llm.chat_requests[2]
    event = third.last_message()
    assert event is not None
    assert event["role"] == "user"
    # The header, then one JSON record: the job that ended.
    (ended,) = [json.loads(line) for line in event["content"].splitlines()[1:]]
    assert ended["type"] == "job_ended"
    assert (ended["job"], ended["command"]) == (job, "sleep 3; echo done")
    assert (ended["output"], ended["exit_code"]) == ("done\n", 0)
    (report,) = await _router_reports(pool, ticket_id)
    assert report["kind"] == "report.ready"
    assert await pool.fetchval(
        "SELECT reported_at IS NOT NULL FROM jobs WHERE command_id = $1", job
    )


# -- 2. Inline & Spill -------------------------------------------------------------------


async def test_large_output_is_inlined_as_head_and_tail_and_read_by_slices(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    """~48 KB of output: the model sees head, tail, the omitted size and how to read more;
    job_output returns exactly the requested slice of the real output."""
    expected = "".join(f"{n}\n" for n in range(10000, 18000))  # 48,000 bytes
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))

    def model(request: ChatRequest) -> Reply:
        results = tool_results(request)
        if not results:
            return Reply(tool_calls=[ToolCall("shell", {"command": "seq 10000 17999"})])
        if len(results) == 1:
            job = results[0]["job"]
            args = {"job": job, "offset": 20_000, "limit": 1000}
            return Reply(tool_calls=[ToolCall("job_output", args)])
        return report_reply("ready", "read it")

    fake_llm.respond_with(model)
    async with workers_running(pool, queue, fake_llm, dsn):
        await _until_state(pool, ticket_id, "completed")
    shown, sliced = tool_results(fake_llm.chat_requests[-1])
    assert shown["state"] == "finished"
    assert shown["exit_code"] == 0
    assert "output" not in shown
    assert shown["output_head"] == expected[:2000]
    assert shown["output_tail"] == expected[-2000:]
    assert shown["omitted_bytes"] == len(expected) - 4000
    assert shown["read_more"] == f"job_output(job={shown['job']!r}, offset=2000)"
    assert sliced["job"] == shown["job"]
    assert sliced["offset"] == 20_000
    assert sliced["output"] == expected[20_000:21_000]
    assert sliced["size"] == len(expected)
    assert sliced["next_offset"] == 21_000


# -- 3. apply_patch ----------------------------------------------------------------------

_CLEAN = """\
--- a/hello.txt
+++ b/hello.txt
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
"""
# The first hunk applies on its own; the second does not: all or nothing.
_CONFLICT = """\
--- a/hello.txt
+++ b/hello.txt
@@ -1,3 +1,3 @@
-one
+ONE
 TWO
 three
--- a/other.txt
+++ b/other.txt
@@ -1,2 +1,2 @@
 alpha
-gamma
+GAMMA
"""


async def test_apply_patch_applies_a_clean_diff_and_refuses_a_conflicting_one_whole(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "hello.txt").write_text("one\ntwo\nthree\n")
    (repo / "other.txt").write_text("alpha\nbeta\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "start")
    ticket_id, _ = await ticket(pool, device, workdir=str(repo))
    fake_llm.script(
        Reply(tool_calls=[ToolCall("apply_patch", {"patch": _CLEAN})]),
        Reply(tool_calls=[ToolCall("apply_patch", {"patch": _CONFLICT})]),
        report_reply("ready", "patched"),
    )
    async with workers_running(pool, queue, fake_llm, dsn):
        await _until_state(pool, ticket_id, "completed")
    clean, conflict = tool_results(fake_llm.chat_requests[-1])
    assert clean["applied"] is True
    assert "error" not in clean
    assert conflict["applied"] is False
    assert "does not apply" in conflict["error"]
    assert "other.txt" in conflict["output"]  # git says where
    # The clean patch is on disk; the conflicting one changed nothing, not even its good hunk.
    assert (repo / "hello.txt").read_text() == "one\nTWO\nthree\n"
    assert (repo / "other.txt").read_text() == "alpha\nbeta\n"


# -- 4. files ----------------------------------------------------------------------------


async def test_file_tools_resolve_relative_paths_against_the_workdir(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    """The workdir is neither the device's directory nor the test's cwd: a relative path
    works only if the tools join it to the ticket's workdir."""
    workdir = tmp_path / "checkout"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("remember the milk\n")
    ticket_id, _ = await ticket(pool, device, workdir=str(workdir))
    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCall("write_file", {"path": "sub/new.txt", "content": "fresh\n"}),
                ToolCall("read_file", {"path": "notes.txt"}),
                ToolCall("list_dir", {"path": "sub"}),
                ToolCall("read_file", {"path": "sub/new.txt"}),
            ]
        ),
        report_reply("ready", "files done"),
    )
    async with workers_running(pool, queue, fake_llm, dsn):
        await _until_state(pool, ticket_id, "completed")
    assert (workdir / "sub" / "new.txt").read_text() == "fresh\n"
    assert not (tmp_path / "sub").exists()
    wrote, read, listed, read_back = tool_results(fake_llm.chat_requests[-1])
    assert wrote == {"path": str(workdir / "sub" / "new.txt"), "written_bytes": 6}
    assert read["path"] == str(workdir / "notes.txt")
    assert read["output"] == "remember the milk\n"
    assert listed["path"] == str(workdir / "sub")
    assert listed["output"].split("\n") == ["new.txt"]
    assert read_back["output"] == "fresh\n"


# -- 5. limits ---------------------------------------------------------------------------


async def test_the_same_call_three_times_in_a_row_is_not_run_and_blocks(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    same = Reply(tool_calls=[ToolCall("shell", {"command": "echo again"})])
    fake_llm.script(same, same, same)
    async with workers_running(pool, queue, fake_llm, dsn):
        await _assert_blocked_by(pool, ticket_id, "same shell call 3 times")
    assert device.shell_runs("echo again") == 2
    assert len(fake_llm.chat_requests) == 3
    last = await pool.fetchval(
        "SELECT m.content FROM session_messages m JOIN sessions s ON s.id = m.session_id "
        "WHERE s.ticket_id = $1 ORDER BY m.seq DESC LIMIT 1",
        ticket_id,
    )
    tool = (json.loads(last) if isinstance(last, str) else last)["message"]
    assert tool["role"] == "tool"
    assert json.loads(tool["content"])["error"].startswith("not run: limit reached")


async def test_max_turns_stops_the_worker(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    fake_llm.script(
        Reply(tool_calls=[ToolCall("shell", {"command": "echo one"})]),
        Reply(tool_calls=[ToolCall("shell", {"command": "echo two"})]),
        Reply(tool_calls=[ToolCall("shell", {"command": "echo three"})]),
    )
    async with workers_running(pool, queue, fake_llm, dsn, max_turns=2):
        await _assert_blocked_by(pool, ticket_id, "2 model calls", "workers.max_turns = 2")
    assert len(fake_llm.chat_requests) == 2
    assert fake_llm.pending_replies == 1
    assert device.shell_runs("echo two") == 1
    assert device.shell_runs("echo three") == 0


async def test_the_token_budget_stops_the_worker(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    fake_llm.script(
        Reply(tool_calls=[ToolCall("shell", {"command": "echo spent"})]),
        Reply(tool_calls=[ToolCall("shell", {"command": "echo more"})]),
    )
    async with workers_running(pool, queue, fake_llm, dsn, token_budget=1000):
        await _assert_blocked_by(pool, ticket_id, "tokens spent", "workers.token_budget = 1,000")
    usage = fake_llm.requests[-1].usage
    assert usage is not None
    assert usage["total_tokens"] >= 1000
    assert (
        await pool.fetchval("SELECT tokens_used FROM tickets WHERE id = $1", ticket_id)
        == usage["total_tokens"]
    )
    assert len(fake_llm.chat_requests) == 1
    assert device.shell_runs("echo more") == 0


# -- 6. speculative tickets --------------------------------------------------------------


async def test_a_speculative_ticket_that_fails_is_discarded_silently(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    ticket_id, thread_id = await ticket(pool, device, workdir=str(tmp_path), speculative=True)
    fake_llm.script(report_reply("failed", "could not reproduce"))
    async with workers_running(pool, queue, fake_llm, dsn):
        await _until_state(pool, ticket_id, "stopped")
    assert await ticket_state(pool, ticket_id) == ("stopped", "discarded")
    assert await _router_reports(pool, ticket_id) == []
    replies = await pool.fetchval(
        "SELECT count(*) FROM effects WHERE kind = 'reply' AND payload->>'thread_id' = $1",
        thread_id,
    )
    assert replies == 0
    assert await pool.fetchval(
        "SELECT bool_and(revoked_at IS NOT NULL) FROM mandates WHERE ticket_id = $1", ticket_id
    )
    # On record, but not delivered.
    row = await pool.fetchrow(
        "SELECT status, trigger_id FROM reports WHERE ticket_id = $1", ticket_id
    )
    assert row is not None
    assert row["status"] == "failed"
    assert row["trigger_id"] is None


async def test_a_speculative_ticket_delivers_only_once_it_confirms_a_fix(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    """open_pull_request is refused while speculative; ready with reproduced and fixed
    confirms (the ticket turns ordinary) without ending the round, and the next ready
    reaches the router."""
    ticket_id, thread_id = await ticket(pool, device, workdir=str(tmp_path), speculative=True)
    fake_llm.script(
        Reply(tool_calls=[ToolCall("open_pull_request", {"title": "fix", "body": "fixed"})]),
        report_reply("ready", "reproduced and fixed it", reproduced=True, fixed=True),
        report_reply("ready", "delivered"),
    )
    async with workers_running(pool, queue, fake_llm, dsn):
        await _until_state(pool, ticket_id, "completed")
    refused, confirmed = tool_results(fake_llm.chat_requests[-1])
    assert "speculative" in refused["error"]
    assert confirmed["confirmed"] is True
    assert await pool.fetchval("SELECT speculative FROM tickets WHERE id = $1", ticket_id) is False
    assert await ticket_state(pool, ticket_id) == ("completed", "ready")
    # No pull request was asked of GitHub while speculative.
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM effects WHERE payload->>'ticket_id' = $1", ticket_id
        )
        == 0
    )
    # One round throughout: the confirmation did not end it.
    rounds = await pool.fetch("SELECT outcome FROM assignments WHERE ticket_id = $1", ticket_id)
    assert [r["outcome"] for r in rounds] == ["ready"]
    (report,) = await _router_reports(pool, ticket_id)
    assert report["kind"] == "report.ready"
    assert report["thread_id"] == thread_id
    assert "delivered" in report["text"]
    statuses = await pool.fetch(
        "SELECT status, summary FROM reports WHERE ticket_id = $1 ORDER BY created_at",
        ticket_id,
    )
    assert [(r["status"], r["summary"].startswith("confirmed")) for r in statuses] == [
        ("progress", True),
        ("ready", False),
    ]


# -- 7. a turn without a report ----------------------------------------------------------


async def test_a_turn_ending_in_plain_text_becomes_a_question(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    ticket_id, thread_id = await ticket(pool, device, workdir=str(tmp_path))
    asked = "Should I target the release branch or main?"
    fake_llm.script(Reply(content=asked))
    async with workers_running(pool, queue, fake_llm, dsn):
        await _until_state(pool, ticket_id, "waiting_human")
    assert await ticket_state(pool, ticket_id) == ("waiting_human", "question")
    (report,) = await _router_reports(pool, ticket_id)
    assert report["kind"] == "report.question"
    assert report["thread_id"] == thread_id
    assert f"Question: {asked}" in report["text"]
    row = await pool.fetchrow(
        "SELECT status, question FROM reports WHERE ticket_id = $1", ticket_id
    )
    assert row is not None
    assert (row["status"], row["question"]) == ("question", asked)
    assert len(fake_llm.chat_requests) == 1


# -- 8. bad tool input -------------------------------------------------------------------


async def test_bad_tool_input_is_an_error_the_model_reads_and_the_worker_goes_on(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    # Another ticket's job (that ticket is closed, so no worker runs it).
    other_id, _ = await ticket(pool, device, workdir=str(tmp_path), title="someone else's")
    await pool.execute("UPDATE tickets SET state = 'completed' WHERE id = $1", other_id)
    foreign = await queue.submit(
        device.id, specs.Exec.shell("echo not yours"), ticket_id=other_id, origin="test"
    )
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCall("frobnicate", {"x": 1}),
                ToolCall("shell", "{not json"),
                ToolCall("job_output", {"job": foreign}),
                ToolCall("shell", {"command": "echo still here"}),
            ]
        ),
        report_reply("ready", "went on"),
    )
    async with workers_running(pool, queue, fake_llm, dsn):
        await _until_state(pool, ticket_id, "completed")
    unknown, bad_json, not_ours, shell = tool_results(fake_llm.chat_requests[-1])
    assert list(unknown) == ["error"]
    assert "no tool 'frobnicate'" in unknown["error"]
    assert list(bad_json) == ["error"]
    assert "not valid JSON" in bad_json["error"]
    assert not_ours == {"error": f"no job {foreign} in this ticket"}
    assert shell["output"] == "still here\n"
    (report,) = await _router_reports(pool, ticket_id)
    assert report["kind"] == "report.ready"


# -- 9. credentialed commands ------------------------------------------------------------


async def test_a_credentialed_shell_call_runs_its_program_directly_not_through_sh(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    """The device matches a credential's scope against the program it really runs, and
    ``sh -c "git push"`` runs sh: with credentials, the command becomes the program's own
    argv (quotes read as sh reads them). Without, it stays ``sh -c``. The http delivery
    needs no env_var."""
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    sub = tmp_path / "sub"
    sub.mkdir()
    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCall(
                    "shell",
                    {
                        "command": "echo pushed 'with care' \"(really)\"",
                        "cwd": "sub",
                        "credentials": [
                            {"name": "api-token", "delivery": "http"},
                            {"name": "gh", "delivery": "git_helper"},
                        ],
                    },
                ),
                ToolCall("shell", {"command": "echo a | tr a b"}),
            ]
        ),
        report_reply("ready", "ran both"),
    )
    async with workers_running(pool, queue, fake_llm, dsn):
        await _until_state(pool, ticket_id, "completed")
    direct, piped = tool_results(fake_llm.chat_requests[-1])
    assert direct["exit_code"] == 0, direct
    assert direct["output"] == "pushed with care (really)\n"
    assert piped["output"] == "b\n"
    execs = [ran for ran in device.ran if ran["kind"] == "exec"]
    assert [ran["argv"] for ran in execs] == [
        ["echo", "pushed", "with care", "(really)"],
        ["sh", "-c", "echo a | tr a b"],
    ]
    assert execs[0]["cwd"] == str(sub)
    assert execs[0]["credentials"] == [
        {"name": "api-token", "delivery": "http", "env_var": ""},
        {"name": "gh", "delivery": "git_helper", "env_var": ""},
    ]
    assert execs[1]["credentials"] == []
    # Stored and sent to the device as the http delivery.
    stored = await pool.fetchval(
        "SELECT spec FROM commands WHERE ticket_id = $1 AND kind = 'exec' ORDER BY seq LIMIT 1",
        ticket_id,
    )
    spec = specs.from_json("exec", json.loads(stored) if isinstance(stored, str) else stored)
    assert isinstance(spec, specs.Exec)
    sent = wire.command_message(
        command_id="cmd_x", seq=1, not_after=datetime.now(UTC), origin="test", spec=spec
    )
    assert list(sent.command.exec.argv) == ["echo", "pushed", "with care", "(really)"]
    assert [c.delivery for c in sent.command.credentials] == [
        pb.CredentialRef.DELIVERY_HTTP,
        pb.CredentialRef.DELIVERY_GIT_HELPER,
    ]


async def test_a_credentialed_pipeline_is_refused_with_what_to_do_instead(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    git = [{"name": "gh", "delivery": "git_helper"}]
    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCall(
                    "shell", {"command": "cd repo && git push origin HEAD", "credentials": git}
                ),
                ToolCall(
                    "shell", {"command": "git push origin HEAD | tee log", "credentials": git}
                ),
                ToolCall(
                    "shell",
                    {"command": "echo again", "credentials": [{"name": "x", "delivery": "env"}]},
                ),
            ]
        ),
        report_reply("ready", "gave up"),
    )
    async with workers_running(pool, queue, fake_llm, dsn):
        await _until_state(pool, ticket_id, "completed")
    chained, piped, no_env_var = tool_results(fake_llm.chat_requests[-1])
    assert list(chained) == ["error"]
    assert chained["error"].startswith("not run: the command contains '&'")
    assert piped["error"].startswith("not run: the command contains '|'")
    for refused in (chained, piped):
        assert "single program and its arguments" in refused["error"]
        assert "git push origin HEAD" in refused["error"]
        assert "cwd" in refused["error"]
    assert "env delivery needs env_var" in no_env_var["error"]
    assert [ran for ran in device.ran if ran["kind"] == "exec"] == []  # nothing ran
    nothing = "SELECT count(*) FROM commands WHERE ticket_id = $1 AND kind = 'exec'"
    assert await pool.fetchval(nothing, ticket_id) == 0


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        ("git push origin HEAD", ["git", "push", "origin", "HEAD"]),
        (
            "git push -q origin HEAD:refs/heads/tkt_1",
            ["git", "push", "-q", "origin", "HEAD:refs/heads/tkt_1"],
        ),
        (
            "git commit -m 'costs $5 (*not* ~much); a|b'",
            ["git", "commit", "-m", "costs $5 (*not* ~much); a|b"],
        ),
        (
            'gh pr create --title "fix \\"add\\" (again)"',
            ["gh", "pr", "create", "--title", 'fix "add" (again)'],
        ),
        ("curl https://api.example.com/x?y=1", None),
        ("git push origin HEAD; rm -rf .", None),
        ("git push origin HEAD && echo ok", None),
        ("git push origin HEAD > log", None),
        ("git push < /dev/null", None),
        ("git push $(git remote)", None),
        ("git push `git remote`", None),
        ('git push origin "$BRANCH"', None),
        ("git push origin ${BRANCH}", None),
        ("git add *.py", None),
        ("git -C ~/app push", None),
        ("(git push)", None),
        ("git push & wait", None),
        ("GIT_TRACE=1 git push", None),
        ("git push origin HEAD # and tags", None),
        ("git push origin HEAD\ngit push --tags", None),
        ("cd app", None),
        ("export TOKEN", None),
        ("git push 'unterminated", None),
    ],
)
def test_what_a_credentialed_command_may_be(command: str, argv: list[str] | None) -> None:
    if argv is not None:
        assert shell_syntax.program_argv(command) == argv
    else:
        with pytest.raises(Refused, match="not run: "):
            shell_syntax.program_argv(command)


def test_the_shell_tool_tells_the_model_about_credentialed_commands() -> None:
    (shell,) = [t for t in TOOL_SPECS if t["function"]["name"] == "shell"]
    described = shell["function"]["description"]
    assert "one program with its arguments" in described
    assert "git push origin HEAD" in described
    credentials = shell["function"]["parameters"]["properties"]["credentials"]
    assert credentials["items"]["properties"]["delivery"]["enum"] == [
        "env",
        "file",
        "git_helper",
        "http",
    ]
    assert "http" in credentials["description"]
