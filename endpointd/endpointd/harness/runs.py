"""A RunHarness turned into the exec the daemon runs: from the harness table and the local
policy alone.

The control plane names the harness and gives the prompt (stdin), a session to resume,
a turn limit and a timeout. This module chooses the program (the policy's ``program`` or
the one on PATH), the flags (:mod:`endpointd.rules.harnesses`), the model and endpoint (the
policy's), the turn limit (the smaller of the request's and the policy's ``max_turns``)
and the credential (the one ``[harness.NAME] credential`` names: by env in
``credential_env``, or with ``delivery = "http"`` through the device's proxy, which adds it
to the harness's HTTPS requests for the credential's hosts while the harness holds only
:data:`PLACEHOLDER_KEY`). What it builds is an ordinary
:class:`~superagent_shared.messages.HarnessExec`, judged and run as every exec is: the
owner's ``[[commands]]`` rules see its real argv.

Where a run keeps its state (its sessions, its harness's configuration as it writes it):
a store of its own that the daemon makes when it starts (:mod:`endpointd.harness.stores`),
never the owner's ``~/.qwen``, ``~/.codex``, ``~/.claude`` or ``~/.claude.json``, which no
command may read or write (they hold the login, every project's transcripts, and what the
CLI runs the next time the owner uses it by hand, outside any sandbox).

A refusal (:class:`HarnessRefused`) says how to fix it: allow the harness in policy.toml,
install it, or send a well-formed request.
"""

from __future__ import annotations

import os
import re

from endpointd.guard.policy import Policy
from endpointd.harness.detect import find_program
from endpointd.rules.harnesses import HARNESSES, NAMES, Run
from superagent_shared.messages import CredentialRef, Delivery, HarnessExec, Reason, RunHarness

__all__ = ["HarnessRefused", "build", "credential_ref", "unplanned"]

# What a harness whose key is http-delivered holds instead of it (not a secret).
PLACEHOLDER_KEY = "endpointd-proxy-adds-the-key"
# A session id goes into argv: the shape of the ids harnesses make (UUIDs, names), and
# never something an option parser could take for a flag.
SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")


class HarnessRefused(Exception):
    """The run cannot be built; ``reason`` is the Refused reason to answer with."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _invalid(message: str) -> HarnessRefused:
    return HarnessRefused(Reason.INVALID, message)


def build(request: RunHarness, policy: Policy, *, path_var: str | None = None) -> HarnessExec:
    """The exec of ``request`` under ``policy`` (HarnessRefused when it may not or cannot
    run here). ``path_var``: where to look for a harness the policy gives no program for
    (default: the daemon's PATH)."""
    name = request.harness
    if name not in HARNESSES:
        shown = name[:40] if name.isprintable() else repr(name[:40])
        raise HarnessRefused(
            Reason.POLICY_DENIED,
            f"unknown harness {shown!r}: this endpointd can run {', '.join(NAMES)}",
        )
    spec = HARNESSES[name]
    rules = policy.rules
    if rules is None:
        raise HarnessRefused(
            Reason.POLICY_DENIED,
            f"the local policy cannot be used, so every command is refused: {policy.error}",
        )
    if not rules.harness.allows(name):
        allowed = [*rules.harness.allowed, name]
        listed = ", ".join(f'"{a}"' for a in dict.fromkeys(allowed))
        raise HarnessRefused(
            Reason.POLICY_DENIED,
            f"the harness {name} ({spec.title}) is not allowed on this device: its owner may"
            f" allow it with [harness] allowed = [{listed}] in {policy.path}",
        )
    settings = rules.harness.settings_for(name)
    program = find_program(name, settings, path_var)
    if program is None:
        where = (
            f"[harness.{name}] program = {str(settings.program)!r} is not an executable file"
            if settings.program is not None
            else f"`{spec.program}` is not on endpointd's PATH"
        )
        raise HarnessRefused(
            Reason.POLICY_DENIED,
            f"the harness {name} ({spec.title}) is not installed here ({where}): install it"
            f" with `npm install -g {spec.npm}`, or set [harness.{name}] program in"
            f" {policy.path}",
        )
    if not request.cwd:
        raise _invalid("run_harness.cwd is required (the workspace to run in)")
    if "\x00" in request.cwd or not os.path.isabs(request.cwd):
        raise _invalid(f"run_harness.cwd must be an absolute path, got {request.cwd[:200]!r}")
    if not request.prompt.strip():
        raise _invalid("run_harness.prompt is required")
    if request.resume_session and not SESSION_ID.match(request.resume_session):
        raise _invalid(
            "run_harness.resume_session must be a session id (letters, digits, . _ : -),"
            f" got {request.resume_session[:80]!r}"
        )
    turns = request.max_turns
    if settings.max_turns:
        turns = min(turns, settings.max_turns) if turns else settings.max_turns
    ref = credential_ref(name, policy)
    argv = spec.argv(
        Run(
            program=program,
            model=settings.model,
            base_url=settings.base_url,
            max_turns=turns if spec.max_turns else 0,
            resume_session=request.resume_session,
            openai_key=ref is not None,
        )
    )
    env = dict(spec.env)
    if ref is not None and ref.delivery == Delivery.HTTP:
        # The CLI will not start without a key in its variable; the device's proxy swaps
        # this for the real one on the way out, so the harness never holds the key.
        env[settings.credential_env] = PLACEHOLDER_KEY
    return HarnessExec(
        argv=tuple(argv),
        cwd=request.cwd,
        env=env,
        timeout_seconds=request.timeout_seconds,
        stdin=request.prompt.encode("utf-8", "surrogatepass"),
        request=request,
        credential=ref.name if ref is not None else "",
    )


def credential_ref(name: str, policy: Policy) -> CredentialRef | None:
    """The credential ``[harness.NAME] credential`` delivers to the harness's runs, if any."""
    rules = policy.rules
    if rules is None:
        return None
    settings = rules.harness.settings_for(name)
    if not settings.credential:
        return None
    if settings.delivery == "http":
        return CredentialRef(settings.credential, Delivery.HTTP, "")
    return CredentialRef(settings.credential, Delivery.ENV, settings.credential_env)


def unplanned(request: RunHarness) -> HarnessExec:
    """A stand-in for a journaled run that can no longer be built (the policy changed while
    the daemon was down): enough to re-attach to it if it still runs, or to refuse it at
    its start, where it is always built again. Never started as it is."""
    return HarnessExec(argv=(request.harness or "harness",), cwd=request.cwd, request=request)
