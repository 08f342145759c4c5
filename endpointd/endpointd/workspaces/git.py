"""The git commands endpointd itself runs on the user's clones (fetch, worktree, stash
create…): outside the sandbox, as the user, so with care.

* Hooks never run (``core.hooksPath=/dev/null``) and no fsmonitor is started: a clone's
  hooks may have been written by an agent's command before workspaces existed, and
  endpointd is not sandboxed.
* No prompt can hang it: no terminal (a new session, stdin from /dev/null) and
  ``GIT_TERMINAL_PROMPT=0``. Credentials come from the user's own git setup (credential
  helper, ssh agent), as for any git the user runs.
* Variables that would point git at another repository (``GIT_DIR``, ``GIT_INDEX_FILE``…)
  are dropped from the environment, except the index a caller asks for.
* A failure is :class:`GitError`: one line, git's own last complaint, with any
  ``user:password@`` taken out of URLs; never a traceback.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence

from endpointd.workspaces.errors import GitError

__all__ = ["GitError", "git", "git_ok"]

DEFAULT_TIMEOUT = 120.0
FETCH_TIMEOUT = 600.0
# Variables that redirect git to another repository, index or object store.
_REPOSITORY_VARIABLES = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_CEILING_DIRECTORIES",
    "GIT_DISCOVERY_ACROSS_FILESYSTEM",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
)
_SAFE = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")
_CREDENTIALS_IN_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")
_MAX_MESSAGE = 300


def _environment(extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _REPOSITORY_VARIABLES}
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["LC_ALL"] = "C"
    # The fallback e-mail for a commit made here (the local changes' snapshot) when the
    # user has none configured; their user.email wins over it.
    env.setdefault("EMAIL", "superagent@localhost")
    env.update(extra)
    return env


def _complaint(stderr: str, stdout: str) -> str:
    lines = [line.strip() for line in (stderr or stdout).splitlines() if line.strip()]
    flagged = [line for line in lines if line.startswith(("fatal:", "error:"))]
    text = (flagged or lines or ["no message"])[-1]
    text = _CREDENTIALS_IN_URL.sub(r"\1", text)
    return text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE] + "…"


def _run(
    args: Sequence[str],
    cwd: str,
    timeout: float,
    env: Mapping[str, str],
    on_start: Callable[[int], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.Popen(
            ["git", *_SAFE, *args],
            cwd=cwd,
            env=_environment(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except FileNotFoundError:
        raise GitError("git is not installed (or not on endpointd's PATH)") from None
    except OSError as exc:
        raise GitError(f"cannot run git in {cwd}: {exc.strerror or exc}") from None
    if on_start is not None:
        on_start(proc.pid)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: git and its helpers
        proc.communicate()
        raise GitError(f"git {args[0]} took longer than {timeout:.0f} s") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def git(
    *args: str,
    cwd: str,
    timeout: float = DEFAULT_TIMEOUT,
    env: Mapping[str, str] | None = None,
    what: str = "",
    on_start: Callable[[int], None] | None = None,
) -> str:
    """git's output (stripped); :class:`GitError` naming ``what`` (else the git command)
    and git's own complaint when it fails. ``on_start``: told git's pid as it starts (the
    credential helper answers only that process tree)."""
    done = _run(args, cwd, timeout, env or {}, on_start)
    if done.returncode != 0:
        action = what or f"git {args[0]}"
        raise GitError(f"{action} failed: {_complaint(done.stderr, done.stdout)}")
    return done.stdout.strip()


def git_ok(*args: str, cwd: str, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Whether the git command succeeds (for questions: does this ref exist?)."""
    return _run(args, cwd, timeout, {}).returncode == 0
