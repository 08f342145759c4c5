"""The worker's tools. They run on the ticket's device through the gateway, or on the
ticket itself (report, subscriptions, recall); authority is enforced here.

Asynchronous ReAct: ``shell`` waits at most ``foreground_seconds``; a command still running
then becomes a background job, and its completion reaches the worker later as an event, so
a long build never blocks the session and the worker can do other things meanwhile.
Every tool answers with JSON the model reads; a mistake is an ``error`` it can act on,
never an exception.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import re
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import asyncpg

from controlplane.domain import CommandState, EffectKind
from controlplane.effects.outbox import enqueue
from controlplane.errors import SuperagentError
from controlplane.gateway import specs
from controlplane.gateway.queue import CommandQueue, CommandResult
from controlplane.ingest import inbox
from controlplane.llm import transcript
from controlplane.llm.schema import arguments_problem, specs_by_name
from controlplane.router.tools import (
    Refused,
    recall_thread,
    recall_ticket,
    recall_trigger,
    tool_spec,
)
from controlplane.settings import WorkerSettings
from controlplane.tickets import authority, output, reports
from controlplane.workers.devices import device_online
from superagent_shared.ids import id_prefix

FILE_WAIT_SECONDS = 30.0  # file operations are quick on a connected device
PR_WAIT_SECONDS = 30.0  # how long open_pull_request waits for the outbox to open it
MAX_WRITE_BYTES = 5_000_000
STATUSES = ("progress", "ready", "question", "blocked", "failed")
FINAL_STATUSES = frozenset({"ready", "question", "blocked", "failed"})


_STR = {"type": "string"}
_INT = {"type": "integer"}
_CREDENTIALS = {
    "type": "array",
    "description": "Credentials the device injects by name (you never see values): "
    "env (into env_var), file (a 0600 file whose path is in env_var), git_helper (git "
    "authenticates with it over https; env_var: the git username, optional) or http (the "
    "device adds it to the command's HTTPS requests to the credential's hosts; nothing "
    "reaches the command; no env_var). The device's owner decides which programs may use "
    "each credential; a command given credentials runs as one program, not through sh.",
    "items": {
        "type": "object",
        "properties": {
            "name": _STR,
            "delivery": {"type": "string", "enum": list(specs.DELIVERIES)},
            "env_var": _STR,
        },
        "required": ["name", "delivery"],
        "additionalProperties": False,
    },
}
TOOL_SPECS: list[Any] = [
    tool_spec(
        "shell",
        "Run a shell command on the device (sh -c, in the ticket's directory). Waits a few "
        "seconds; a longer command becomes a background job whose completion arrives later "
        "as an event. Use job_output and stop on jobs. With credentials there is no shell: "
        "the device checks the credential against the program actually run, so the command "
        "must be a single program with its arguments (e.g. git push origin HEAD), without "
        "pipes, redirects, &&, ;, $(...), globs, variables or cd (use cwd); do other steps "
        "in separate calls without credentials.",
        {
            "command": _STR,
            "cwd": {**_STR, "description": "Directory; default: the ticket's working directory."},
            "timeout_seconds": {**_INT, "description": "Kill it after this long (0: none)."},
            "credentials": _CREDENTIALS,
        },
        ["command"],
    ),
    tool_spec(
        "job_output",
        "Read a job's state and a slice of its output.",
        {"job": _STR, "offset": _INT, "limit": _INT},
        ["job"],
    ),
    tool_spec("stop", "Stop a running job.", {"job": _STR}, ["job"]),
    tool_spec(
        "read_file",
        "Read a file on the device (relative paths: from the working directory).",
        {"path": _STR, "offset": _INT, "limit": _INT},
        ["path"],
    ),
    tool_spec(
        "write_file",
        "Write a whole file on the device (parents are created).",
        {"path": _STR, "content": _STR},
        ["path", "content"],
    ),
    tool_spec(
        "list_dir",
        "List a directory on the device.",
        {"path": _STR, "depth": _INT},
        ["path"],
    ),
    tool_spec(
        "apply_patch",
        "Apply a unified diff in the working directory. All or nothing: on a conflict "
        "nothing changes and the error says where.",
        {"patch": _STR, "cwd": _STR},
        ["patch"],
    ),
    tool_spec(
        "open_pull_request",
        "Open a pull request from a pushed branch (idempotent: the open one from the same "
        "branch is returned). Its thread is then handled by this ticket.",
        {"title": _STR, "body": _STR, "head": _STR, "base": _STR, "repo": _STR},
        ["title", "body"],
    ),
    tool_spec(
        "report",
        "Report to the people who asked. progress: a note on record. ready: done (with the "
        "PR, if any). question: you need an answer. blocked / failed: you cannot go on. "
        "Any status but progress ends your turn. A speculative ticket must set reproduced "
        "and fixed when ready.",
        {
            "status": {"type": "string", "enum": list(STATUSES)},
            "summary": _STR,
            "question": _STR,
            "pr_url": _STR,
            "reproduced": {"type": "boolean"},
            "fixed": {"type": "boolean"},
        },
        ["status", "summary"],
    ),
    tool_spec(
        "subscribe",
        "Handle a thread: its events come to you.",
        {"thread": _STR},
        ["thread"],
    ),
    tool_spec("unsubscribe", "Stop handling a thread.", {"thread": _STR}, ["thread"]),
    tool_spec(
        "hand_back",
        "Give an event back that is not this ticket's business (the router decides on it).",
        {"trigger": _STR},
        ["trigger"],
    ),
    tool_spec(
        "recall",
        "Fetch an object by id (trg_, thr_, tkt_, a job's cmd_, or msg_: a message of this "
        "ticket's session, such as a tool output the context shows reduced). offset and "
        "limit: the slice of a job's output or a message's text.",
        {"id": _STR, "offset": _INT, "limit": _INT},
        ["id"],
    ),
]
TOOL_NAMES = frozenset(spec["function"]["name"] for spec in TOOL_SPECS)
TOOL_SCHEMAS = specs_by_name(TOOL_SPECS)


@dataclass(frozen=True)
class Ticket:
    """What a worker's tools need to know about its ticket."""

    id: str
    title: str
    device_id: str | None
    device_name: str | None
    repo: str | None
    workdir: str | None
    branch: str | None
    speculative: bool


@dataclass
class Outcome:
    """What a step's tool calls changed for the loop."""

    report: dict[str, Any] | None = None  # a final report to apply (the round ends)
    device_away: bool = False  # a command is queued for a device that is not connected
    # Calls not run for lack of authority (authority.external), and the input behind it:
    # the round ends and the ticket waits for people to confirm.
    held: list[str] = field(default_factory=list)
    held_by: authority.Untrusted | None = None


def _arg(args: dict[str, Any], name: str, *, required: bool = True, limit: int = 200_000) -> str:
    value = args.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise Refused(f"{name} must be a non-empty string")
    if len(value) > limit:
        raise Refused(f"{name} is longer than {limit} characters")
    return value


def _int(args: dict[str, Any], name: str, default: int, *, low: int = 0, high: int) -> int:
    value = args.get(name, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise Refused(f"{name} must be an integer from {low} to {high}")
    return value


def _credentials(raw: object) -> list[specs.CredentialUse]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise Refused("credentials must be a list of {name, delivery, env_var}")
    uses = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise Refused("each credential needs a name")
        delivery = item.get("delivery", "env")
        if delivery not in specs.DELIVERIES:
            raise Refused("delivery must be env, file, git_helper or http")
        env_var = item.get("env_var") or ""
        if delivery in ("env", "file") and not env_var:
            raise Refused(f"credential {item['name']!r}: {delivery} delivery needs env_var")
        uses.append(specs.CredentialUse(item["name"], delivery, str(env_var)))
    return uses


# What sh would read as more than one program and its arguments: operators, expansions,
# globs, comments. A credentialed command is run without a shell, so it must have none.
_OPERATORS = frozenset("|&;<>()")
_EXPANSIONS = frozenset("$`")
_GLOBS = frozenset("*?[")
_SPECIAL = _OPERATORS | _EXPANSIONS | _GLOBS
_WORD_START = frozenset("~#")  # a home directory or a comment, at the start of a word
# Words sh runs itself (keywords and builtins): not programs the device can run.
_SHELL_WORDS = frozenset(
    {"!", "{", "}", ".", ":", "alias", "case", "cd", "eval", "exec", "export", "for"}
    | {"function", "if", "pushd", "read", "set", "source", "ulimit", "umask", "unset"}
    | {"until", "while"}
)
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _shell_syntax(command: str) -> str | None:
    """The first thing in ``command`` that only a shell would understand, or None.

    Quotes are read as sh reads them: inside single quotes nothing is special; inside
    double quotes ``$`` and backticks still expand.
    """
    quote = ""
    word_start = True
    i = 0
    while i < len(command):
        c = command[i]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif quote == '"':
            # Only what sh and shlex both read the same way: \" and \\ (sh would also
            # take \$, \` and a continued line, which shlex keeps as written).
            if c == "\\" and command[i + 1 : i + 2] in ('"', "\\"):
                i += 1
            elif c == "\\" and command[i + 1 : i + 2] == "\n":
                return "a line break"
            elif c == '"':
                quote = ""
            elif c in _EXPANSIONS:
                return c
        elif c in " \t":
            word_start = True
            i += 1
            continue
        elif c in "\n\r":
            return "a line break"
        elif c == "\\":
            if command[i + 1 : i + 2] in ("\n", ""):
                return "a line break" if command[i + 1 : i + 2] else "a trailing backslash"
            i += 1
        elif c in "'\"":
            quote = c
        elif c in _SPECIAL or (word_start and c in _WORD_START):
            return c
        word_start = False
        i += 1
    return None


def _program_argv(command: str) -> list[str]:
    """``command`` as the argv of one program (a credentialed shell call runs no shell)."""
    rule = (
        "a command given credentials runs as one program with its arguments, not through "
        "sh (the device checks the credential against the program actually run): write a "
        "single program and its arguments, e.g. git push origin HEAD, without pipes, "
        "redirects, &&, ;, $(...), backticks, globs, ~, variables or NAME=value, and use "
        "cwd instead of cd; run any other step in its own shell call without credentials"
    )
    found = _shell_syntax(command)
    if found is not None:
        shown = found if len(found) > 1 else repr(found)
        raise Refused(f"not run: the command contains {shown}; {rule}")
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise Refused(f"not run: the command cannot be split into words ({exc}); {rule}") from None
    if not argv:
        raise Refused(f"not run: the command is empty; {rule}")
    if _ASSIGNMENT.match(argv[0]):
        raise Refused(f"not run: the command starts with an assignment ({argv[0]!r}); {rule}")
    if argv[0] in _SHELL_WORDS:
        raise Refused(f"not run: {argv[0]!r} is part of the shell, not a program; {rule}")
    return argv


class WorkerToolbox:
    def __init__(
        self,
        pool: asyncpg.Pool,
        queue: CommandQueue,
        settings: WorkerSettings,
        ticket: Ticket,
    ) -> None:
        self.pool = pool
        self.queue = queue
        self.settings = settings
        self.ticket = ticket
        self.outcome = Outcome()

    async def call(self, name: str, arguments: str | None, call_id: str) -> dict[str, Any]:
        try:
            try:
                args = json.loads(arguments or "{}")
            except json.JSONDecodeError as exc:
                raise Refused(f"arguments are not valid JSON: {exc.msg}") from None
            if not isinstance(args, dict):
                raise Refused("arguments must be a JSON object")
            if name not in TOOL_NAMES:
                raise Refused(f"no tool {name!r}; the tools are {', '.join(sorted(TOOL_NAMES))}")
            problem = arguments_problem(name, args, TOOL_SCHEMAS)
            if problem is not None:
                raise Refused(problem)  # the schema it was shown: it can correct itself
            handler: Callable[[dict[str, Any], str], Awaitable[dict[str, Any]]] = getattr(
                self, f"_{name}"
            )
            held = await self._hold(name, args)
            return held if held is not None else await handler(args, call_id)
        except Refused as refused:
            return {"error": str(refused)}
        except SuperagentError as exc:
            return {"error": str(exc)}

    async def _hold(self, name: str, args: dict[str, Any]) -> dict[str, Any] | None:
        """The answer to a call held for lack of authority, or None to run it."""
        what = authority.external(name, args)
        if what is None:
            return None
        reason = await authority.untrusted(self.pool, self.ticket.id, self.settings.hold_untrusted)
        if reason is None:
            return None
        if self.ticket.speculative:
            # A speculative ticket says nothing to anyone, so it cannot ask: refused.
            raise Refused(
                f"not run: you want to {what} right after reading {reason.trigger_id} "
                f"({reason.authority}), and this speculative ticket cannot ask anyone to "
                "confirm; work on the device until you can report a confirmed fix"
            )
        self.outcome.held.append(what)
        self.outcome.held_by = reason
        asked = await authority.requester(self.pool, self.ticket.id)
        return {
            "held": True,
            "note": authority.held_note(what, reason, asked.name or "the requester"),
        }

    # -- on the device -------------------------------------------------------------------

    def _path(self, path: str) -> str:
        if posixpath.isabs(path) or not self.ticket.workdir:
            return path
        return posixpath.join(self.ticket.workdir, path)

    def _device(self) -> str:
        if self.ticket.device_id is None:
            raise Refused("this ticket has no device; report a question asking which one")
        return self.ticket.device_id

    async def _online(self) -> bool:
        return await device_online(self.pool, self._device())

    async def _run(
        self, spec: specs.Spec, wait: float, *, call_id: str, script: str
    ) -> CommandResult:
        command_id = await self.queue.submit(
            self._device(), spec, ticket_id=self.ticket.id, origin=f"worker {self.ticket.id}"
        )
        await self.pool.execute(
            "INSERT INTO jobs (command_id, ticket_id, tool_call_id, script) "
            "VALUES ($1, $2, $3, $4)",
            command_id,
            self.ticket.id,
            call_id,
            script[:2000],
        )
        result = await self.queue.wait(command_id, 0.05 if not await self._online() else wait)
        if not result.done:
            # Its completion becomes an event for this worker (events.take).
            await self.pool.execute(
                "UPDATE jobs SET background = true WHERE command_id = $1", command_id
            )
            if result.state == CommandState.QUEUED and not await self._online():
                self.outcome.device_away = True
        return result

    def _pending(self, result: CommandResult) -> dict[str, Any]:
        described = output.describe(result)
        if self.outcome.device_away:
            described["note"] = (
                f"the device {self.ticket.device_name or ''} is offline: this stays queued and "
                "runs when it reconnects; its result arrives as an event"
            )
        elif "note" not in described:
            described["note"] = (
                "still running as a background job; its completion arrives as an event "
                "(job_output to look, stop to end it)"
            )
        return described

    async def _shell(self, args: dict[str, Any], call_id: str) -> dict[str, Any]:
        command = _arg(args, "command", limit=100_000)
        cwd = _arg(args, "cwd", required=False) or self.ticket.workdir or ""
        credentials = _credentials(args.get("credentials"))
        # Credential scopes match the program actually run, and `sh -c "git push"` runs sh:
        # with credentials, the command is the program's own argv.
        argv = _program_argv(command) if credentials else ["sh", "-c", command]
        spec = specs.Exec(
            argv=argv,
            cwd=self._path(cwd) if cwd else "",
            timeout_seconds=_int(args, "timeout_seconds", 0, high=7 * 24 * 3600),
            credentials=credentials,
        )
        result = await self._run(
            spec, self.settings.foreground_seconds, call_id=call_id, script=command
        )
        return output.describe(result) if result.done else self._pending(result)

    async def _job(self, args: dict[str, Any]) -> str:
        job = _arg(args, "job", limit=100)
        owned = await self.pool.fetchval(
            "SELECT 1 FROM commands WHERE id = $1 AND ticket_id = $2", job, self.ticket.id
        )
        if not owned:
            raise Refused(f"no job {job} in this ticket")
        return job

    async def _job_output(self, args: dict[str, Any], call_id: str) -> dict[str, Any]:
        job = await self._job(args)
        offset = _int(args, "offset", 0, high=1 << 40)
        limit = _int(args, "limit", 8000, low=1, high=64_000)
        result = await self.queue.result(job)
        data = await self.queue.output(job, offset, limit)
        described = {k: v for k, v in output.describe(result).items() if "output" not in k}
        described.pop("read_more", None)
        described.pop("omitted_bytes", None)
        end = offset + len(data)
        return {
            **described,
            "offset": offset,
            "output": data.decode("utf-8", errors="replace"),
            "size": result.output_size,
            **({"next_offset": end} if end < result.output_size else {}),
        }

    async def _stop(self, args: dict[str, Any], call_id: str) -> dict[str, Any]:
        job = await self._job(args)
        result = await self.queue.cancel(job, grace_seconds=5)
        return {"job": job, "state": result.state, "note": "stopping" if not result.done else ""}

    async def _file_op(self, spec: specs.Spec, call_id: str) -> CommandResult:
        return await self._run(spec, FILE_WAIT_SECONDS, call_id=call_id, script=spec.kind)

    async def _read_file(self, args: dict[str, Any], call_id: str) -> dict[str, Any]:
        path = self._path(_arg(args, "path", limit=4096))
        offset = _int(args, "offset", 0, high=1 << 40)
        limit = _int(args, "limit", 64_000, low=1, high=1_000_000)
        result = await self._file_op(specs.ReadFile(path, offset, limit), call_id)
        if not result.done:
            return self._pending(result)
        if not result.ok:
            return {"path": path, "error": result.error or result.refusal_reason or result.state}
        described = output.inline(
            result.output_head, result.output_tail, result.output_size, result.id
        )
        return {"path": path, "offset": offset, **described}

    async def _write_file(self, args: dict[str, Any], call_id: str) -> dict[str, Any]:
        path = self._path(_arg(args, "path", limit=4096))
        content = _arg(args, "content", required=False, limit=MAX_WRITE_BYTES).encode()
        spec = specs.WriteFile(path, content, create_parents=True)
        result = await self._file_op(spec, call_id)
        if not result.done:
            return self._pending(result)
        if not result.ok:
            return {"path": path, "error": result.error or result.refusal_reason or result.state}
        return {"path": path, "written_bytes": len(content)}

    async def _list_dir(self, args: dict[str, Any], call_id: str) -> dict[str, Any]:
        path = self._path(_arg(args, "path", limit=4096))
        depth = _int(args, "depth", 1, low=1, high=5)
        result = await self._file_op(specs.ListDir(path, depth), call_id)
        if not result.done:
            return self._pending(result)
        if not result.ok:
            return {"path": path, "error": result.error or result.refusal_reason or result.state}
        return {
            "path": path,
            **output.inline(result.output_head, result.output_tail, result.output_size, result.id),
        }

    async def _apply_patch(self, args: dict[str, Any], call_id: str) -> dict[str, Any]:
        patch = _arg(args, "patch", limit=MAX_WRITE_BYTES)
        cwd = _arg(args, "cwd", required=False) or self.ticket.workdir or ""
        # git apply is all or nothing, and works outside a repository too (like patch).
        spec = specs.Exec(
            argv=["git", "apply", "--verbose", "--whitespace=nowarn", "-"],
            cwd=self._path(cwd) if cwd else "",
            stdin=patch.encode() if patch.endswith("\n") else (patch + "\n").encode(),
        )
        result = await self._run(spec, FILE_WAIT_SECONDS, call_id=call_id, script="apply_patch")
        if not result.done:
            return self._pending(result)
        described = output.describe(result)
        if result.ok:
            return {"applied": True, **{k: v for k, v in described.items() if "output" in k}}
        return {
            "applied": False,
            "error": "the patch does not apply; nothing was changed",
            **{k: v for k, v in described.items() if k not in ("state",)},
        }

    # -- on the ticket -------------------------------------------------------------------

    async def _open_pull_request(self, args: dict[str, Any], call_id: str) -> dict[str, Any]:
        if self.ticket.speculative:
            raise Refused(
                "this ticket is speculative: nothing is delivered until you report ready with "
                "reproduced=true and fixed=true; then you may open the pull request"
            )
        repo = _arg(args, "repo", required=False, limit=300) or self.ticket.repo
        if not repo or "/" not in repo:
            raise Refused("name the repository (owner/name): this ticket has none")
        head = _arg(args, "head", required=False, limit=300) or self.ticket.branch
        if not head:
            raise Refused("name the branch (head) you pushed")
        payload = {
            "repo": repo,
            "head": head,
            "base": _arg(args, "base", required=False, limit=300) or "main",
            "title": _arg(args, "title", limit=300),
            "body": _arg(args, "body", required=False, limit=60_000),
            "ticket_id": self.ticket.id,
        }
        async with self.pool.acquire() as conn:
            # One pull request per ticket and branch, however often this is called.
            await enqueue(conn, EffectKind.OPEN_PULL_REQUEST, f"{self.ticket.id}:{head}", payload)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PR_WAIT_SECONDS
        while loop.time() < deadline:
            url = await self.pool.fetchval(
                "SELECT pr_url FROM tickets WHERE id = $1", self.ticket.id
            )
            if url:
                return {"pull_request": url, "head": head, "base": payload["base"]}
            await asyncio.sleep(0.2)
        return {
            "pull_request": None,
            "note": "queued; GitHub has not answered yet. The URL arrives as an event.",
        }

    async def _report(self, args: dict[str, Any], call_id: str) -> dict[str, Any]:
        status = _arg(args, "status", limit=20)
        if status not in STATUSES:
            raise Refused(f"status must be one of {', '.join(STATUSES)}")
        summary = _arg(args, "summary", limit=20_000)
        question = _arg(args, "question", required=False, limit=5000) or None
        if status == "question" and not question:
            raise Refused("a question report needs the question")
        report = {
            "status": status,
            "summary": summary,
            "question": question,
            "pr_url": _arg(args, "pr_url", required=False, limit=2000) or None,
            "reproduced": args.get("reproduced") is True,
            "fixed": args.get("fixed") is True,
        }
        confirmed = report["reproduced"] and report["fixed"]
        if self.ticket.speculative and status == "ready" and confirmed:
            await reports.confirm_speculative(self.pool, self.ticket.id, summary)
            self.ticket = replace(self.ticket, speculative=False)
            return {
                "confirmed": True,
                "note": "reproduction and fix confirmed: your result is delivered now. "
                "Push the branch and open the pull request (open_pull_request), then "
                "report ready again.",
            }
        if status in FINAL_STATUSES and self.outcome.held:
            raise Refused(
                "not reported: a call in this step is held for confirmation, so the ticket "
                "waits for people; report once it is answered"
            )
        if status in FINAL_STATUSES:
            self.outcome.report = report
            return {"reported": status, "note": "your turn ends here"}
        self.outcome.report = None
        await reports.record_progress(self.pool, self.ticket.id, summary)
        return {"reported": "progress"}

    async def _thread(self, args: dict[str, Any]) -> str:
        thread = _arg(args, "thread", limit=100)
        if id_prefix(thread) != "thr" or not await self.pool.fetchval(
            "SELECT 1 FROM threads WHERE id = $1", thread
        ):
            raise Refused(f"no thread {thread}")
        return thread

    async def _subscribe(self, args: dict[str, Any], call_id: str) -> dict[str, Any]:
        thread = await self._thread(args)
        await self.pool.execute(
            "INSERT INTO subscriptions (thread_id, ticket_id) VALUES ($1, $2) "
            "ON CONFLICT DO NOTHING",
            thread,
            self.ticket.id,
        )
        return {"subscribed": thread}

    async def _unsubscribe(self, args: dict[str, Any], call_id: str) -> dict[str, Any]:
        thread = await self._thread(args)
        await self.pool.execute(
            "DELETE FROM subscriptions WHERE thread_id = $1 AND ticket_id = $2",
            thread,
            self.ticket.id,
        )
        return {"unsubscribed": thread}

    async def _hand_back(self, args: dict[str, Any], call_id: str) -> dict[str, Any]:
        trigger = _arg(args, "trigger", limit=100)
        try:
            where = await inbox.hand_back(self.pool, self.ticket.id, trigger)
        except SuperagentError as exc:
            raise Refused(str(exc)) from None
        return {"handed_back": trigger, "now": where}

    async def _recall(self, args: dict[str, Any], call_id: str) -> dict[str, Any]:
        object_id = _arg(args, "id", limit=100)
        prefix = id_prefix(object_id)
        if prefix == "cmd":
            return await self._job_output(
                {"job": object_id, **{k: v for k, v in args.items() if k in ("offset", "limit")}},
                call_id,
            )
        if prefix == "msg":
            return await self._recall_message(object_id, args)
        recall = {"trg": recall_trigger, "thr": recall_thread, "tkt": recall_ticket}.get(
            prefix or ""
        )
        if recall is None:
            raise Refused(f"recall takes a trg_, thr_, tkt_, cmd_ or msg_ id, not {object_id!r}")
        async with self.pool.acquire() as conn:
            found = await recall(conn, object_id)
        if found is None:
            raise Refused(f"nothing with id {object_id}")
        return found

    async def _recall_message(self, message_id: str, args: dict[str, Any]) -> dict[str, Any]:
        """A slice of a message of this ticket's sessions (what compaction reduced)."""
        offset = _int(args, "offset", 0, high=1 << 40)
        limit = _int(args, "limit", 8000, low=1, high=64_000)
        row = await self.pool.fetchrow(
            "SELECT m.role, m.content FROM session_messages m "
            "JOIN sessions s ON s.id = m.session_id WHERE m.id = $1 AND s.ticket_id = $2",
            message_id,
            self.ticket.id,
        )
        if row is None:
            raise Refused(f"no message {message_id} in this ticket's session")
        message = transcript.message_content(row["content"]).get("message") or {}
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        end = min(len(text), offset + limit)
        return {
            "id": message_id,
            "role": row["role"],
            "offset": offset,
            "content": text[offset:end],
            "size": len(text),
            **({"next_offset": end} if end < len(text) else {}),
        }
