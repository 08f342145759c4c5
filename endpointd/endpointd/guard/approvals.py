"""Local approvals: commands an ``ask`` rule holds until the owner of this machine answers.

This module owns the queue, ``<state dir>/approvals/``: one JSON file per request (named
by a hash of the command id, since ids come from the server and must not pick file names),
written by the daemon (:meth:`Approvals.request`, :meth:`Approvals.forget`) and answered by
the CLI (:meth:`Approvals.decide`, from `endpointd approve ID` / `endpointd deny ID`). The
daemon polls :meth:`Approvals.decision` (or awaits :meth:`Approvals.wait`) and enforces
the timeout itself; an unanswered request is denied.

What the owner is shown
-----------------------
A request holds everything that would run (:func:`describe`): the full argv, the cwd, the
exec.env names and values, a preview of stdin (its first 2 KiB as text, with its total
length and SHA-256), the credentials by name with how each is delivered, and for file
operations the path (and for write_file the content's length, SHA-256 and a preview).
Never a credential value: the daemon passes every text through its redactor first.
`endpointd approvals` wraps long text (:data:`WRAP_COLUMNS`) and cuts a field only with its
total length and SHA-256 and a pointer to `endpointd approvals --show ID`, which prints it
all. Everything shown (terminal, desktop notification) is escaped by :func:`printable`,
because the text comes from the control plane and must not be able to drive the terminal
(escape sequences) or hide part of itself (carriage returns, bidi controls); a real newline
is shown as ``\\n``, so every visible line break is a wrap.

Who may answer
--------------
Only the owner, through a channel no command can reach:

1. **The sandbox is the boundary.** Commands run under an OS sandbox that denies them the
   whole state dir, which holds this queue and its key: a sandboxed command can neither
   read a request nor write a decision.
2. **Decisions carry a MAC.** Each daemon start makes a fresh random key,
   ``approvals/.key`` (32 bytes, 0600, written to a new ``O_EXCL`` file then renamed over
   the old one; see :meth:`Approvals.renew_key`). The daemon seals each request it writes
   (HMAC-SHA256 over its content), and the CLI stores with each decision
   ``mac = HMAC-SHA256(key, command_id \\0 outcome \\0 requested_at \\0 decided_at)``.
   The daemon accepts a decision only with a valid MAC under the key it holds in memory
   (compared with :func:`hmac.compare_digest`); anything else (a decision file written by
   hand, a request file rewritten to show something else) is ignored, logged once and
   reported to the daemon, which writes ``forged_approval`` to the audit log, and the
   request is put back as it was, still waiting for the owner. A decision made under an
   earlier daemon's key is void: the restarted daemon asks again (keeping the deadline).
   The CLI only lists and answers requests sealed under the current key.
3. **`endpointd approve`/`deny` refuse to run under a command.** When one of its ancestor
   processes is an endpointd exec supervisor or zygote (its command line holds
   ``endpointd.process.supervisor``; see ``executor.supervisor_argv``/``zygote_argv``), the answer
   is refused (:func:`refuse_if_run_by_a_command`).

Layers 2 and 3 are defence in depth, and hold only in part when the owner sets
``sandbox = "off"``: an unconfined command runs as the owner, so it can read the key and
compute a valid MAC itself, and a process that leaves its supervisor's tree is no longer
its descendant (double fork and ``setsid``, then its supervisor, a child subreaper, exits
with the command, and the process is re-parented to init). They stop the obvious ways (a
command running `endpointd approve`, or writing a decision file), not a determined command
without a sandbox: the boundary is the sandbox's denial of the state dir, plus the MAC.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import json
import logging
import math
import os
import shlex
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from endpointd.errors import EndpointdError
from endpointd.fsutil import atomic_write, exclusive_lock
from endpointd.guard import daemon_programs
from endpointd.paths import ensure_private_dir
from superagent_shared.messages import (
    Command,
    CredentialRef,
    Delivery,
    Exec,
    Glob,
    HarnessExec,
    ListDir,
    PrepareWorkspace,
    ReadFile,
    ReleaseWorkspace,
    Search,
    WorkspaceBase,
    WriteFile,
)

APPROVALS_DIR = "approvals"
# The daemon's per-start key (see the module doc); a dot file, so never taken for a request.
KEY_FILE = ".key"
KEY_BYTES = 32
# Disables desktop notifications (tests, headless boxes where notify-send would fail noisily).
NO_NOTIFY_ENV = "ENDPOINTD_NO_NOTIFY"
# Requests left behind (e.g. the daemon died while one waited) are deleted this long after
# their deadline.
STALE_AFTER_SECONDS = 3600.0
NOTIFY_TIMEOUT_SECONDS = 30.0
# A request keeps this many characters of stdin and of write_file content (about 2 KiB).
PREVIEW_CHARS = 2048
# Bytes past the preview that are redacted with it, so that a secret (or an encoding of
# one) crossing the preview's end is still recognised and masked.
_REDACT_MARGIN_BYTES = 16384
# `endpointd approvals` wraps at this width, continuation lines indented under the value...
WRAP_COLUMNS = 100
# ... and shows at most this many rows of one field before pointing to `endpointd approvals
# --show ID`.
LISTED_ROWS = 12
# A desktop notification shows at most this much of the command.
NOTIFY_CHARS = 200
# In the command line of every exec supervisor and of the zygote (executor._BOOTSTRAP).
SUPERVISOR_MARK = b"endpointd.process.supervisor"
_SEAL_CONTEXT = b"endpointd approval request v1\0"
_LABEL = 9  # "command: "
_INDENT = 2 + _LABEL

log = logging.getLogger(__name__)

Outcome = Literal["approved", "denied"]


class ApprovalError(EndpointdError):
    """An approval cannot be given or refused (unknown id, already decided, timed out, not
    from the owner)."""


@dataclass(frozen=True)
class ApprovalRequest:
    command_id: str
    summary: str  # one line: argv, cwd, credential names; no secret values
    origin: str  # who asked, as the control plane says (carries no authority)
    rule: str  # the policy rule that asks
    requested_at: float  # unix time
    expires_at: float  # unix time; the daemon denies it then
    decision: Outcome | None = None
    decided_at: float | None = None
    # Everything that would run (see describe()); empty for a request made with a summary only.
    details: dict[str, Any] = field(default_factory=dict)
    seal: str = ""  # the daemon's HMAC over the fields above except the decision
    mac: str = ""  # the CLI's HMAC over the decision (see the module doc)

    @property
    def age_seconds(self) -> float:
        return max(0.0, time.time() - self.requested_at)

    @property
    def seconds_left(self) -> float:
        return max(0.0, self.expires_at - time.time())


# ---------------------------------------------------------------------------- escaping


def _escape_units(text: str) -> list[str]:
    """``text`` as display units: a printable character, or the escape standing for one."""
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        elif "\udc80" <= ch <= "\udcff":  # a byte that was not UTF-8 (surrogateescape)
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return out


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def printable(text: str, limit: int | None = 500) -> str:
    """``text`` safe to show on a terminal or in a notification: control characters (ANSI
    escapes, carriage returns, newlines) and backslashes escaped. Cut to ``limit``
    characters (None: never), and then it says so, with the full length and a hash."""
    shown = "".join(_escape_units(text))
    if limit is None or len(shown) <= limit:
        return shown
    return shown[:limit] + f"… [{len(text):,} chars, sha256 {_sha256(text)[:16]}…]"


# ---------------------------------------------------------------------------- describing


def first_line(text: str, limit: int = 120) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters (a prompt's gist)."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[:limit] + "…"


def summarize(command: Command) -> str:
    """One line describing ``command`` for an approval request (names, never values)."""
    op = command.op
    if isinstance(op, HarnessExec) and op.request is not None:
        # A harness run is the harness and its instruction; its argv is in the details.
        request = op.request
        parts = [f"run_harness {request.harness}: {json.dumps(first_line(request.prompt))}"]
        if request.resume_session:
            parts.append(f"resuming session {request.resume_session}")
        if op.cwd:
            parts.append(f"in {op.cwd}")
        return " ".join(parts)
    if isinstance(op, Exec):
        parts = [shlex.join(op.argv)]
        if op.cwd:
            parts.append(f"in {op.cwd}")
        if command.credentials:
            parts.append("with credentials " + ", ".join(c.name for c in command.credentials))
        return " ".join(parts)
    if isinstance(op, ReadFile | WriteFile | ListDir):
        return f"{op.KIND} {op.path}"
    if isinstance(op, Search | Glob):
        return f"{op.KIND} {op.pattern!r} in {op.path}"
    if isinstance(op, PrepareWorkspace):
        where = " ".join(w for w in (op.repo, f"at {op.path}" if op.path else "") if w)
        return f"prepare_workspace for {op.ticket_id}: {where}, {_base(op)}"
    if isinstance(op, ReleaseWorkspace):
        return f"release_workspace of {op.ticket_id}"
    return command.kind or "unknown command"


def _base(op: PrepareWorkspace) -> str:
    if op.base == WorkspaceBase.PULL_REQUEST:
        return f"from the pull request branch {op.ref}"
    if op.base == WorkspaceBase.LOCAL_CHANGES:
        return "from your uncommitted changes"
    return "from the freshly fetched default branch"


def delivery_label(ref: CredentialRef) -> str:
    """How a credential reaches the command: ``env VAR``, ``file VAR``, ``git helper``, …"""
    if ref.delivery == Delivery.ENV:
        return f"env {ref.env_var}"
    if ref.delivery == Delivery.FILE:
        return f"file {ref.env_var}"
    if ref.delivery == Delivery.GIT_HELPER:
        return "git helper" + (f" as user {ref.env_var}" if ref.env_var else "")
    try:
        name = Delivery(ref.delivery).name
    except ValueError:
        return f"delivery {int(ref.delivery)}"
    return name.lower().replace("_", " ")  # "http": a header


def _same(text: str) -> str:
    return text


def _blob(data: bytes, redact: Callable[[str], str]) -> dict[str, Any]:
    """Length, SHA-256 (of the bytes as sent) and a redacted text preview of ``data``."""
    head = data[: 4 * PREVIEW_CHARS + _REDACT_MARGIN_BYTES]
    text = redact(head.decode("utf-8", "surrogateescape"))
    return {
        "length": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "preview": text[:PREVIEW_CHARS],
        "complete": len(head) == len(data) and len(text) <= PREVIEW_CHARS,
    }


def describe(command: Command, redact: Callable[[str], str] = _same) -> dict[str, Any]:
    """Everything about ``command`` the owner should see before approving it, as JSON-ready
    data; every text passes ``redact`` (the daemon's redactor) first.

    exec: ``argv`` (list), ``cwd``, ``env`` (names and values: exec.env is non-secret by
    the protocol), ``stdin`` (None for /dev/null, else length, sha256, preview, complete),
    ``credentials`` (name and delivery). write_file: ``path``, ``content`` (as stdin),
    ``mode``, ``create_parents``, ``expected_sha256``. read_file: ``path``, ``offset``,
    ``limit``. list_dir: ``path``, ``depth``.
    """
    op = command.op
    out: dict[str, Any] = {"kind": command.kind or "unknown"}
    if isinstance(op, Exec):
        out["argv"] = [redact(arg) for arg in op.argv]
        out["cwd"] = redact(op.cwd)
        out["env"] = {redact(k): redact(v) for k, v in sorted(op.env.items())}
        out["stdin"] = _blob(op.stdin, redact) if op.stdin is not None else None
        out["credentials"] = [
            {"name": redact(ref.name), "delivery": redact(delivery_label(ref))}
            for ref in command.credentials
        ]
        if isinstance(op, HarnessExec) and op.request is not None:
            out["harness"] = redact(op.request.harness)
            out["prompt"] = redact(first_line(op.request.prompt))
            out["resume_session"] = redact(op.request.resume_session)
    elif isinstance(op, WriteFile):
        out["path"] = redact(op.path)
        out["content"] = _blob(op.content, redact)
        out["mode"] = op.mode
        out["create_parents"] = op.create_parents
        out["expected_sha256"] = (
            op.expected_sha256.hex() if op.expected_sha256 is not None else None
        )
    elif isinstance(op, ReadFile):
        out["path"] = redact(op.path)
        out["offset"] = op.offset
        out["limit"] = op.limit
    elif isinstance(op, ListDir):
        out["path"] = redact(op.path)
        out["depth"] = op.depth
    elif isinstance(op, Search | Glob):
        out["path"] = redact(op.path)
        out["pattern"] = redact(op.pattern)
    elif isinstance(op, PrepareWorkspace):
        out["ticket_id"] = redact(op.ticket_id)
        out["repo"] = redact(op.repo)
        if op.path:
            out["path"] = redact(op.path)
        out["base"] = _base(op)
        out["setup"] = op.setup
    return out


# ---------------------------------------------------------------------------- showing


class _Lines:
    """Renders a request's fields: label column, escaped text wrapped at WRAP_COLUMNS."""

    def __init__(self, command_id: str, full: bool) -> None:
        self.command_id = command_id
        self.full = full
        self.lines: list[str] = []
        self.room = max(20, WRAP_COLUMNS - _INDENT)

    def _emit(self, label: str, rows: list[str]) -> None:
        for i, row in enumerate(rows or [""]):
            head = f"  {label + ':':<{_LABEL}}" if i == 0 and label else " " * _INDENT
            self.lines.append(head + row if row else head.rstrip())

    def _wrap(self, units: list[str]) -> list[str]:
        """Rows of at most ``room`` characters, never splitting an escape; a row also ends
        after an (escaped, so still visible) newline."""
        rows: list[str] = []
        row = ""
        for unit in units:
            if row and len(row) + len(unit) > self.room:
                rows.append(row)
                row = ""
            row += unit
            if unit == "\\n":
                rows.append(row)
                row = ""
        if row or not rows:
            rows.append(row)
        return rows

    def note(self, label: str, text: str) -> None:
        """Our own words (sizes, hashes): escaped, wrapped between words."""
        safe = printable(text, None)
        self._emit(label, textwrap.wrap(safe, self.room, break_on_hyphens=False) or [""])

    def text(self, label: str, text: str, blob: str | None = None, complete: bool = True) -> None:
        """Text from the control plane, every character shown (escaped) and wrapped; in the
        listing (not ``full``) cut at LISTED_ROWS, saying its length and hash and how to
        see it all. ``blob``: ``text`` previews bytes so described ("stdin is 6,000 bytes,
        sha256 …"), of which it is all (``complete``) or only the start."""
        rows = self._wrap(_escape_units(text))
        cut = not self.full and len(rows) > LISTED_ROWS
        self._emit(label, rows[:LISTED_ROWS] if cut else rows)
        show = f"endpointd approvals --show {self.command_id}"
        if blob is None and cut:
            self.note("", f"… [{len(text):,} chars, sha256 {_sha256(text)}; full text: {show}]")
        elif blob is not None and cut:
            kept_here = "all of it" if complete else f"its first {PREVIEW_CHARS:,} characters"
            self.note("", f"… [{blob}; {kept_here}: {show}]")
        elif blob is not None and not complete:
            self.note(
                "", f"… [{blob}; the request keeps only its first {PREVIEW_CHARS:,} characters]"
            )


def _as_str(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _blob_lines(out: _Lines, label: str, blob: object, what: str) -> None:
    if not isinstance(blob, dict):
        out.note(label, "none (/dev/null)" if blob is None else _as_str(blob))
        return
    length, digest = blob.get("length"), blob.get("sha256")
    size = f"{length:,} bytes" if isinstance(length, int) else "? bytes"
    out.note(label, f"{size}, sha256 {_as_str(digest)}")
    preview = blob.get("preview")
    if isinstance(preview, str) and preview:
        complete = blob.get("complete") is True
        out.text("", preview, f"{what} is {size}, sha256 {_as_str(digest)}", complete)


def render(request: ApprovalRequest, *, full: bool = False) -> list[str]:
    """The lines `endpointd approvals` prints for ``request`` under its header, escaped and
    wrapped; ``full`` (`--show`) never cuts a field and lists the argv one by one."""
    out = _Lines(request.command_id, full)
    d = request.details
    kind = d.get("kind")
    argv = d.get("argv")
    if kind == "exec" and isinstance(argv, list) and all(isinstance(a, str) for a in argv):
        harness = d.get("harness")
        if isinstance(harness, str) and harness:
            out.text("harness", f"{harness} (a coding-agent CLI run; the prompt is its stdin)")
            out.text("prompt", _as_str(d.get("prompt")))
            if d.get("resume_session"):
                out.text("resume", _as_str(d.get("resume_session")))
        out.text("command", shlex.join(argv))
        if full:
            for i, arg in enumerate(argv):
                out.text("argv" if i == 0 else "", f"[{i}] {arg}")
        cwd = d.get("cwd")
        if cwd:
            out.text("cwd", _as_str(cwd))
        else:
            out.note("cwd", "(none given: the policy's default root)")
        env = d.get("env")
        if isinstance(env, dict) and env:
            for i, (name, value) in enumerate(env.items()):
                out.text("env" if i == 0 else "", f"{name}={_as_str(value)}")
        else:
            out.note("env", "(nothing added)")
        _blob_lines(out, "stdin", d.get("stdin"), "stdin")
        creds = d.get("credentials")
        if isinstance(creds, list) and creds:
            for i, ref in enumerate(creds):
                ref = ref if isinstance(ref, dict) else {}
                line = f"{_as_str(ref.get('name'))} ({_as_str(ref.get('delivery'))})"
                out.text("creds" if i == 0 else "", line)
        else:
            out.note("creds", "(none)")
    else:
        out.text("command", request.summary)
        if isinstance(d.get("path"), str):
            out.text("path", d["path"])
        if kind == "write_file":
            flags = []
            if isinstance(d.get("mode"), int):
                flags.append(f"mode {d['mode']:04o}")
            if d.get("create_parents"):
                flags.append("creating parent directories")
            expected = d.get("expected_sha256")
            if expected == "":
                flags.append("only if the file does not exist yet")
            elif isinstance(expected, str):
                flags.append(f"only if the file's sha256 is {expected}")
            if flags:
                out.note("write", ", ".join(flags))
            _blob_lines(out, "content", d.get("content"), "the content")
        elif kind == "read_file":
            limit = d.get("limit")
            upto = f"up to {limit:,} bytes" if isinstance(limit, int) else "to the end"
            offset = d.get("offset") if isinstance(d.get("offset"), int) else 0
            out.note("read", f"from byte {offset:,}, {upto}")
        elif kind == "list_dir":
            out.note("depth", _as_str(d.get("depth")))
        elif kind == "prepare_workspace":
            if d.get("repo"):
                out.text("repo", _as_str(d.get("repo")))
            out.note("base", _as_str(d.get("base")))
            if d.get("setup"):
                out.note("setup", "runs the repository's setup step in the new workspace")
    if request.origin:
        out.text("origin", request.origin)
    else:
        out.note("origin", "(not given)")
    out.text("rule", request.rule)
    return out.lines


def header(request: ApprovalRequest) -> str:
    """The first line `endpointd approvals` prints for ``request``: its id and its state."""
    if request.decision is not None and request.decided_at is not None:
        state = f"{request.decision} {_ago(request.decided_at)}"
    elif request.expires_at <= time.time():
        state = f"timed out {_ago(request.expires_at)}"
    else:
        state = (
            f"waiting {format_duration(request.age_seconds)},"
            f" {format_duration(request.seconds_left)} left"
        )
    return f"{printable(request.command_id)}  {state}"


def as_json(request: ApprovalRequest) -> dict[str, Any]:
    """``request`` for `endpointd approvals --json`: every field whole, nothing cut."""
    return {
        "command_id": request.command_id,
        "summary": request.summary,
        "details": request.details,
        "origin": request.origin,
        "rule": request.rule,
        "age_seconds": round(request.age_seconds, 1),
        "seconds_left": round(request.seconds_left, 1),
    }


# ---------------------------------------------------------------------------- proof


def _seal(key: bytes, r: ApprovalRequest) -> str:
    """The daemon's HMAC over what a request shows (its decision aside)."""
    body = json.dumps(
        [
            r.command_id,
            r.summary,
            r.origin,
            r.rule,
            repr(float(r.requested_at)),
            repr(float(r.expires_at)),
            r.details,
        ],
        sort_keys=True,
        ensure_ascii=True,
        separators=(",", ":"),
    )
    return hmac.new(key, _SEAL_CONTEXT + body.encode("ascii"), hashlib.sha256).hexdigest()


def decision_mac(
    key: bytes, command_id: str, outcome: str, requested_at: float, decided_at: float
) -> str:
    """HMAC-SHA256(key, command_id \\0 outcome \\0 requested_at \\0 decided_at), hex."""
    message = "\0".join((command_id, outcome, repr(float(requested_at)), repr(float(decided_at))))
    return hmac.new(key, message.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def _equal(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("ascii"))


def _sealed(request: ApprovalRequest, key: bytes) -> bool:
    return _equal(request.seal, _seal(key, request))


def _answered(request: ApprovalRequest, key: bytes) -> bool:
    """The request carries the owner's decision: sealed, and the decision's MAC is valid."""
    if request.decision is None or request.decided_at is None or not _sealed(request, key):
        return False
    expected = decision_mac(
        key, request.command_id, request.decision, request.requested_at, request.decided_at
    )
    return _equal(request.mac, expected)


def _content(request: ApprovalRequest) -> tuple[object, ...]:
    return (
        request.command_id,
        request.summary,
        request.origin,
        request.rule,
        request.requested_at,
        request.expires_at,
        request.details,
    )


def _undecided(request: ApprovalRequest) -> ApprovalRequest:
    return dataclasses.replace(request, decision=None, decided_at=None, mac="")


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _parse(raw: object) -> ApprovalRequest | None:
    """A request from its JSON, or None for anything malformed (torn or foreign file)."""
    if not isinstance(raw, dict):
        return None
    try:
        r = ApprovalRequest(**raw)
    except TypeError:
        return None
    well_formed = (
        all(isinstance(v, str) for v in (r.command_id, r.summary, r.origin, r.rule))
        and _number(r.requested_at)
        and _number(r.expires_at)
        and r.decision in (None, "approved", "denied")
        and (r.decided_at is None or _number(r.decided_at))
        and isinstance(r.details, dict)
        and isinstance(r.seal, str)
        and isinstance(r.mac, str)
    )
    return r if well_formed else None


# ---------------------------------------------------------------------------- who runs us


def _process(pid: int) -> tuple[int, bytes] | None:
    """(parent pid, command line) of ``pid``; None when it cannot be told."""
    if os.path.isdir("/proc/self"):
        try:
            stat_line = Path(f"/proc/{pid}/stat").read_bytes()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            # "pid (comm) state ppid ...": comm may hold anything, so split after its ")".
            return int(stat_line.rsplit(b")", 1)[1].split()[1]), cmdline
        except (OSError, ValueError, IndexError):
            return None
    ps = daemon_programs.which("ps") if sys.platform == "darwin" else None
    if ps is not None:
        try:
            done = subprocess.run(
                [ps, "-ww", "-o", "ppid=", "-o", "command=", "-p", str(pid)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=10,
                check=False,
            )
            ppid, _, command = done.stdout.strip().partition(b" ")
            return int(ppid), command
        except (OSError, ValueError, subprocess.SubprocessError):
            return None
    return None  # elsewhere (Windows) the check is skipped


def supervising_ancestor(pid: int | None = None) -> int | None:
    """The first ancestor of ``pid`` (default: this process) that is an endpointd exec
    supervisor or zygote, by its command line; None when there is none (or the platform
    cannot tell). Defence in depth only: see the module doc."""
    info = _process(os.getpid() if pid is None else pid)
    seen: set[int] = set()
    while info is not None:
        parent = info[0]
        if parent <= 0 or parent in seen:
            return None
        seen.add(parent)
        info = _process(parent)
        if info is not None and SUPERVISOR_MARK in info[1]:
            return parent
    return None


def refuse_if_run_by_a_command() -> None:
    """ApprovalError when this process descends from an endpointd supervisor: a command the
    daemon runs is trying to answer an approval itself."""
    ancestor = supervising_ancestor()
    if ancestor is not None:
        raise ApprovalError(
            f"refused: this runs under a command endpointd started (process {ancestor}, an"
            " endpointd supervisor, is among its parents); approvals come only from the owner,"
            " in their own terminal"
        )


# ---------------------------------------------------------------------------- the queue


def _file_name(command_id: str) -> str:
    return hashlib.sha256(command_id.encode("utf-8", "surrogatepass")).hexdigest()[:32] + ".json"


class Approvals:
    """The approvals queue under ``<state_dir>/approvals/``."""

    def __init__(self, state_dir: Path) -> None:
        self.directory = state_dir / APPROVALS_DIR
        # Daemon side: this daemon's key (renew_key), the requests it wrote (undecided, as
        # it wrote them, to put back after tampering) and the forgeries already reported.
        self._key: bytes | None = None
        self._issued: dict[str, ApprovalRequest] = {}
        self._forged: set[str] = set()

    # ------------------------------------------------------------------ files

    def _path(self, command_id: str) -> Path:
        return self.directory / _file_name(command_id)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        ensure_private_dir(self.directory)
        with exclusive_lock(self.directory / ".lock"):
            yield

    def _load(self, path: Path) -> ApprovalRequest | None:
        try:
            return _parse(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return None  # torn or foreign file: treated as absent, pruned when stale

    def _load_id(self, command_id: str) -> ApprovalRequest | None:
        request = self._load(self._path(command_id))
        return request if request is not None and request.command_id == command_id else None

    def _save(self, request: ApprovalRequest) -> None:
        data = json.dumps(asdict(request), indent=2) + "\n"
        atomic_write(self._path(request.command_id), data.encode("utf-8"), mode=0o600)

    def _all(self) -> list[tuple[Path, ApprovalRequest | None]]:
        try:
            names = sorted(p for p in self.directory.glob("*.json"))
        except OSError:
            return []
        return [(p, self._load(p)) for p in names]

    def current_key(self) -> bytes | None:
        """The running daemon's key as the CLI finds it; None when there is none."""
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.directory / KEY_FILE, flags)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            key = os.read(fd, KEY_BYTES + 1)
        except OSError:
            return None
        finally:
            os.close(fd)
        return key if len(key) == KEY_BYTES else None

    # ------------------------------------------------------------------ daemon side

    def renew_key(self) -> None:
        """Make this daemon's key (daemon side, once per start): 32 random bytes in a fresh
        0600 file renamed over any earlier key, which voids every decision made under it.
        Called by the first :meth:`request` or :meth:`decision` if not before."""
        ensure_private_dir(self.directory)
        key = os.urandom(KEY_BYTES)
        atomic_write(self.directory / KEY_FILE, key, mode=0o600)
        self._key = key

    def _daemon_key(self) -> bytes:
        if self._key is None:
            self.renew_key()
        assert self._key is not None
        return self._key

    def request(
        self,
        command_id: str,
        summary: str,
        origin: str,
        rule: str,
        timeout_seconds: float,
        details: Mapping[str, Any] | None = None,
    ) -> ApprovalRequest:
        """Queue ``command_id`` for a local decision and notify the desktop, if possible.

        ``details``: what :func:`describe` gives, already redacted. Idempotent: requesting
        again keeps the original deadline, and a decision already made under this daemon's
        key; a decision made before a restart (another key) is void and the owner is asked
        again. Returns the request as queued.
        """
        key = self._daemon_key()
        shown: dict[str, Any] = json.loads(json.dumps(dict(details or {})))
        now = time.time()
        with self._locked():
            self._prune(now)
            old = self._load_id(command_id)
            fresh = ApprovalRequest(
                command_id=command_id,
                summary=summary,
                origin=origin,
                rule=rule,
                requested_at=old.requested_at if old is not None else now,
                expires_at=old.expires_at if old is not None else now + timeout_seconds,
                details=shown,
            )
            fresh = dataclasses.replace(fresh, seal=_seal(key, fresh))
            keep = (
                old is not None
                and _sealed(old, key)
                and _content(old) == _content(fresh)
                and (old.decision is None or _answered(old, key))
            )
            if old is not None and keep:
                request = old
            else:
                request = fresh
                self._save(request)
        self._issued[command_id] = _undecided(request)
        if not keep:
            notify(request)
        return request

    def decision(
        self, command_id: str, on_forged: Callable[[str], None] | None = None
    ) -> Outcome | None:
        """ "approved" or "denied" once the owner answered; None while nobody has.

        A decision without a valid MAC under this daemon's key is no answer: it is logged
        (once per request, and passed to ``on_forged``) and the request is put back."""
        outcome, forged = self._examine(command_id)
        if forged is not None and on_forged is not None:
            on_forged(forged)
        return outcome

    def _examine(self, command_id: str) -> tuple[Outcome | None, str | None]:
        """(the owner's answer or None, a description of a forgery seen for the first time)."""
        key = self._daemon_key()
        request = self._load_id(command_id)
        if request is None:
            return None, None
        issued = self._issued.get(command_id)
        genuine = _sealed(request, key) and (
            issued is None or _content(issued) == _content(request)
        )
        if genuine and request.decision is None:
            return None, None
        if genuine and _answered(request, key):
            return request.decision, None
        if request.decision is not None:
            what = f'a "{request.decision}" decision without a valid MAC under this daemon\'s key'
        else:
            what = "a request file changed by something other than endpointd"
        detail = (
            f"ignored {what} (forged, or made before endpointd restarted);"
            " the request still waits for the owner"
        )
        self._reopen(command_id)
        if command_id in self._forged:
            return None, None
        self._forged.add(command_id)
        log.warning("approval %s: %s", printable(command_id, 200), detail)
        return None, detail

    def _reopen(self, command_id: str) -> None:
        """Put back the request as this daemon wrote it, undecided (after a forgery)."""
        key = self._daemon_key()
        with self._locked():  # serialises with forget(), which may run in another thread
            current = self._load_id(command_id)
            issued = self._issued.get(command_id)
            if issued is not None:
                restored = issued
                if (
                    current is not None
                    and _content(current) == _content(issued)
                    and (current.decision is None or _answered(current, key))
                ):
                    return  # already fine: the owner answered meanwhile
            elif current is not None and _sealed(current, key):
                restored = _undecided(current)
            else:
                return  # nothing genuine to put back: unanswerable, it times out
            if current != restored:
                self._save(restored)

    async def wait(
        self,
        command_id: str,
        timeout_seconds: float,
        interval: float = 0.2,
        on_forged: Callable[[str], None] | None = None,
    ) -> Outcome | Literal["timeout"]:
        """Poll for the owner's answer until ``timeout_seconds`` pass; a convenience for the
        daemon, which still has to :meth:`forget` the request afterwards. ``on_forged`` is
        called (in the event loop) the first time a forged answer is ignored."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            outcome, forged = await asyncio.to_thread(self._examine, command_id)
            if forged is not None and on_forged is not None:
                on_forged(forged)
            if outcome is not None:
                return outcome
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            await asyncio.sleep(min(interval, remaining))

    def forget(self, command_id: str) -> None:
        """Drop the request (after acting on its decision or its timeout)."""
        with self._locked():
            self._issued.pop(command_id, None)
            self._forged.discard(command_id)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(command_id))

    def _prune(self, now: float) -> None:
        for path, request in self._all():
            stale = request is None or request.expires_at + STALE_AFTER_SECONDS < now
            if stale and (request is not None or _older_than(path, STALE_AFTER_SECONDS, now)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    # ------------------------------------------------------------------ owner side

    def pending(self) -> list[ApprovalRequest]:
        """Requests of the running daemon still waiting for an answer, oldest first."""
        key = self.current_key()
        if key is None:
            return []
        now = time.time()
        found = [
            r
            for _, r in self._all()
            if r is not None and r.expires_at > now and _sealed(r, key) and not _answered(r, key)
        ]
        return sorted(found, key=lambda r: r.requested_at)

    def resolve(self, command_id: str) -> str:
        """The full command id for ``command_id`` or a unique prefix of a pending one."""
        if self._load_id(command_id) is not None:
            return command_id
        matches = [r.command_id for r in self.pending() if r.command_id.startswith(command_id)]
        if len(matches) == 1 and command_id:
            return matches[0]
        if len(matches) > 1 and command_id:
            raise ApprovalError(
                f"{printable(command_id)} matches several pending requests"
                f" ({', '.join(printable(m) for m in matches)}); give more of the id"
            )
        raise ApprovalError(
            f"no approval request with id {printable(command_id)}; `endpointd approvals` lists"
            " the pending ones"
        )

    def _genuine(self, command_id: str, key: bytes | None) -> ApprovalRequest:
        full = self.resolve(command_id)
        request = self._load_id(full)
        if request is None:
            raise ApprovalError(
                f"no approval request with id {printable(command_id)}; `endpointd"
                " approvals` lists the pending ones"
            )
        if key is None or not _sealed(request, key):
            raise ApprovalError(
                f"{printable(full)} was not queued by the running endpointd (or was changed"
                " since); it cannot be answered, and nothing changed"
            )
        return request

    def show(self, command_id: str) -> ApprovalRequest:
        """The request ``command_id`` (or a unique prefix) whole, for `--show`; a decision
        not proven by its MAC is left out."""
        key = self.current_key()
        request = self._genuine(command_id, key)
        assert key is not None
        return request if _answered(request, key) else _undecided(request)

    def decide(self, command_id: str, approve: bool) -> ApprovalRequest:
        """Answer a pending request; ApprovalError for an unknown, decided or expired one,
        and when this process runs under a command endpointd started."""
        refuse_if_run_by_a_command()
        outcome: Outcome = "approved" if approve else "denied"
        key = self.current_key()
        with self._locked():
            request = self._genuine(command_id, key)
            assert key is not None
            full = request.command_id
            if _answered(request, key):
                raise ApprovalError(
                    f"{printable(full)} was already {request.decision}"
                    f" {_ago(request.decided_at)}; nothing changed"
                )
            now = time.time()
            if request.expires_at <= now:
                raise ApprovalError(
                    f"{printable(full)} timed out {_ago(request.expires_at)} and was denied"
                )
            mac = decision_mac(key, full, outcome, request.requested_at, now)
            decided = dataclasses.replace(request, decision=outcome, decided_at=now, mac=mac)
            self._save(decided)
            return decided


def _older_than(path: Path, seconds: float, now: float) -> bool:
    try:
        return path.stat().st_mtime + seconds < now
    except OSError:
        return False


def _ago(when: float | None) -> str:
    if when is None:
        return ""
    return f"{format_duration(time.time() - when)} ago"


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def notify(request: ApprovalRequest) -> bool:
    """Show a desktop notification for ``request`` if ``notify-send`` (Linux) or
    ``osascript`` (macOS) exists; never blocks, never raises. True when one was started."""
    if os.environ.get(NO_NOTIFY_ENV):
        return False
    title = "endpointd: approval needed"
    body = (
        f"{printable(request.summary, NOTIFY_CHARS)} (rule {printable(request.rule, 100)})."
        " See all of it with `endpointd approvals`, then run"
        f" `endpointd approve {printable(request.command_id, 80)}` or `endpointd deny …`."
    )
    argv: list[str] | None = None
    # Found where no command can plant a program of the same name (this runs unconfined).
    osascript = daemon_programs.which("osascript") if sys.platform == "darwin" else None
    notify_send = daemon_programs.which("notify-send")
    if osascript is not None:

        def applescript(s: str) -> str:
            return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

        argv = [
            osascript,
            "-e",
            f"display notification {applescript(body)} with title {applescript(title)}",
        ]
    elif notify_send is not None:
        argv = [notify_send, "--app-name=endpointd", title, body]
    if argv is None:
        return False
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        return False
    # Reaped in the background so a hung notifier neither blocks us nor lingers as a zombie.
    threading.Thread(target=_reap, args=(proc,), name="endpointd-notify", daemon=True).start()
    return True


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(NOTIFY_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
