"""What `endpointd sandbox check` plants before its probes run, and removes after.

Everything is the check's own, clearly marked (``endpointd-sandbox-check-<random>``):

* canary files (a random token each) in the credential locations the reads probe: a file
  *inside* ``~/.ssh``, ``~/.aws``, ``~/.config/gh``, ``~/.config/github-copilot``,
  ``~/.cargo``, the control plane's state directory, endpointd's state and config
  directories, a marked dotfile in the home directory, and ``~/.npmrc`` itself only
  where there is none. The owner's own files there are
  never opened, by the check or by the probes;
* for the persistence probes: an empty ``~/.bashrc`` only when there is none (an existing
  one is opened for writing by the probe, and nothing is written), the autostart, systemd
  user unit, ``~/.local/bin`` and Claude Code shell-snapshot directories when missing,
  and a scratch "owner's checkout" (a git repository of its own);
* a ticket workspace for the probes to run in, and another ticket's, both real git
  worktrees of that checkout on ``superagent/*`` branches, granted as the daemon grants a
  ticket's workspace (:mod:`endpointd.workspaces.grants`);
* listening sockets: Unix sockets in the home directory, in ``/tmp``, in an
  ssh-agent-like ``/tmp/ssh-*/agent.*``, in the runtime dir, in the control plane's state
  directory (where its Postgres listens) and beneath a denied path (``~/.gnupg``); TCP on
  loopback, on this machine's non-loopback address and, under ``network = "proxy"``, on
  the proxy's port at another loopback address; UDP on loopback. Nothing is ever
  accepted or sent back;
* a pty pair, standing for a terminal of the owner's, and a process of the owner's with a
  canary in its environment.

Directories the scene had to create are removed again (only if empty), files with
``unlink`` (which never follows a link), so the cleanup cannot be steered elsewhere by
whatever the probes did.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from endpointd.workspaces import grants
from endpointd.workspaces.store import Record
from superagent_shared import branches

MARK = "endpointd-sandbox-check"
# Unix socket paths are limited to 107 bytes on Linux (103 on macOS).
_MAX_SOCKET_PATH = 103
_GIT_TIMEOUT = 20.0


class SceneError(Exception):
    """The scene could not be planted (a message for the owner)."""


class Scene:
    """The planted world; ``targets`` maps a probe's target key to its path or address
    ("" when this machine has nothing to probe there, with the reason in ``skipped``)."""

    def __init__(
        self,
        *,
        home: Path,
        workspaces_root: Path,
        scratch_parent: Path,
        endpointd_state: Path,
        endpointd_config: Path,
        controlplane_state: Path,
    ) -> None:
        self.home = home
        self.workspaces_root = workspaces_root
        self.scratch_parent = scratch_parent
        self.endpointd_state = endpointd_state
        self.endpointd_config = endpointd_config
        self.controlplane_state = controlplane_state
        self.run_id = secrets.token_hex(4)
        self.name = f"{MARK}-{self.run_id}"
        # Socket paths are short (see _MAX_SOCKET_PATH), so their names are too.
        self.socket_name = f"endpointd-check-{self.run_id}.sock"
        self.token = f"{MARK}-canary-{secrets.token_hex(12)}"
        self.targets: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        self.workspace = Path()
        self.write_dirs: tuple[str, ...] = ()
        self.write_files: tuple[str, ...] = ()
        self.read_dirs: tuple[str, ...] = ()
        self._files: list[str] = []  # to unlink
        self._dirs: list[str] = []  # made here, to rmdir (innermost last in the list)
        self._trees: list[str] = []  # wholly ours, to rmtree
        self._closers: list[socket.socket | int] = []
        self._process: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ planting

    def plant(self, *, proxy_port: int | None = None) -> None:
        try:
            self._plant_checkout()
            self._plant_canaries()
            self._plant_persistence()
            self._plant_sockets()
            self._plant_listeners(proxy_port)
            self._plant_pty()
            self._plant_status()
            self._plant_process()
        except (OSError, subprocess.SubprocessError) as exc:
            self.remove()
            raise SceneError(f"cannot prepare the probes: {exc}") from None

    def _mkdirs(self, path: Path, mode: int = 0o700) -> None:
        """``path`` and its missing parents; the ones made here are removed again."""
        missing = []
        p = path
        while not p.exists():
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            d.mkdir(mode=mode)
            self._dirs.append(str(d))

    def _file(self, path: Path, content: str = "") -> str:
        self._mkdirs(path.parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, content.encode())
        finally:
            os.close(fd)
        self._files.append(str(path))
        return str(path)

    def _canary(self, key: str, directory: Path) -> None:
        self.targets[key] = self._file(directory / self.name, self.token)

    def _plant_canaries(self) -> None:
        home = self.home
        self._canary("ssh", home / ".ssh")
        self._canary("aws", home / ".aws")
        self._canary("gh", home / ".config" / "gh")
        self._canary("copilot", home / ".config" / "github-copilot")
        self._canary("cargo", home / ".cargo")
        self.targets["dotfile"] = self._file(home / f".{self.name}.npmrc", self.token)
        npmrc = home / ".npmrc"
        if npmrc.exists() or npmrc.is_symlink():
            self.skipped["npmrc"] = "yours exists, and is never opened"
        else:
            # A comment line, harmless to npm should the file ever be left behind.
            self.targets["npmrc"] = self._file(npmrc, f"; {self.token}\n")
        self._canary("controlplane", self.controlplane_state)
        self._canary("endpointd_state", self.endpointd_state)
        self._canary("endpointd_config", self.endpointd_config)
        self.targets["other_file"] = self._file(self._other / f"{self.name}.txt", self.token)

    def _plant_persistence(self) -> None:
        home = self.home
        bashrc = home / ".bashrc"
        if not bashrc.exists() and not bashrc.is_symlink():
            self._file(bashrc)
        self.targets["bashrc"] = str(bashrc)
        self._removable("home_new", home / f".{self.name}.bash_login")
        autostart = home / ".config" / "autostart"
        self._mkdirs(autostart)
        self._removable("autostart", autostart / f"{self.name}.desktop")
        units = home / ".config" / "systemd" / "user"
        self._mkdirs(units)
        self._removable("systemd_unit", units / f"{self.name}.service")
        local_bin = home / ".local" / "bin"
        self._mkdirs(local_bin)
        self._removable("local_bin", local_bin / self.name)
        snapshots = home / ".claude" / "shell-snapshots"
        self._mkdirs(snapshots)
        self._removable("harness_store", snapshots / f"{self.name}.sh")
        git = self._checkout / ".git"
        self._removable("checkout_hook", git / "hooks" / "post-checkout")
        self.targets["checkout_config"] = str(git / "config")
        self._removable("checkout_envrc", self._checkout / ".envrc")
        self._removable("other_new", self._other / f"{self.name}.new")
        self._removable("mknod", self.workspace / f"{self.name}.node")

    def _removable(self, key: str, path: Path) -> None:
        """A path a probe tries to create: removed after, in case the probe could not."""
        self.targets[key] = str(path)
        self._files.append(str(path))

    # ------------------------------------------------------------------ workspaces

    def _plant_checkout(self) -> None:
        """A scratch checkout and two ticket worktrees of it, ours and another's."""
        scratch = self.scratch_parent / self.name
        self._mkdirs(self.scratch_parent)
        scratch.mkdir(mode=0o700)
        self._trees.append(str(scratch))
        self._checkout = scratch / "checkout"
        self._checkout.mkdir()
        self._mkdirs(self.workspaces_root)
        self.workspace = self.workspaces_root / self.name
        self._other = self.workspaces_root / f"{self.name}-other"
        self._trees += [str(self.workspace), str(self._other)]
        git = shutil.which("git")
        if git is None:
            # Plain directories: the probes that need git are reported as not checked.
            self.workspace.mkdir(mode=0o700)
            self._other.mkdir(mode=0o700)
            (self._checkout / ".git" / "hooks").mkdir(parents=True)
            (self._checkout / ".git" / "config").write_text("")
            for key in ("other_ref", "owner_ref", "planted_ref"):
                self.skipped[key] = "git is not installed"
            return
        self._git(git, "init", "-q", "-b", "main", str(self._checkout))
        self._git(git, "-C", str(self._checkout), "commit", "-q", "--allow-empty", "-m", "scratch")
        (self._checkout / ".git" / "hooks").mkdir(exist_ok=True)
        records = []
        for path in (self.workspace, self._other):
            full = branches.ticket_branch(path.name)
            checkout = str(self._checkout)
            self._git(git, "-C", checkout, "worktree", "add", "-q", "-b", full, str(path))
            records.append(self._record(path, full))
        dirs, files = grants.write_grants(records[0])
        grants.ensure(records[0])
        self.write_dirs, self.write_files = dirs, files
        self.read_dirs = grants.read_grants(records[0])
        common = Path(records[1].common_dir)
        self.targets["other_ref"] = str(common / "refs" / "heads" / records[1].branch)
        self.targets["owner_ref"] = str(common / "refs" / "heads" / "main")
        self._removable("planted_ref", common / "refs" / "heads" / branches.PREFIX / self.name)

    def _record(self, path: Path, branch: str) -> Record:
        """The workspace record the daemon would keep for this worktree."""
        common = (self._checkout / ".git").resolve()
        # `git worktree add` names the admin directory after the worktree's basename.
        gitfile = (path / ".git").read_text().strip()
        admin = Path(gitfile.removeprefix("gitdir:").strip()).resolve()
        return Record(
            ticket=path.name,
            path=str(path),
            state="active",
            clone=str(self._checkout),
            common_dir=str(common),
            admin_dir=str(admin),
            branch=branch,
        )

    def _git(self, git: str, *args: str) -> None:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_AUTHOR_NAME": MARK,
            "GIT_AUTHOR_EMAIL": f"{MARK}@localhost",
            "GIT_COMMITTER_NAME": MARK,
            "GIT_COMMITTER_EMAIL": f"{MARK}@localhost",
            "LC_ALL": "C",
        }
        subprocess.run(
            [git, "-c", "core.hooksPath=/dev/null", *args],
            env=env,
            check=True,
            capture_output=True,
            timeout=_GIT_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )

    # ------------------------------------------------------------------ listeners

    def _unix(self, key: str, path: Path) -> None:
        if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
            self.skipped[key] = f"the path is too long for a socket: {path}"
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._closers.append(sock)
        sock.bind(str(path))
        self._files.append(str(path))
        sock.listen(8)
        self.targets[key] = str(path)

    def _plant_sockets(self) -> None:
        tmp = Path("/tmp")  # noqa: S108 (where other programs' sockets live, on purpose)
        self._unix("home_socket", self.home / f".{self.socket_name}")
        self._unix("tmp_socket", tmp / self.socket_name)
        agent_dir = tmp / f"ssh-{self.name}"
        agent_dir.mkdir(mode=0o700)
        self._trees.append(str(agent_dir))
        self._unix("agent_socket", agent_dir / f"agent.{os.getpid()}")
        # Where the control plane's embedded Postgres listens, and a socket beneath a
        # denied path, as gpg-agent's ~/.gnupg/S.gpg-agent.ssh is.
        self._unix("controlplane_socket", self.controlplane_state / self.socket_name)
        gnupg = self.home / ".gnupg"
        self._mkdirs(gnupg)
        self._unix("denied_socket", gnupg / self.socket_name)
        if sys.platform.startswith("linux"):
            abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._closers.append(abstract)
            abstract.bind("\0" + self.socket_name)
            abstract.listen(8)
            self.targets["abstract_socket"] = "@" + self.socket_name
        else:
            self.skipped["abstract_socket"] = "abstract sockets are Linux's"
        runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
        if os.path.isabs(runtime) and os.path.isdir(runtime):
            self._unix("run_socket", Path(runtime) / self.socket_name)
        else:
            self.skipped["run_socket"] = "this session has no runtime dir"

    def _tcp(self, key: str, host: str, port: int = 0) -> None:
        try:
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        except OSError as exc:
            self.skipped[key] = f"no socket for {host}: {exc.strerror or exc}"
            return
        self._closers.append(sock)
        try:
            sock.bind((host, port))
        except OSError as exc:
            self.skipped[key] = f"cannot listen on {host}:{port}: {exc.strerror or exc}"
            return
        sock.listen(8)
        self.targets[key] = f"{host}:{sock.getsockname()[1]}"

    def _plant_listeners(self, proxy_port: int | None) -> None:
        self._tcp("loopback", "127.0.0.1")
        self._tcp("loopback6", "::1")
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._closers.append(udp)
        udp.bind(("127.0.0.1", 0))
        self.targets["udp"] = f"127.0.0.1:{udp.getsockname()[1]}"
        outside = _outside_address()
        if outside is None:
            self.skipped["outside"] = "this machine has no non-loopback IPv4 address"
        else:
            self._tcp("outside", outside)
        if proxy_port is None:
            self.skipped["proxy_port"] = 'only under network = "proxy"'
            self.skipped["proxy_port6"] = 'only under network = "proxy"'
        else:
            # The proxy listens on 127.0.0.1; the same port at another address must be
            # as unreachable as any other (Landlock's network rule names only a port).
            self._tcp("proxy_port", "127.0.0.2", proxy_port)
            self._tcp("proxy_port6", "::1", proxy_port)

    def _plant_status(self) -> None:
        """Where the privileges probes read what the command holds (Linux's /proc)."""
        if sys.platform.startswith("linux"):
            self.targets["proc_status"] = "/proc/self/status"
        else:
            self.skipped["proc_status"] = "read from /proc, which is Linux's"

    def _plant_pty(self) -> None:
        primary, secondary = os.openpty()
        self._closers += [primary, secondary]
        self.targets["pty"] = os.ttyname(secondary)

    def _plant_process(self) -> None:
        """Another process of the owner's, outside the sandbox, with a canary in its
        environment (as a login shell holds AWS_SECRET_ACCESS_KEY): it waits on a pipe and
        ends when the scene closes it."""
        read_end, write_end = os.pipe()
        self._closers.append(write_end)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", "import sys; sys.stdin.read()"],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={"ENDPOINTD_SANDBOX_CHECK_CANARY": self.token},
                start_new_session=True,
            )
        finally:
            os.close(read_end)
        self._process = proc
        self.targets["process"] = str(proc.pid)
        self.targets["environ"] = f"/proc/{proc.pid}/environ"

    # ------------------------------------------------------------------ removal

    def remove(self) -> None:
        """Remove everything planted; never raises, never follows a link."""
        for closer in self._closers:
            with contextlib.suppress(OSError):
                if isinstance(closer, int):
                    os.close(closer)
                else:
                    closer.close()
        self._closers = []
        if self._process is not None:
            # Its stdin closed above, it ends by itself; a stuck one is killed.
            try:
                self._process.wait(2)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        for path in self._files:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self._files = []
        for tree in self._trees:
            shutil.rmtree(tree, ignore_errors=True)
        self._trees = []
        for directory in reversed(self._dirs):
            with contextlib.suppress(OSError):
                os.rmdir(directory)
        self._dirs = []


def _outside_address() -> str | None:
    """This machine's IPv4 address on its default route (no packet is sent), else None."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: a route lookup only
        address = str(s.getsockname()[0])
        if not address.startswith("127.") and address != "0.0.0.0":  # noqa: S104
            return address
    return None
