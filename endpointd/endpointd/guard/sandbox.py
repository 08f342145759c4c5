"""The OS sandbox around every command: which mechanism this machine has, and what one
command may touch.

The daemon calls :func:`plan` for each exec, with the command's workspace (the ticket
workspace, else the allowed root, holding its working directory) and its private TMPDIR;
for a ticket workspace also the few places in its clone's git directory a commit writes
(``extra_write``, ``extra_write_files``: see :mod:`endpointd.workspaces.grants`). The result, a
:class:`~endpointd.guard.confinement.Confinement`, travels in the supervisor's spec; on
Linux :func:`landlock_spec` turns it into the explicit Landlock grants the supervisor
applies between fork and exec (:func:`endpointd.process.supervisor.confine_child`).

Modes (``sandbox`` in the policy):

* ``required`` (the default where the OS supports it): a command runs confined or not at
  all; what this kernel cannot enforce (an old Landlock ABI, no seccomp) refuses it with a
  message that names what is missing and the way out.
* ``best-effort``: confined as far as the OS allows; what it cannot enforce is named in the
  command's supervisor log and in ``endpointd status``.
* ``off``: no sandbox (the policy's rules still apply); chosen explicitly by the owner.

Landlock grants access rather than denying it, so "read everything except the denied
paths" is built as the complement: every ancestor of a denied path gets only the right to
list it, each of its other entries gets the full grant (see :func:`_complement`). The walk
lists a handful of directories (``/``, the home directory, ``~/.config``, …); it is cached
until one of them changes.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from endpointd.guard import capabilities, landlock, namespaces, netns, seccomp, view
from endpointd.guard.confinement import DEVICE_FILES, Confinement
from endpointd.guard.files import within as _within

TYPE_CHECKING = False
if TYPE_CHECKING:
    from endpointd.rules.tables import Rules
    from endpointd.rules.terms import NetworkMode, SandboxMode

# Rights beneath a writable root: everything the ABI knows (``create`` masks it).
_ALL = (1 << 16) - 1
_DEVICE = landlock.READ_FILE | landlock.WRITE_FILE | landlock.IOCTL_DEV


class SandboxUnavailable(Exception):
    """``sandbox = "required"`` and this machine cannot enforce all of it."""


@dataclass(frozen=True)
class Support:
    """What this machine offers for confining commands."""

    mechanism: str  # "landlock", "seatbelt", or "" (none)
    landlock_abi: int = 0
    seccomp: bool = False
    private_proc: bool = False
    # A network namespace per command under deny/proxy (guard/netns.py).
    netns: bool = False
    # Why commands could keep a capability ("" when none can: guard/capabilities.py).
    capabilities: str = ""

    def describe(self) -> str:
        if self.mechanism == "landlock":
            extra = " + seccomp" if self.seccomp else ""
            extra += " + private /proc" if self.private_proc else ""
            extra += " + network namespace" if self.netns else ""
            extra += " + no capabilities" if not self.capabilities else ""
            return f"Landlock ABI {self.landlock_abi}{extra}"
        if self.mechanism == "seatbelt":
            return "Seatbelt (sandbox-exec)"
        return "none"

    def missing(self, network: NetworkMode) -> list[str]:
        """What a command's confinement needs here that this machine cannot enforce."""
        if not self.mechanism:
            return [f"an OS sandbox (endpointd has none for {sys.platform})"]
        if self.mechanism != "landlock":
            return []
        out = landlock.Ruleset(
            connect_ports=None if network == "allow" else (), bind_ports=None
        ).unenforced(self.landlock_abi)
        if network != "allow" and not self.seccomp:
            out.append("blocking UDP and raw sockets (seccomp)")
        if not self.private_proc:
            why = namespaces.unavailable_reason()
            out.append(f"a private /proc hiding other processes (namespaces: {why})")
        if network != "allow" and not self.netns:
            why = netns.unavailable_reason()
            out.append(f"a network namespace closing every address ({why})")
        if self.capabilities:
            out.append(self.capabilities)
        return out


@lru_cache(maxsize=1)
def support() -> Support:
    if sys.platform.startswith("linux"):
        abi = landlock.abi_version()
        if abi >= 1:
            return Support(
                "landlock",
                abi,
                seccomp.supported(),
                namespaces.available(),
                # Made by a namespace's init: without a private /proc there is none.
                netns=namespaces.available() and netns.available(),
                capabilities=capabilities.unavailable_reason(),
            )
        return Support("")
    if sys.platform == "darwin" and os.path.exists("/usr/bin/sandbox-exec"):
        return Support("seatbelt")
    return Support("")


def describe(mode: SandboxMode, network: NetworkMode) -> str:
    """One line for `endpointd status`, the policy report and the control plane."""
    if mode == "off":
        return f"off (chosen in the policy); network {network}"
    here = support()
    missing = here.missing(network)
    state = mode if not missing else f"{mode}, cannot enforce: {'; '.join(missing)}"
    return f"{state}; {here.describe()}; network {network}"


def plan(
    rules: Rules,
    *,
    denied: Sequence[str],
    workspace: str,
    tmpdir: str,
    proxy_port: int | None = None,
    extra_write: Sequence[str] = (),
    extra_write_files: Sequence[str] = (),
    extra_read: Sequence[str] = (),
    own_write: Sequence[str] = (),
    read_files: Sequence[str] = (),
) -> Confinement:
    """The confinement of one command; :class:`SandboxUnavailable` when it is required
    and this machine cannot enforce it. ``extra_write``: more directories it may write
    (whole), ``extra_write_files``: single files it may write (not replace); neither ever
    opens a denied path. ``extra_read``: what this command may read beyond the view every
    command has (its clone's git directory, a harness's program), ``own_write``:
    directories endpointd made for this command alone inside its own (denied) state dir,
    granted like its TMPDIR (a harness run's session store); ``read_files``: single files
    it may read though denied (that run's login), in its view at their own paths (the
    store's links name them there)."""
    if rules.sandbox == "off":
        return Confinement(network="allow", mechanism="")
    here = support()
    missing = here.missing(rules.network)
    if missing and rules.sandbox == "required":
        raise SandboxUnavailable(
            "the local policy requires the sandbox and this machine cannot enforce "
            + "; ".join(missing)
            + ': set sandbox = "best-effort" (or "off") in policy.toml to run commands'
            " anyway"
        )
    if rules.network == "proxy" and proxy_port is None:
        raise SandboxUnavailable('network = "proxy" but no egress proxy runs for this command')
    denied_real = _real_denied(tuple(denied))
    # The owner's extra writable paths never open a denied one; the private TMPDIR is made
    # inside endpointd's (denied) state dir on purpose, for that very reason.
    extra = [_real(str(p)) for p in (*rules.writable_paths, *extra_write)]
    extra = [p for p in extra if not any(_within(p, d) for d in denied_real)]
    files = [_real(p) for p in extra_write_files]
    files = [p for p in files if not any(_within(p, d) for d in denied_real)]
    # The allow-listed view (endpointd.guard.view), where namespaces make one; Seatbelt
    # enforces the same list of reads in its profile (endpointd.guard.seatbelt).
    shown = here.mechanism == "landlock" and here.private_proc
    listed = shown or here.mechanism == "seatbelt"
    never: tuple[str, ...] = ()
    read: tuple[str, ...] = ()
    read_extra: tuple[str, ...] = ()
    if listed:
        # A run's login files are in its view (though denied): its store links to them.
        logins = [_real(p) for p in read_files]
        never = tuple(
            p
            for p in view.never_in_view(denied_real, logins)
            if not any(_within(p, f) for f in logins)
        )
        readable = rules.readable_paths
        grants = view.HOME_TOOLCHAINS if readable is None else [str(p) for p in readable]
        read = view.toolchains(grants)
        read_extra = tuple(
            p
            for p in (_real(str(e)) for e in extra_read)
            if os.path.exists(p) and not any(_within(p, d) for d in denied_real)
        )
    return Confinement(
        view=shown,
        reads_listed=listed,
        read=read,
        read_extra=read_extra,
        never=never,
        homes=view.homes() if listed else (),
        hidden_dirs=_socket_dirs(),
        hidden_files=_socket_files(),
        # Only Seatbelt can carve these out of a writable root; Landlock cannot (module doc).
        protected=_protected(_real(workspace)) if here.mechanism == "seatbelt" else (),
        denied=denied_real,
        write=(_real(workspace), _real(tmpdir), *(_real(p) for p in own_write), *extra),
        write_files=(*DEVICE_FILES, *files),
        read_files=tuple(_real(p) for p in read_files),
        network=rules.network,
        proxy_port=proxy_port,
        mechanism=here.mechanism,
        unenforced=tuple(missing),
    )


def _socket_dirs() -> tuple[str, ...]:
    """Directories of other programs' Unix sockets a command must not reach by path: the
    user's runtime dir (session bus, systemd --user, gpg-agent, keyring daemons, …) and
    the X server's and ICE's socket dirs."""
    found = [f"/run/user/{os.getuid()}", "/tmp/.X11-unix", "/tmp/.ICE-unix"]  # noqa: S108
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        found.append(os.path.realpath(runtime))
    return tuple(dict.fromkeys(found))


def _socket_files() -> tuple[str, ...]:
    """Single sockets to hide: the daemon's ssh-agent and the container engines'."""
    found = [
        "/var/run/docker.sock",
        "/run/docker.sock",
        "/run/containerd/containerd.sock",
        "/run/podman/podman.sock",
    ]
    agent = os.environ.get("SSH_AUTH_SOCK")
    if agent and os.path.isabs(agent):
        found.append(agent)
    return tuple(dict.fromkeys(os.path.realpath(p) for p in found))


def _protected(workspace: str) -> tuple[str, ...]:
    """The workspace's git hooks and config, kept read-only where the OS sandbox can carve
    them out of a writable root (Seatbelt; on Linux only file operations enforce it)."""
    out = []
    for repo in [workspace, *_subdirs(workspace)]:
        git = os.path.join(repo, ".git")
        if os.path.isdir(git):
            out += [os.path.join(git, "hooks"), os.path.join(git, "config")]
    return tuple(out)


def _subdirs(path: str) -> list[str]:
    try:
        with os.scandir(path) as entries:
            return [e.path for e in entries if e.is_dir(follow_symlinks=False)][:200]
    except OSError:
        return []


def _real(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))


def _real_denied(denied: tuple[str, ...]) -> tuple[str, ...]:
    """The denied paths resolved, as :func:`_real`; resolved again only once a directory on
    the way to one of them has changed (a symlink swapped in is a change to its parent)."""
    paths = tuple(os.path.expanduser(p) for p in denied)
    return _real_denied_cached(paths, _stamps("/", paths))


@lru_cache(maxsize=16)
def _real_denied_cached(paths: tuple[str, ...], _stamps: tuple[int, ...]) -> tuple[str, ...]:
    return tuple(os.path.realpath(p) for p in paths)


# --------------------------------------------------------------------------- Landlock


def landlock_spec(c: Confinement) -> dict[str, object]:
    """What the supervisor needs to confine the command with Landlock (plain JSON)."""
    if c.network == "allow":
        connect: list[int] | None = None
    else:
        connect = [c.proxy_port] if c.network == "proxy" and c.proxy_port else []
    bind: list[int] | None = None if c.network == "allow" else []
    seccomp_mode = "" if c.network == "allow" else c.network
    isolated = c.network != "allow" and support().netns
    if isolated and c.network == "deny":
        # The namespace holds nothing but its own loopback, so ports mean nothing there: a
        # command may run servers on it. Seccomp still keeps it to TCP and Unix sockets
        # (vsock, netlink, packet and the like do not stop at a network namespace).
        connect = bind = None
        seccomp_mode = "proxy"
    spec: dict[str, object] = {
        "connect_ports": connect,
        "bind_ports": bind,
        "seccomp": seccomp_mode,
        # guard/netns.py: the namespace, and the proxy's address inside it.
        "netns": c.network if isolated else "",
        "proxy_port": c.proxy_port if isolated and c.network == "proxy" else None,
        "private_proc": support().private_proc,
        "hidden_dirs": list(c.hidden_dirs),
        "hidden_files": list(c.hidden_files),
    }
    if c.view:
        spec.update(_view_spec(c))
        return spec
    denied = _outermost(c.denied)
    grants: list[tuple[str, int]] = []
    for root in c.write:
        if os.path.isdir(root):
            grants += _complement(root, _ALL, [d for d in denied if _within(d, root)])
    grants += [(f, _DEVICE) for f in c.write_files if os.path.exists(f)]
    grants += [(f, landlock.READ_FILE) for f in c.read_files if os.path.isfile(f)]
    # Reads: the same for every command until a listed directory changes, so a spare
    # builds them into its ruleset before the command is known (process/nsinit.py).
    spec.update(read=_complement("/", landlock.READ, denied), grants=grants)
    return spec


def _view_spec(c: Confinement) -> dict[str, object]:
    """The allow-listed view and the Landlock grants of the same list (in view paths):
    ``view`` (the same for every command until the grants change: built ahead), ``read``
    (its grants, also ahead), ``view_command`` and ``grants`` (this command's), ``beside``
    (the private tmpfs areas: what lies there but for the mounts in them, worked out by
    the init once they are all made)."""
    never = _outermost(c.never)
    base = view.base(c.read, never, c.homes)
    files = [f for f in c.write_files if f not in DEVICE_FILES]
    command = view.command(_collapse(c.write), files, c.read_extra, never, c.read_files)
    read = _view_reads(c.read, never, c.homes)
    grants: list[tuple[str, int]] = []
    for root in c.write:
        if os.path.isdir(root):
            grants += _complement(root, _ALL, _inside(never, root))
    grants += [(f, _DEVICE) for f in files if os.path.exists(f)]
    for root in c.read_extra:
        grants += _complement(root, landlock.READ, _inside(never, root))
    grants += [(f, landlock.READ_FILE) for f in c.read_files if os.path.isfile(f)]
    beside = [[p, _ALL] for p in ("/tmp", "/var/tmp")]  # noqa: S108
    beside += [[h, landlock.READ] for h in c.homes]
    return {
        "view": base,
        "view_command": command,
        "read": read,
        "grants": grants,
        "beside": beside,
    }


def _view_reads(
    read: tuple[str, ...], never: tuple[str, ...], homes: tuple[str, ...]
) -> list[tuple[str, int]]:
    """The Landlock read grants of the view's base: the same for every command until a
    directory listed for them changes (:func:`_complement` is cached the same way)."""
    out: list[tuple[str, int]] = [("/", landlock.READ_DIR), ("/proc", landlock.READ)]
    out += [(f"/dev/{name}", _DEVICE) for name in ("null", "zero", "full", "random", "urandom")]
    out += [("/dev/tty", _DEVICE), ("/dev/pts", _DEVICE | landlock.READ_DIR)]
    out += [("/dev/shm", _ALL)]  # noqa: S108 (its own, private)
    # /etc's secrets are masked in the view (and root's alone to read), but not carved out
    # of Landlock's /etc grant: that would be a rule per entry of /etc, some 150 more rules
    # for every command's init to make.
    carved = tuple(n for n in never if n not in view.ETC_SECRETS)
    for kind, path, _ in view.base(read, never, homes):
        if kind in ("sys", "ro"):
            out += _complement(path, landlock.READ, _inside(carved, path))
    return out


@lru_cache(maxsize=256)
def _inside(paths: tuple[str, ...], root: str) -> list[str]:
    return [p for p in paths if _within(p, root)]


def _collapse(dirs: Sequence[str]) -> list[str]:
    """The writable directories as mounts: many siblings (a clone's 256 loose-object
    directories) as their parent, since a mount each would cost a millisecond. Landlock
    still grants the siblings alone."""
    by_parent: dict[str, list[str]] = {}
    for d in dirs:
        by_parent.setdefault(os.path.dirname(d), []).append(d)
    out: list[str] = []
    for parent, children in by_parent.items():
        out += [parent] if len(children) >= 16 else children
    return list(dict.fromkeys(out))


@lru_cache(maxsize=16)
def _outermost(paths: tuple[str, ...]) -> tuple[str, ...]:
    """The paths, without those inside another of them."""
    unique = sorted(set(paths))
    return tuple(p for p in unique if not any(q != p and _within(p, q) for q in unique))


def _complement(root: str, rights: int, excluded: Sequence[str]) -> list[tuple[str, int]]:
    """Grants of ``rights`` on everything beneath ``root`` except beneath ``excluded``.

    A directory on the way to an excluded path gets only ``READ_DIR`` (listing its names;
    since Landlock grants apply to whole hierarchies, anything more would reach the excluded
    path too); each of its other entries gets ``rights``. New entries made later directly
    in such a directory are not covered: it is listed again once its mtime changes.
    """
    inside = [e for e in excluded if _within(e, root)]
    if not inside:
        return [(root, rights)]
    if any(e == root for e in inside):
        return []
    return list(_complement_cached(root, rights, tuple(sorted(inside)), _stamps(root, inside)))


def _stamps(root: str, excluded: Sequence[str]) -> tuple[int, ...]:
    """The mtimes of the directories the walk lists: its cache key."""
    dirs = set()
    for e in excluded:
        parent = os.path.dirname(e)
        while _within(parent, root):
            dirs.add(parent)
            if parent == root:
                break
            parent = os.path.dirname(parent)
    out = []
    for d in sorted(dirs):
        try:
            out.append(os.stat(d).st_mtime_ns)
        except OSError:
            out.append(-1)
    return tuple(out)


@lru_cache(maxsize=64)
def _complement_cached(
    root: str, rights: int, excluded: tuple[str, ...], _stamps: tuple[int, ...]
) -> tuple[tuple[str, int], ...]:
    grants: list[tuple[str, int]] = [(root, landlock.READ_DIR)]
    names: list[str] = []
    with contextlib.suppress(OSError):
        names = os.listdir(root)
    for name in sorted(names):
        child = os.path.join(root, name)
        grants += _complement(child, rights, excluded)
    return tuple(grants)
