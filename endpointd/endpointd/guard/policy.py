"""The local policy: the one place every command passes before it may run.

The policy file, ``<config dir>/policy.toml``, is the machine owner's: no RPC can change
it. It says where commands may run and files may be touched (``allowed_roots``, minus
``denied_paths``), which commands are allowed, denied or held for a local approval
(``[[commands]]``, first match wins, else ``default_action``), which commands may receive
each credential (``[credentials.NAME] allow``), which repositories get a ticket workspace
and how long it is kept (``[workspaces]``), which coding-agent CLIs the control plane may
run here and with what (``[harness]``), and the limits (``[limits]``). The shipped
``policy.example.toml`` documents every key. What the file says is read and validated in
:mod:`endpointd.rules` (its words, its tables, its parser); this module judges commands
against it, through one module per kind of check: :mod:`~endpointd.guard.exec_check`
(an exec), :mod:`~endpointd.guard.file_check` (a file operation),
:mod:`~endpointd.guard.workspace_check` (a ticket workspace) and, under all three,
:mod:`~endpointd.guard.roots` (where a command may act); :mod:`~endpointd.guard.loaded`
holds one load of the file.

How it is enforced:

* :meth:`Policy.check` judges a command: paths first (allowed roots, denied paths), then
  the command rules, then the credential scopes; deny beats ask beats allow. Every
  :class:`Decision` names the rule that decided, as the policy file names it.
* A missing, unreadable, malformed or loosely-permissioned file refuses every command
  (except cancel, which only ever stops work) with a message naming the file and line:
  a broken policy must never mean "allow everything".
* The file is re-read whenever it changes (one ``stat`` per check), so edits apply without
  a restart and :meth:`Policy.hash` (reported in every Hello) always describes the rules
  being enforced.

The policy says what the control plane may ask for; the OS sandbox
(:mod:`endpointd.guard.sandbox`) is what holds an allowed command to it once it runs: the
denied paths unreadable, writes only in its workspace, no view of other processes, the
network as ``network`` says. The argv check against denied paths is only a courtesy (a
clear refusal up front); the kernel is the boundary.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from endpointd.guard import sandbox
from endpointd.guard.confinement import Confinement
from endpointd.guard.exec_check import exec_decision, program_of
from endpointd.guard.file_check import file_decision, file_op
from endpointd.guard.files import within as _within
from endpointd.guard.loaded import Loaded, denied_hit, load
from endpointd.guard.roots import broken_decision
from endpointd.guard.workspace_check import workspace_decision
from endpointd.paths import data_dir, state_dir
from endpointd.rules.decisions import Decision
from endpointd.rules.tables import DeniedPath, Limits, Rules, WorkspaceRules
from endpointd.rules.terms import POLICY_FILE, FileOp
from superagent_shared.messages import (
    Command,
    Exec,
    Glob,
    HarnessExec,
    ListDir,
    PrepareWorkspace,
    ReadFile,
    Reason,
    ReleaseWorkspace,
    RunHarness,
    Search,
    WriteFile,
)

_UNSET = object()


class Policy:
    """The rules of ``path`` (normally ``<config dir>/policy.toml``), kept current.

    ``state_dir`` and ``home`` default to the daemon's state dir and the user's home; they
    only matter for the built-in denied paths (endpointd's own files, ``~/.ssh``, …).
    ``data_dir`` (default: the daemon's) holds the tickets' workspaces, which are allowed
    like an allowed root each (:meth:`workspace_for`).
    """

    def __init__(
        self,
        path: Path,
        *,
        state_dir: Path | None = None,
        home: Path | None = None,
        data_dir: Path | None = None,
    ) -> None:
        self.path = path
        self.config_dir = path.parent
        self._state_dir = state_dir
        self._data_dir = data_dir
        self._home = home
        self._stamp: object = _UNSET
        self._loaded = Loaded(rules=None, error="not loaded", digest=b"")
        self._refresh()

    # ------------------------------------------------------------------ loading

    @property
    def home(self) -> Path:
        return Path.home() if self._home is None else self._home

    def _refresh(self) -> Loaded:
        st: os.stat_result | None = None
        try:
            st = os.stat(self.path)
            stamp: object = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except FileNotFoundError:
            stamp = None
        except OSError as exc:
            stamp = ("error", exc.errno)
        if stamp == self._stamp:
            return self._loaded
        state = self._state_dir if self._state_dir is not None else state_dir().path
        self._loaded = load(self.path, st, home=self.home, state_directory=state)
        self._stamp = stamp
        return self._loaded

    # ------------------------------------------------------------------ views

    @property
    def error(self) -> str | None:
        """Why the policy cannot be used (every command is then refused), or None."""
        return self._refresh().error

    @property
    def rules(self) -> Rules | None:
        return self._refresh().rules

    @property
    def limits(self) -> Limits:
        rules = self._refresh().rules
        return rules.limits if rules is not None else Limits()

    @property
    def allowed_roots(self) -> list[Path]:
        """The allowed roots, resolved (symlinks and ``..``), in file order."""
        return [Path(r.real) for r in self._refresh().roots]

    @property
    def default_root(self) -> Path:
        """Where a command that names no cwd runs: the first allowed root (home if none)."""
        roots = self._refresh().roots
        return Path(roots[0].real) if roots else self.home

    @property
    def workspaces_root(self) -> Path:
        """Where the tickets' workspaces are: ``<data dir>/workspaces``."""
        base = self._data_dir if self._data_dir is not None else data_dir().path
        return Path(os.path.abspath(base)) / "workspaces"

    @property
    def workspace_rules(self) -> WorkspaceRules:
        rules = self._refresh().rules
        return rules.workspaces if rules is not None else WorkspaceRules()

    def ticket_workspace(self, path: str) -> Path | None:
        """The ticket workspace (``<data dir>/workspaces/<ticket>``) holding ``path``
        (resolved), or None: the root itself is nobody's."""
        real = os.path.realpath(path)
        root = os.path.realpath(self.workspaces_root)
        if real == root or not _within(real, root):
            return None
        name = os.path.relpath(real, root).split(os.sep)[0]
        return Path(root) / name

    def operation_roots(self, path: str) -> list[str]:
        """The roots a file operation on ``path`` is confined to: the ticket workspace
        holding it first (so it cannot wander into another ticket's), then the allowed
        roots."""
        workspace = self.ticket_workspace(path)
        roots = [str(r) for r in self.allowed_roots]
        return [str(workspace), *roots] if workspace is not None else roots

    def workspace_for(self, cwd: str) -> Path | None:
        """Where a command in ``cwd`` (resolved) may write: the ticket workspace holding
        it, else the allowed root holding it."""
        real = os.path.realpath(cwd)
        ticket = self.ticket_workspace(real)
        if ticket is not None:
            return ticket
        for root in self._refresh().roots:
            if _within(real, root.real):
                return Path(root.real)
        return None

    def confinement(
        self,
        *,
        workspace: str,
        tmpdir: str,
        proxy_port: int | None,
        ticket: bool,
        extra_write: Sequence[str] = (),
        extra_write_files: Sequence[str] = (),
        extra_read: Sequence[str] = (),
        own_write: Sequence[str] = (),
        read_files: Sequence[str] = (),
    ) -> Confinement:
        """The sandbox of a command writing in ``workspace`` under this policy
        (:func:`endpointd.guard.sandbox.plan`, whose :class:`SandboxUnavailable` it
        raises, also when the policy cannot be used). A ``ticket``'s command cannot read
        the other tickets' workspaces: the directory holding them all is denied to it, less
        its own (writable) one."""
        rules = self._refresh().rules
        if rules is None:
            raise sandbox.SandboxUnavailable("the policy cannot be used")
        denied = [str(d.path) for d in self.denied_paths]
        if ticket:
            denied.append(str(self.workspaces_root))
        return sandbox.plan(
            rules,
            denied=denied,
            workspace=workspace,
            tmpdir=tmpdir,
            proxy_port=proxy_port,
            extra_write=extra_write,
            extra_write_files=extra_write_files,
            extra_read=extra_read,
            own_write=own_write,
            read_files=read_files,
        )

    @property
    def sandbox_summary(self) -> str:
        """How commands are confined under this policy, in one line (status, Hello)."""
        rules = self._refresh().rules
        if rules is None:
            return "none: the policy cannot be used, so every command is refused"
        return sandbox.describe(rules.sandbox, rules.network)

    @property
    def denied_paths(self) -> list[DeniedPath]:
        """Built-in denied paths first, then the file's."""
        return [d.entry for d in self._refresh().denied]

    def hash(self) -> bytes:
        """SHA-256 of the policy being enforced and of how this machine enforces it.

        Over the policy file's bytes (b"" when there is none), then ``b"\\n\\0effective: "``
        and the effective mode line of :meth:`_effective_mode`, so that the same file on a
        machine that cannot enforce its sandbox hashes differently. Deterministic: the same
        file on equally capable machines gives the same hash. The bytes are the ones the
        rules in force were parsed from: if the file changed since, it is loaded again.
        """
        data = b""
        for _ in range(3):
            loaded = self._refresh()
            try:
                data = self.path.read_bytes()
            except OSError:
                data = b""  # as the loader: missing or unreadable is the hash of b""
            if hashlib.sha256(data).digest() == loaded.digest:
                break
            self._stamp = _UNSET  # changed under us (or within the stamp's resolution)
        digest = hashlib.sha256(data)
        digest.update(b"\n\0effective: ")
        digest.update(self._effective_mode(loaded.rules).encode())
        return digest.digest()

    @staticmethod
    def _effective_mode(rules: Rules | None) -> str:
        """``sandbox=<mode>; network=<mode>; enforced=<yes|partly|no>`` for :meth:`hash`.

        ``enforced``: ``yes`` when this machine enforces all of the confinement, ``partly``
        when its sandbox lacks something (under ``required`` such commands are refused),
        ``no`` when commands would run unconfined (``off``, or no OS sandbox at all). A
        policy that cannot be used (every command refused) is ``sandbox=none``.
        """
        if rules is None:
            return "sandbox=none; network=none; enforced=no"
        if rules.sandbox == "off":
            enforced = "no"
        else:
            here = sandbox.support()
            if not here.missing(rules.network):
                enforced = "yes"
            else:
                enforced = "partly" if here.mechanism else "no"
        return f"sandbox={rules.sandbox}; network={rules.network}; enforced={enforced}"

    # ------------------------------------------------------------------ checks

    def check(self, command: Command) -> Decision:
        """Judge ``command`` (already structurally validated)."""
        op = command.op
        kind = command.kind
        if kind == "cancel":
            return Decision("allow", "cancel", "cancelling a command is always allowed")
        if isinstance(op, ReleaseWorkspace):
            return Decision(
                "allow",
                "release_workspace",
                "releasing a ticket's workspace only lets endpointd remove what it made",
            )
        loaded = self._refresh()
        if loaded.rules is None:
            return broken_decision(loaded)
        if isinstance(op, Exec):
            names = [c.name for c in command.credentials]
            if isinstance(op, HarnessExec) and op.credential:
                # The harness's own key, named for it in [harness.NAME] credential and
                # attached by this device (never by the control plane): scoped to its runs
                # by that, so it needs no [credentials.NAME] allow entry.
                names = [n for n in names if n != op.credential]
            return exec_decision(
                self,
                loaded,
                list(op.argv),
                op.cwd,
                names,
                None,
                env=dict(op.env),
                env_from_device=isinstance(op, HarnessExec),
            )
        if isinstance(op, RunHarness):
            return Decision(
                "deny",
                "harness",
                "a run_harness is judged once this device has built its command"
                " (endpointd.harness.runs); this one was not",
            )
        if isinstance(op, ReadFile | WriteFile | ListDir):
            return file_decision(self, loaded, op.path, file_op(op.KIND), None)
        # A search reads the files beneath its path; a glob lists them.
        if isinstance(op, Search):
            return file_decision(self, loaded, op.path, "read", None)
        if isinstance(op, Glob):
            return file_decision(self, loaded, op.path, "list", None)
        if isinstance(op, PrepareWorkspace):
            if command.credentials:
                return Decision(
                    "deny",
                    "credentials",
                    "prepare_workspace takes no credentials: endpointd fetches with your own"
                    " git setup (credential helper, ssh agent)",
                    Reason.CREDENTIAL_UNAVAILABLE,
                )
            return workspace_decision(self, loaded, op.path, op.repo)
        return Decision("deny", "policy", f"the policy does not know command kind {kind!r}")

    def check_workspace(self, path: str, repo: str) -> Decision:
        """Judge a workspace of the clone (or directory) ``path`` of repository ``repo``:
        allowed roots and denied paths, then ``[workspaces]`` deny, ask, allow (globs over
        the repository), then ``default_action``."""
        loaded = self._refresh()
        if loaded.rules is None:
            return broken_decision(loaded)
        return workspace_decision(self, loaded, path, repo)

    def check_path(self, path: str, op: FileOp = "read") -> Decision:
        """Judge the file operation ``op`` on ``path`` as :meth:`check` judges a
        read_file, write_file or list_dir: allowed roots and denied paths first (deny
        wins), then the first ``[[files]]`` rule for ``op`` whose match fits the path (as
        written, normalised, or resolved), then, for writes, the built-in protected paths
        (``protected: …``, denied), then ``default_action``."""
        loaded = self._refresh()
        if loaded.rules is None:
            return broken_decision(loaded)
        return file_decision(self, loaded, path, op, None)

    def explain(
        self,
        argv: list[str],
        cwd: str | None,
        credentials: list[str],
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Why ``argv`` (in ``cwd``, with ``credentials``) gets its decision, step by step."""
        loaded = self._refresh()
        steps = [f"policy: {self.path} (policy hash {self.hash().hex()[:16]}…)"]
        if loaded.rules is None:
            decision = broken_decision(loaded)
        else:
            decision = exec_decision(
                self, loaded, argv, cwd or "", credentials, steps, env=env or {}
            )
        steps.append(f"decision: {decision.action} ({decision.rule})\n  {decision.message}")
        return "\n".join(steps)

    def explain_path(self, path: str, op: FileOp = "read") -> str:
        """Why the file operation ``op`` on ``path`` gets its decision, step by step."""
        loaded = self._refresh()
        steps = [f"policy: {self.path} (policy hash {self.hash().hex()[:16]}…)"]
        if loaded.rules is None:
            decision = broken_decision(loaded)
        else:
            decision = file_decision(self, loaded, path, op, steps)
        steps.append(f"decision: {decision.action} ({decision.rule})\n  {decision.message}")
        return "\n".join(steps)

    def denied_rule(self, path: str) -> str | None:
        """``denied_paths: …`` when ``path`` (as written or resolved) is inside a denied
        path, else None: what a file operation may never open, list or walk through."""
        hit = denied_hit(self._refresh(), path)
        return None if hit is None else f"denied_paths: {hit.entry.label}"

    def program_of(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> str | None:
        """The absolute path ``argv`` runs, found on the command's PATH (the daemon's unless
        the owner lets exec.env set it)."""
        return program_of(argv, cwd, env)


def load_policy(
    config_directory: Path,
    *,
    state_directory: Path | None = None,
    data_directory: Path | None = None,
) -> Policy:
    """The policy of ``<config_directory>/policy.toml`` (never raises: a broken file denies)."""
    return Policy(
        config_directory / POLICY_FILE, state_dir=state_directory, data_dir=data_directory
    )
