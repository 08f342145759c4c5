"""Per-run session stores: where a harness run keeps its state instead of the owner's.

A coding-agent CLI keeps all its state in one directory below the home directory
(``~/.claude``, ``~/.codex``, ``~/.qwen``): its login, every project's transcripts, its
configuration, and things it runs later outside any sandbox (Claude Code sources
``~/.claude/shell-snapshots`` before each of the owner's commands). That directory is the
owner's: every command is denied it (:data:`endpointd.rules.harnesses.HOME_STATE`, and
where the owner's variables moved it: :func:`endpointd.rules.harnesses.moved_state`). Each
harness run instead gets a store the daemon makes for it, and the harness is pointed there
by the variables it honours (``CLAUDE_CONFIG_DIR``, ``CODEX_HOME``, ``QWEN_HOME``; the
harness table's ``store_env``).

Layout, inside endpointd's state dir (denied to every command, so no other command or run
can read a store)::

    harness-stores/<id>/meta.json   the daemon's record: harness, project, last use, runs
    harness-stores/<id>/store/      the run's: granted to it alone, read and write

* **A new session** (no ``resume_session``) gets a new store, named at random (never by
  anything the control plane chose).
* **A resume** continues in the store holding that session, found by the session file the
  harness wrote (``<session>.jsonl``, or ``…-<session>.jsonl`` for Codex), and only among
  the stores of the same harness for the same project directory (the run's resolved cwd).
  Any other resume is refused, naming the session: a run never sees another project's or
  another session's store.
* **The login**: each login file the owner has for that harness (and Qwen Code's
  ``settings.json``, which may hold its key) is linked into the store by name, pointing at
  the owner's file; the run is granted reading that one file (:attr:`RunStore.logins`) and
  nothing writes it (a write through the link meets the sandbox; a token that must be
  refreshed fails until the owner uses the CLI by hand). No copy is ever made, so nothing
  of it stays behind after the run. Whatever the store holds under those names is replaced
  before each run, so a run cannot leave a login of its choosing for the next.
* **Retention** (``[harness] keep_sessions_hours``): a store goes that long after its last
  run ends (0: as soon as it ends); also once its project directory is gone, or when its
  record says a run still uses it for longer than any run may last.

The daemon reads only its own ``meta.json`` and the *names* in a store (never following a
link); it removes a store with :func:`shutil.rmtree`, which does not follow links either.
Nothing here runs or parses what a run wrote.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from endpointd.fsutil import atomic_write
from endpointd.rules.harnesses import HARNESSES, moved_state, owner_logins
from superagent_shared.messages import Reason

__all__ = ["STORES_DIR", "RunStore", "StoreRefused", "finish", "open_for_run", "sweep"]

STORES_DIR = "harness-stores"
_STORE = "store"
_META = "meta.json"
# How far a session lookup looks into a store (the harnesses nest theirs 2 to 5 deep).
_MAX_DEPTH = 6
_MAX_ENTRIES = 20000


class StoreRefused(Exception):
    """The run cannot have a store (a resume of a session this project has not kept)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.reason = Reason.INVALID
        self.message = message


@dataclass(frozen=True)
class _Meta:
    """A store's record, the daemon's own (the run cannot reach it)."""

    harness: str
    project: str  # the resolved cwd of the run that made it
    runs: tuple[str, ...] = ()  # the commands using it now
    last_used: float = 0.0


@dataclass(frozen=True)
class RunStore:
    """One run's store: ``path`` (granted read and write), the variables pointing the
    harness there, and the owner's login files the run may read (resolved)."""

    id: str
    path: Path
    env: Mapping[str, str]
    logins: tuple[str, ...]


def open_for_run(
    state_dir: Path,
    *,
    harness: str,
    home: Path,
    cwd: str,
    command_id: str,
    resume_session: str = "",
    now: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> RunStore:
    """The store of ``command_id``'s run of ``harness`` in ``cwd``: a new one, or for
    ``resume_session`` the one holding that session (:class:`StoreRefused` when this
    project kept none). Made (0700), recorded as in use, its login links renewed.
    ``environ``: endpointd's own (default), where the owner may have moved the harness's
    state (:func:`endpointd.rules.harnesses.moved_state`)."""
    now = time.time() if now is None else now
    environ = os.environ if environ is None else environ
    root = _root(state_dir)
    project = os.path.realpath(cwd)
    found = _own(root, command_id)  # (started before a restart: the same store)
    if not _matches(found, harness, project):
        found = None
    if found is None and resume_session:
        found = _holding(root, harness, project, resume_session)
        if found is None:
            raise StoreRefused(
                f"run_harness.resume_session {resume_session!r}: no {harness} session of"
                f" that id is kept for {project} on this device (a session is resumed in the"
                " project directory it ran in, by the same harness, within [harness]"
                " keep_sessions_hours of its last run)"
            )
    if found is None:
        # A name of its own, never one a command id could choose.
        found = root / secrets.token_hex(16)
        found.mkdir(mode=0o700)
    store = found / _STORE
    store.mkdir(mode=0o700, exist_ok=True)
    meta = _meta(found) or _Meta(harness=harness, project=project)
    runs = (*(r for r in meta.runs if r != command_id), command_id)
    _write_meta(found, replace(meta, runs=runs, last_used=now))
    logins = _link_logins(store, harness, home, environ)
    spec = HARNESSES[harness]
    return RunStore(
        id=found.name,
        path=store,
        env=dict.fromkeys(spec.store_env, str(store)),
        logins=logins,
    )


def finish(state_dir: Path, command_id: str, *, keep_hours: int, now: float | None = None) -> None:
    """``command_id``'s run has ended: its store is no longer in use by it, and goes now
    when nothing keeps it (``keep_hours`` 0) and no other run uses it."""
    now = time.time() if now is None else now
    root = _root(state_dir, make=False)
    found = _own(root, command_id)
    if found is None:
        return
    meta = _meta(found)
    runs = tuple(r for r in meta.runs if r != command_id) if meta is not None else ()
    if meta is None or (keep_hours <= 0 and not runs):
        _remove(found)
        return
    _write_meta(found, replace(meta, runs=runs, last_used=now))


def sweep(
    state_dir: Path, *, keep_hours: int, max_run_seconds: float, now: float | None = None
) -> list[str]:
    """Remove the stores no longer kept: idle past ``keep_hours``, recorded as in use for
    longer than any run may last (``max_run_seconds``: its runs are gone), or whose
    project directory is gone; their ids."""
    now = time.time() if now is None else now
    root = _root(state_dir, make=False)
    removed = []
    for entry in _entries(root):
        meta = _meta(entry)
        if meta is None:
            _remove(entry)
            removed.append(entry.name)
            continue
        idle = now - meta.last_used
        gone = not os.path.isdir(meta.project)
        kept = keep_hours * 3600 + (max_run_seconds if meta.runs else 0)
        if gone or idle > kept:
            _remove(entry)
            removed.append(entry.name)
    return removed


# ----------------------------------------------------------------------------- helpers


def _root(state_dir: Path, *, make: bool = True) -> Path:
    root = state_dir / STORES_DIR
    if make:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root


def _entries(root: Path) -> list[Path]:
    try:
        with os.scandir(root) as found:
            return [Path(e.path) for e in found if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []


def _meta(entry: Path) -> _Meta | None:
    try:
        data = json.loads((entry / _META).read_text(encoding="utf-8"))
        meta = _Meta(
            harness=str(data["harness"]),
            project=str(data["project"]),
            runs=tuple(str(r) for r in data["runs"]),
            last_used=float(data["last_used"]),
        )
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return meta if meta.project else None


def _write_meta(entry: Path, meta: _Meta) -> None:
    atomic_write(entry / _META, json.dumps(asdict(meta)).encode(), mode=0o600, fsync=False)


def _own(root: Path, command_id: str) -> Path | None:
    """The store ``command_id`` uses already (it was started before, e.g. then re-built
    after a restart), if any."""
    for entry in _entries(root):
        meta = _meta(entry)
        if meta is not None and command_id in meta.runs:
            return entry
    return None


def _matches(entry: Path | None, harness: str, project: str) -> bool:
    meta = _meta(entry) if entry is not None else None
    return meta is not None and meta.harness == harness and meta.project == project


def _holding(root: Path, harness: str, project: str, session: str) -> Path | None:
    """The store of ``harness`` for ``project`` that holds ``session``, if one is kept."""
    for entry in sorted(_entries(root)):
        if _matches(entry, harness, project) and _has_session(entry / _STORE, session):
            return entry
    return None


def _has_session(store: Path, session: str) -> bool:
    """Whether ``store`` holds the session file of ``session``: by name only, without
    following a link or opening a file the run wrote."""
    names = (f"{session}.jsonl",)
    suffix = f"-{session}.jsonl"
    pending = [(str(store), 0)]
    seen = 0
    while pending:
        directory, depth = pending.pop()
        try:
            with os.scandir(directory) as found:
                entries = list(found)
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > _MAX_ENTRIES:
                return False
            if entry.is_dir(follow_symlinks=False):
                if depth < _MAX_DEPTH:
                    pending.append((entry.path, depth + 1))
            elif entry.is_file(follow_symlinks=False) and (
                entry.name in names or entry.name.endswith(suffix)
            ):
                return True
    return False


def _link_logins(
    store: Path, harness: str, home: Path, environ: Mapping[str, str]
) -> tuple[str, ...]:
    """Link the owner's login files of ``harness`` into ``store`` by name; the files the run
    may read (resolved). Only a file that really lies in the harness's own directory is
    linked (a login that is a link elsewhere, say into a denied directory, is not)."""
    spec = HARNESSES[harness]
    moved = [path for var, path in moved_state(spec, environ) if var == spec.store_env[0]]
    dirs = [home / entry for entry in spec.home_state] + moved
    homes = [os.path.realpath(d) for d in dirs]
    granted = []
    fd = os.open(store, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for login in owner_logins(spec, home, environ):
            _clear(fd, login.name)
            real = os.path.realpath(login)
            try:
                regular = stat.S_ISREG(os.stat(real).st_mode)
            except OSError:
                continue
            if not regular or not any(_within(real, h) and real != h for h in homes):
                continue
            os.symlink(real, login.name, dir_fd=fd)
            granted.append(real)
    finally:
        os.close(fd)
    return tuple(granted)


def _clear(fd: int, name: str) -> None:
    """Remove whatever the store holds at ``name`` (a run may have left anything there)."""
    try:
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass
    except (IsADirectoryError, PermissionError):
        shutil.rmtree(name, dir_fd=fd)


def _remove(entry: Path) -> None:
    """Delete a store and its record, never following a link (a run may also have taken
    the permissions off its own directories: they are given back, by fd, and retried)."""
    for _ in range(2):
        try:
            shutil.rmtree(entry)
            return
        except FileNotFoundError:
            return
        except PermissionError:
            _writable_dirs(str(entry))
    shutil.rmtree(entry, ignore_errors=True)


def _writable_dirs(top: str) -> None:
    """Give every directory beneath ``top`` back its owner's rights, each reached without
    following a link (an ``O_PATH`` fd, changed through ``/proc/self/fd``), so a link
    planted in a store never carries a chmod to its target. Linux only; elsewhere the
    removal does what it can."""
    o_path = getattr(os, "O_PATH", 0)
    if not o_path or not os.path.isdir("/proc/self/fd"):
        return
    pending = [top]
    while pending:
        path = pending.pop()
        try:
            fd = os.open(path, o_path | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                continue
            os.chmod(f"/proc/self/fd/{fd}", 0o700)
            with os.scandir(path) as found:
                pending += [e.path for e in found if e.is_dir(follow_symlinks=False)]
        except OSError:
            pass
        finally:
            os.close(fd)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
