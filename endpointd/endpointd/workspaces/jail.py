"""endpointd's own git, confined with Landlock while a workspace is prepared.

The configuration endpointd gives git (:mod:`endpointd.workspaces.git`) already keeps a
clone's config from running anything. The jail is the second lock, and the one that holds
against a race: the git dirs and alternates :mod:`endpointd.workspaces.gitdirs` judged may
be changed by a command between that check and git's read, and only the kernel can then
keep git out of the denied paths.

Each git runs through a small trampoline (a fresh ``python -I -S``: the daemon has
threads, so no code runs between fork and exec) that applies the ruleset and execs git:

* **reads**: everything but the policy's denied paths, as for a command (built by
  :func:`endpointd.guard.sandbox.landlock_spec`); a fetch over ssh may also read the
  owner's ``~/.ssh`` (its keys, config and known hosts: ssh needs them, and the fetch
  runs no program of a command's);
* **writes**: only what the prepare writes: the clone's common git directory, the
  workspaces root, endpointd's scratch directory, the usual device files;
* **network**: no TCP connection at all, except, for the fetch, the remote's port (and
  the port of a proxy endpointd's environment names). Landlock names ports, not
  addresses: the destination is the URL endpointd chose.

It applies where Landlock does and the policy's sandbox is not ``off``; elsewhere git runs
with the configuration control alone.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from endpointd.guard import landlock, sandbox
from endpointd.guard.confinement import DEVICE_FILES, Confinement

if TYPE_CHECKING:
    from endpointd.guard.policy import Policy

__all__ = ["Jail", "confined", "current", "ports_for", "wrap"]

_TRAMPOLINE = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from endpointd.guard import landlock
spec = json.loads(os.environ.pop("ENDPOINTD_GIT_JAIL"))
rules = landlock.Ruleset(connect_ports=spec["connect_ports"], bind_ports=[])
grants = [(str(p), int(r)) for p, r in spec["read"] + spec["grants"]]
try:
    landlock.enforce(landlock.create(rules, grants))
except OSError as exc:
    sys.stderr.write("fatal: endpointd could not confine git: %s\\n" % exc)
    sys.exit(126)
os.execv(sys.argv[2], sys.argv[2:])
"""
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_DEFAULT_PORTS = {"https": 443, "http": 80, "ssh": 22, "git": 9418}


@dataclass(frozen=True)
class Jail:
    denied: tuple[str, ...]
    write: tuple[str, ...]
    ssh_dir: str


_current: contextvars.ContextVar[Jail | None] = contextvars.ContextVar("git_jail", default=None)


def current() -> Jail | None:
    return _current.get()


@contextlib.contextmanager
def confined(policy: Policy, write: Sequence[str | Path]) -> Iterator[None]:
    """Run endpointd's git confined (within this context, in this thread) where this
    machine and the policy allow."""
    rules = policy.rules
    if rules is None or rules.sandbox == "off" or landlock.abi_version() < 1:
        yield
        return
    jail = Jail(
        denied=tuple(str(d.path) for d in policy.denied_paths),
        write=tuple(os.path.realpath(w) for w in write),
        ssh_dir=os.path.realpath(Path.home() / ".ssh"),
    )
    token = _current.set(jail)
    try:
        yield
    finally:
        _current.reset(token)


def ports_for(url: str, protocol: str) -> list[int]:
    """The TCP ports a fetch of ``url`` over ``protocol`` connects to: the remote's, and
    that of a proxy named in endpointd's environment (for http and https)."""
    if protocol == "file":
        return []
    port = _DEFAULT_PORTS.get(protocol, 0)
    with contextlib.suppress(ValueError):
        if "://" in url:
            port = urlsplit(url).port or port
    ports = [port] if port else []
    if protocol in ("http", "https"):
        for name in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy"):
            value = os.environ.get(name, "")
            with contextlib.suppress(ValueError):
                proxy_port = urlsplit(value if "://" in value else f"http://{value}").port
                if value and proxy_port:
                    ports.append(proxy_port)
    return sorted(set(ports))


def _filesystem(jail: Jail, ssh: bool) -> dict[str, object]:
    # A root that does not exist yet grants nothing: computed again once it does.
    return _filesystem_cached(jail, ssh, tuple(os.path.isdir(w) for w in jail.write))


@functools.lru_cache(maxsize=16)
def _filesystem_cached(jail: Jail, ssh: bool, _present: tuple[bool, ...]) -> dict[str, object]:
    """The filesystem grants of ``jail`` (the same for every git of one prepare)."""
    denied = tuple(d for d in jail.denied if not (ssh and os.path.realpath(d) == jail.ssh_dir))
    confinement = Confinement(
        # The sandbox's own resolution of the denied paths (cached there).
        denied=sandbox._real_denied(denied),
        write=jail.write,
        write_files=DEVICE_FILES,
        network="deny",
        mechanism="landlock",
    )
    spec = sandbox.landlock_spec(confinement)
    return {"read": spec["read"], "grants": spec["grants"]}


def wrap(
    argv: Sequence[str], jail: Jail, *, connect_ports: Sequence[int], protocol: str
) -> tuple[list[str], dict[str, str]]:
    """The trampoline's argv for ``argv`` and what its environment must add."""
    payload = {**_filesystem(jail, protocol == "ssh"), "connect_ports": sorted(set(connect_ports))}
    wrapped = [sys.executable, "-I", "-S", "-c", _TRAMPOLINE, _PACKAGE_ROOT, *argv]
    return wrapped, {"ENDPOINTD_GIT_JAIL": json.dumps(payload)}
