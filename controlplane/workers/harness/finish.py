"""After a harness run: check the workspace, and deliver what it holds.

* The tests the repository names (``.superagent/config``, ``[checks] test``) run in the
  workspace like any command; a failure goes back to the harness (``harness_fix_rounds``),
  then ends the ticket blocked with the failure.
* What the harness left uncommitted is committed (``git add -A``; a message from the
  ticket), then the commits no remote has are pushed to the ticket's branch (or the pull
  request's, for work on an existing one), with the credential the repository names for
  pushes, delivered by the device's git helper.
* The pull request is opened, or found (a ticket has one), through the worker's own
  ``open_pull_request``; the report goes the normal way.

Each step is recorded in the ticket's session as a call of the round's, with its
result, so the console shows what happened after the harness's own events. The push and the
pull request pass the same hold as the built-in worker's (:mod:`controlplane.tickets.authority`):
right after input without authority, they wait for the requester.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from controlplane.gateway import specs
from controlplane.tickets import output
from controlplane.workers import session
from controlplane.workers.harness.streams import Tally
from controlplane.workers.tools.core import Outcome
from superagent_shared.ids import new_id

if TYPE_CHECKING:
    from controlplane.workers.harness.rounds import HarnessRound

GIT_SECONDS = 120.0
TEST_SECONDS = 1800.0
SUMMARY_CHARS = 4000
COMMIT = (
    "git add -A && if git diff --cached --quiet; then echo 'nothing to commit'; "
    "else git commit -q -F - && echo committed; fi"
)
# Commits on HEAD that no remote-tracking branch has: the work still to push.
UNPUSHED = ["git", "rev-list", "--count", "HEAD", "--not", "--remotes"]


async def _act(
    round_: HarnessRound,
    convo: session.WorkerSession,
    name: str,
    arguments: dict[str, Any],
    spec: specs.Spec | None,
    wait: float,
) -> dict[str, Any]:
    """One step of the round's, recorded as a tool call with its result: ``spec`` run
    on the device (waiting up to ``wait``), or the worker tool ``name`` when ``spec`` is
    None."""
    call_id = new_id("sup")
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }
    await convo.add(round_.pool, {"role": "assistant", "content": None, "tool_calls": [call]})
    toolbox = round_.toolbox
    if spec is None:
        answer = await toolbox.call(name, json.dumps(arguments), call_id)
    else:
        result = await toolbox.run(
            spec, wait, call_id=call_id, script=arguments.get("command", name)
        )
        answer = output.describe(result)
        answer["ok"] = result.ok
    await convo.add(
        round_.pool,
        {
            "role": "tool",
            "tool_call_id": call_id,
            "content": json.dumps(answer, default=str)[:8000],
        },
    )
    return answer


def _text(answer: dict[str, Any]) -> str:
    return str(answer.get("output") or answer.get("output_head") or answer.get("error") or "")


async def check_tests(round_: HarnessRound, convo: session.WorkerSession) -> str | None:
    """The repository's tests' failure output, or None (they passed, or it names none)."""
    command = round_.config.test
    if not command:
        return None
    answer = await _act(
        round_,
        convo,
        "shell",
        {"command": command},
        specs.Exec.shell(command, cwd=round_.ticket.workdir or ""),
        TEST_SECONDS,
    )
    if answer.get("ok"):
        return None
    return _text(answer)[-4000:] or f"`{command}` failed ({answer.get('state')})"


async def deliver(round_: HarnessRound, convo: session.WorkerSession, tally: Tally) -> str:
    """Commit, push, open the pull request and report ready; or say what stopped it."""
    ticket = round_.ticket
    said = (tally.result_text or tally.last_message or "").strip()
    summary = said[:SUMMARY_CHARS] or f"{round_.harness} finished without a summary."
    if ticket.in_place or not ticket.branch:
        return await round_.worker.final(ticket, {"status": "ready", "summary": summary})
    round_.toolbox.outcome = Outcome()
    cwd = ticket.workdir or ""
    message = f"{ticket.title}\n\n{round_.harness} for {ticket.id}.\n"
    committed = await _act(
        round_,
        convo,
        "shell",
        {"command": "git add -A && git commit"},
        specs.Exec.shell(COMMIT, cwd=cwd, stdin=message.encode()),
        GIT_SECONDS,
    )
    if not committed.get("ok"):
        return await _blocked(round_, "the supervisor could not commit the work", committed)
    counted = await _act(
        round_,
        convo,
        "shell",
        {"command": " ".join(UNPUSHED)},
        specs.Exec(argv=UNPUSHED, cwd=cwd),
        GIT_SECONDS,
    )
    unpushed = _text(counted).strip()
    if counted.get("ok") and unpushed == "0":
        pr = await round_.pool.fetchval("SELECT pr_url FROM tickets WHERE id = $1", ticket.id)
        note = "" if pr else " (no change to the repository, so no pull request)"
        return await round_.worker.final(
            ticket, {"status": "ready", "summary": summary + note, "pr_url": pr}
        )
    pushed = await _push(round_, convo)
    if isinstance(pushed, str):
        return pushed
    opened = await _act(
        round_,
        convo,
        "open_pull_request",
        {
            "title": ticket.title,
            "body": f"{summary}\n\n---\nWorked by {round_.harness} for {ticket.id}.",
        },
        None,
        0,
    )
    if round_.toolbox.outcome.held_by is not None:
        return await _held(round_)
    url = opened.get("pull_request")
    if opened.get("error"):
        return await _blocked(round_, "the pull request could not be opened", opened)
    return await round_.worker.final(
        ticket, {"status": "ready", "summary": summary, "pr_url": url or None}
    )


async def _push(round_: HarnessRound, convo: session.WorkerSession) -> str | None:
    """Push the branch; None when done, else the round's outcome."""
    ticket = round_.ticket
    remote, ref = "origin", f"refs/heads/{ticket.branch}"
    if ticket.upstream and "/" in ticket.upstream:
        remote, branch = ticket.upstream.split("/", 1)
        ref = f"refs/heads/{branch}"
    argv = ["git", "push", "-q", remote, f"HEAD:{ref}"]
    credential = round_.config.push_credential
    args: dict[str, Any] = {"command": " ".join(argv)}
    uses: list[specs.CredentialRef] = []
    if credential:
        args["credentials"] = [{"name": credential, "delivery": "git_helper"}]
        uses = [specs.credential(credential, "git_helper")]
    held = await round_.toolbox.held("shell", args)
    if held is not None:
        if round_.toolbox.outcome.held_by is not None:
            return await _held(round_)
        return await _blocked(round_, "the push was refused", held)
    pushed = await _act(
        round_,
        convo,
        "shell",
        args,
        specs.Exec(argv=argv, cwd=ticket.workdir or "", credentials=uses),
        GIT_SECONDS,
    )
    if not pushed.get("ok"):
        return await _blocked(round_, f"the supervisor could not push to {remote} {ref}", pushed)
    return None


async def _held(round_: HarnessRound) -> str:
    return await round_.worker.await_confirmation(round_.ticket, round_.toolbox.outcome)


async def _blocked(round_: HarnessRound, what: str, answer: dict[str, Any]) -> str:
    detail = _text(answer)[-1500:].strip()
    return await round_.worker.final(
        round_.ticket,
        {"status": "blocked", "summary": what + (f": {detail}" if detail else "")},
    )
