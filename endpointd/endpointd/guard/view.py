"""What a confined command sees of the machine: an allow-list, as the mount operations
that build it (:mod:`endpointd.guard.mountview`) and the Landlock grants that enforce the
same list a second time.

The view holds, and nothing else:

* the system and toolchain directories, read-only (:data:`SYSTEM`, the daemon's own
  interpreter, the directories on its ``PATH``), with ``/etc``'s secrets masked;
* a private ``/tmp`` and ``/var/tmp``, a ``/dev`` of its own (the usual character devices,
  its own ptys, a private ``/dev/shm``), its own ``/proc`` and ``/sys`` read-only;
* the home directory as an empty read-only directory holding only what the owner grants
  (``readable_paths``, by default toolchains and caches, :data:`HOME_TOOLCHAINS`),
  read-only;
* per command: its workspace and TMPDIR and the owner's ``writable_paths`` read-write; in
  a ticket workspace its clone's git directory read-only with what a commit writes there
  read-write (never the clone's working tree, never another ticket's worktree); the git
  credential helper's socket when it has one; for a harness run, its program, its session
  store read-write and its login files read-only, at their own paths (the store links to
  them: :mod:`endpointd.harness.stores`).

What is in no view, even beneath a granted or writable directory (masked): the denied
paths, the credential files of :data:`NEVER_IN_VIEW` and the control plane's state
directory. Pathname Unix sockets are reachable only where the view holds them, so a
second ssh-agent, ``/tmp/ssh-*``, gpg-agent, Docker, Postgres and the system bus are not.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from functools import lru_cache

from endpointd.guard.files import within as _within

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Read-only, where they exist (a symlink such as /bin -> usr/bin is kept a symlink).
SYSTEM = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/nix/store",
    "/nix/var/nix/profiles",
    "/run/current-system",
    "/sys",
)
# What of /etc holds secrets of the machine (root's to read, but a command run by a root
# daemon is root): masked.
ETC_SECRETS = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh/ssh_host_rsa_key",
    "/etc/ssh/ssh_host_ecdsa_key",
    "/etc/ssh/ssh_host_ed25519_key",
    "/etc/ssh/ssh_host_dsa_key",
    "/etc/ssl/private",
    "/etc/NetworkManager/system-connections",
    "/etc/wireguard",
    "/etc/docker",
    "/etc/libvirt",
    "/etc/krb5.keytab",
    "/etc/security/opasswd",
    "/etc/cups/ssl",
)
# Granted by default beneath the home directory (read-only): toolchains and package
# caches, and git's own configuration (the owner's identity, which a run's commits are made
# with). No credential lives here (their credentials files, when any, are masked; git's
# credential stores are never in view).
HOME_TOOLCHAINS = (
    "~/.gitconfig",
    "~/.config/git/config",
    # git's default global ignore and attributes files: without them a command's commit
    # would take in what the owner ignores everywhere (.env, editor files).
    "~/.config/git/ignore",
    "~/.config/git/attributes",
    "~/.pyenv",
    "~/.rustup",
    "~/.cargo/bin",
    "~/.cargo/registry",
    "~/.cargo/git",
    "~/.nvm",
    "~/.volta",
    "~/.fnm",
    "~/.bun/bin",
    "~/.deno/bin",
    "~/.sdkman/candidates",
    "~/.local/bin",
    "~/go/bin",
    "~/go/pkg/mod",
    "~/.m2/repository",
    "~/.gradle/caches",
    "~/.gradle/wrapper",
    "~/.cache/pip",
    "~/.cache/uv",
    "~/.cache/go-build",
    "~/.npm/_cacache",
    # The same caches where macOS keeps them.
    "~/Library/Caches/pip",
    "~/Library/Caches/go-build",
)
# Never in a command's view, even beneath a directory it may read or write: credentials
# the built-in denied paths do not already cover, shell histories, harness logins (those
# are granted to that harness's own runs only) and the control plane's state.
NEVER_IN_VIEW = (
    "~/.git-credentials",
    "~/.config/git/credentials",
    "~/.npmrc",
    "~/.yarnrc",
    "~/.yarnrc.yml",
    "~/.cargo/credentials",
    "~/.cargo/credentials.toml",
    "~/.config/github-copilot",
    "~/.config/hub",
    "~/.config/glab-cli",
    "~/.config/op",
    "~/.1password",
    "~/.terraform.d",
    "~/.terraformrc",
    "~/.m2/settings.xml",
    "~/.m2/settings-security.xml",
    "~/.gradle/gradle.properties",
    "~/.ivy2/.credentials",
    "~/.gem/credentials",
    "~/.pgpass",
    "~/.my.cnf",
    "~/.s3cfg",
    "~/.boto",
    "~/.databrickscfg",
    "~/.config/rclone",
    "~/.config/containers/auth.json",
    "~/.docker",
    "~/.colima",
    "~/.rd",
    "~/.lima",
    "~/.claude/.credentials.json",
    "~/.claude.json",
    "~/.codex/auth.json",
    "~/.qwen/oauth_creds.json",
    "~/.gemini/oauth_creds.json",
    "~/.bash_history",
    "~/.zsh_history",
    "~/.history",
    "~/.sh_history",
    "~/.python_history",
    "~/.node_repl_history",
    "~/.psql_history",
    "~/.mysql_history",
    "~/.sqlite_history",
    "~/.rediscli_history",
    "~/.irb_history",
    "~/.lesshst",
    "~/.local/share/fish/fish_history",
    "~/.local/share/superagent",
)
# What the daemon's PATH may not bring into view as a "toolchain" (resolved: on macOS
# /tmp and /var are /private/tmp and /private/var).
_TOO_WIDE = (
    *("/", "/home", "/root", "/tmp", "/var", "/run", "/mnt", "/media", "/srv"),  # noqa: S108
    *("/private", "/private/tmp", "/private/var", "/private/var/folders", "/Users"),
    *("/Volumes", "/System/Volumes", "/System/Volumes/Data"),
)


def homes() -> tuple[str, ...]:
    """The home directory (``HOME``) and the account's own, when they differ."""
    return _homes(os.environ.get("HOME", ""), os.getuid())


@lru_cache(maxsize=4)
def _homes(_home: str, _uid: int) -> tuple[str, ...]:
    out = [os.path.realpath(os.path.expanduser("~"))]
    try:
        import pwd

        out.append(os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir))
    except (ImportError, KeyError, OSError):
        pass
    return tuple(dict.fromkeys(p for p in out if p and p != "/"))


def _expand(paths: Iterable[str], home_dirs: Sequence[str]) -> list[str]:
    out = []
    for path in paths:
        if path == "~" or path.startswith("~/"):
            out += [os.path.join(h, path[2:]) if path != "~" else h for h in home_dirs]
        else:
            out.append(path)
    return [os.path.realpath(p) for p in out]


def never_in_view(denied: Sequence[str], unhidden: Sequence[str] = ()) -> tuple[str, ...]:
    """The paths masked wherever the view would hold them: ``denied`` (already resolved),
    :data:`NEVER_IN_VIEW`, ``/etc``'s secrets and the control plane's state directory;
    except what ``unhidden`` grants (a harness's own login, for its runs)."""
    state = os.environ.get("SUPERAGENT_STATE_DIR", "")
    return _never(tuple(denied), tuple(unhidden), homes(), state, _stamp(homes()))


@lru_cache(maxsize=32)
def _never(
    denied: tuple[str, ...],
    unhidden: tuple[str, ...],
    home_dirs: tuple[str, ...],
    state: str,
    _stamp: tuple[int, ...],
) -> tuple[str, ...]:
    built_in = _expand(NEVER_IN_VIEW, home_dirs)
    if state and os.path.isabs(state):
        built_in.append(os.path.realpath(state))
    built_in = [p for p in built_in if not any(_within(p, u) for u in unhidden)]
    return tuple(dict.fromkeys([*denied, *built_in, *ETC_SECRETS]))


def _stamp(dirs: Iterable[str]) -> tuple[int, ...]:
    """The directories' mtimes: a cache key that changes when an entry is added, removed
    or replaced in them (a toolchain installed, a link swapped)."""
    out = []
    for d in dirs:
        try:
            out.append(os.stat(d).st_mtime_ns)
        except OSError:
            out.append(-1)
    return tuple(out)


def toolchains(readable: Iterable[str]) -> tuple[str, ...]:
    """Read-only beyond :data:`SYSTEM`: the daemon's interpreter (the git credential
    helper's client runs on it) and package, the directories on its ``PATH``, and what
    the owner grants (``readable``, ``~`` expanded; by default :data:`HOME_TOOLCHAINS`)."""
    home_dirs = homes()
    path = os.environ.get("PATH", "")
    return _toolchains(tuple(readable), path, home_dirs, _stamp(home_dirs))


@lru_cache(maxsize=32)
def _toolchains(
    readable: tuple[str, ...], path_var: str, home_dirs: tuple[str, ...], _stamp: tuple[int, ...]
) -> tuple[str, ...]:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package
    found = [sys.prefix, sys.base_prefix, sys.exec_prefix, here]
    found += [p for p in path_var.split(os.pathsep) if os.path.isabs(p)]
    out = []
    for path in _expand(found, home_dirs):
        if path in _TOO_WIDE or path in home_dirs or any(_within(h, path) for h in home_dirs):
            continue
        out.append(path)
    out += _expand(readable, home_dirs)
    return tuple(dict.fromkeys(p for p in out if os.path.exists(p)))


def _key(op: list[Any]) -> tuple[tuple[str, ...], int]:
    # Parents before what lies beneath them; at the same path a mask goes last (it wins).
    parts = tuple(p for p in op[1].split("/") if p)
    return parts, 1 if op[0] == "mask" else 0


def _contained(path: str, roots: Iterable[str]) -> bool:
    return any(_within(path, r) for r in roots)


@lru_cache(maxsize=16)
def base(
    read: tuple[str, ...], hidden: tuple[str, ...], home_dirs: tuple[str, ...]
) -> list[list[Any]]:
    """The operations every command's view starts from (mountview's ``base``); cached
    (the caller must not change what it gets)."""
    ops: list[list[Any]] = []
    roots: list[str] = []
    for path in SYSTEM:
        if os.path.islink(path):
            ops.append(["link", path, os.readlink(path)])
        elif os.path.exists(path):
            ops.append(["sys", path, None])
            roots.append(path)
    resolv = os.path.realpath("/etc/resolv.conf")  # (a symlink into /run, often)
    if not _contained(resolv, roots) and os.path.isfile(resolv):
        ops.append(["sys", resolv, None])
    for path in ("/tmp", "/var/tmp"):  # noqa: S108
        ops.append(["tmpfs", path, "1777"])
    ops += [["dev", "/dev", None], ["proc", "/proc", None]]
    for home in home_dirs:
        ops.append(["dir", home, "0700"])
    for path in read:
        # Not beneath a read-only root already in view; never a hidden path itself.
        if _contained(path, roots) or _contained(path, hidden):
            continue
        ops.append(["ro", path, None])
        roots.append(path)
    ops += [["mask", h, None] for h in hidden if _contained(h, roots)]
    return sorted(ops, key=_key)


def command(
    write: Sequence[str],
    write_files: Sequence[str],
    read: Sequence[str],
    hidden: Sequence[str],
    read_files: Sequence[str] = (),
) -> list[list[Any]]:
    """One command's own operations (mountview's ``finish``): what it writes, then what it
    reads beyond the base (its clone's git directory), masked as the base is; and the
    single files granted to it though hidden (a harness run's login, which its session
    store links to by their own paths)."""
    ops: list[list[Any]] = []
    rw: list[str] = []
    for path in read:
        if not _contained(path, hidden):
            ops.append(["ro", path, None])
    ops += [["ro", path, None] for path in read_files if os.path.isfile(path)]
    # (What it writes was judged by the caller: its TMPDIR lies in endpointd's own state
    # directory, hidden from every other command, on purpose.)
    for path in [*write, *write_files]:
        if os.path.exists(path):
            ops.append(["rw", path, None])
            rw.append(path)
    roots = [*rw, *read]
    ops += [["mask", h, None] for h in hidden if _contained(h, roots)]
    return sorted(ops, key=_key)


def harness_program(program: str) -> tuple[str, ...]:
    """What a harness run reads of its program beyond the base view: the program's
    directory (a link in node_modules/.bin, ~/.local/bin), and where that leads: an npm
    package with its dependencies (the node_modules holding it), or the directory of a
    single binary. (Its state is a session store of its own, its login the owner's files
    granted to the run alone: :mod:`endpointd.harness.stores`.)"""
    if not os.path.isabs(program):
        return ()
    read = [os.path.dirname(program)]
    resolved = os.path.realpath(program)
    parts = resolved.split(os.sep)
    if "node_modules" in parts:
        read.append(os.sep.join(parts[: parts.index("node_modules") + 1]))
    else:
        read.append(os.path.dirname(resolved))
    return tuple(read)
