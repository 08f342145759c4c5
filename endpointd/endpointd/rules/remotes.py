"""Which repository a clone is: its remote, normalised, and its default branch, read from
the files in its git directory (no git process: the scan reads hundreds of clones).

:func:`normalize` turns every spelling of a remote into ``host/owner/name``: lower-case
host; no scheme, user, password, port, ``.git`` or trailing slash; scp-like
``git@host:owner/name.git`` read as git reads it. A local path (``/srv/git/app.git``,
``file://…``) has no host, and normalises to ``""``, as does anything unreadable. The
password of ``https://user:token@host/…`` is dropped with the user: a normalised remote is
safe to send.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

__all__ = [
    "Clone",
    "default_branch",
    "https_authority",
    "matches",
    "normalize",
    "preferred",
    "read_clone",
    "remote_of",
    "remotes",
]

# Schemes git speaks to a host; anything else with "://" (file://) has none.
_HOST_SCHEMES = frozenset(
    {"http", "https", "ssh", "git", "git+ssh", "ssh+git", "ftp", "ftps", "rsync"}
)
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)\Z", re.S)
# [user@]host:path, where the host part has no slash (git: "a slash before the first
# colon makes it a path").
_SCP = re.compile(r"(?:[^@/]*@)?(\[[^\]/]+\]|[^:/]+):(.*)\Z", re.S)
_SECTION = re.compile(r'\s*\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\s*\]\s*(.*)\Z')
_KEY = re.compile(r"\s*([A-Za-z][A-Za-z0-9-]*)\s*(?:=\s*(.*))?\Z")
# The most of a git config file read: a clone's is a few KiB.
_MAX_CONFIG = 1 << 20


def normalize(url: str) -> str:
    """``host/owner/name`` for a git remote URL; ``""`` for a local path or nonsense."""
    text = url.strip()
    if not text or any(ord(c) < 0x20 for c in text):
        return ""
    scheme = _SCHEME.match(text)
    if scheme is not None:
        if scheme.group(1).lower() not in _HOST_SCHEMES:
            return ""
        rest = re.split(r"[?#]", scheme.group(2), maxsplit=1)[0]
        authority, _, path = rest.partition("/")
        host = _host(authority.rpartition("@")[2])
    else:
        scp = _SCP.match(text)
        # "c:\src\app" and "c:/src/app" are Windows paths, not the host "c".
        if scp is None or (len(scp.group(1)) == 1 and scp.group(2)[:1] in ("\\", "/")):
            return ""
        host, path = _host(scp.group(1)), scp.group(2)
    path = re.sub(r"/{2,}", "/", path).strip("/")
    if path.lower().endswith(".git"):
        path = path[:-4].rstrip("/")
    if not host or not path:
        return ""
    return f"{host}/{path}"


def _host(authority: str) -> str:
    """The host of ``host[:port]`` or ``[v6]:port``, lower case."""
    if authority.startswith("["):
        end = authority.find("]")
        return authority[: end + 1].lower() if end > 0 else ""
    return authority.partition(":")[0].lower()


def https_authority(url: str) -> tuple[str, int] | None:
    """(host, port) of an https URL, as endpointd's git helper compares hosts; None for any
    other scheme (the helper answers https only)."""
    found = _SCHEME.match(url.strip())
    if found is None or found.group(1).lower() != "https":
        return None
    authority = found.group(2).partition("/")[0].rpartition("@")[2]
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = authority.partition(":")
    if not host or (port and not port.isdigit()):
        return None
    return host.lower(), int(port) if port else 443


def matches(remote: str, wanted: str) -> bool:
    """Is the normalised ``remote`` the repository ``wanted``? Compared without case; a
    ``wanted`` without a host (``acme/app``) matches the end of the path, as the control
    plane knows a repository by owner/name."""
    have = remote.lower().strip("/")
    want = wanted.lower().strip("/")
    if not have or not want:
        return False
    if have == want:
        return True
    if want.count("/") >= 2:
        return False  # a host is named: only an exact match
    return have.endswith("/" + want)


@dataclass(frozen=True)
class Clone:
    """A clone as the device reports it: its top-level directory, its remote (the name
    and the URL as configured, and normalised) and its default branch."""

    path: str
    remote_name: str
    remote_url: str
    remote: str  # normalised; "" without a remote
    default_branch: str


def remotes(config: str) -> list[tuple[str, str]]:
    """(name, url) of every ``[remote "NAME"]`` with a url, in file order (git's first
    url of a remote is the one it fetches from)."""
    found: dict[str, str] = {}
    section: tuple[str, str] | None = None
    for raw in config.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            head = _SECTION.match(line)
            if head is None:
                section = None
                continue
            name, sub, line = head.group(1).lower(), head.group(2), head.group(3)
            if sub is None and "." in name:  # the old [remote.origin] spelling
                name, _, sub = name.partition(".")
            section = (name, _unescape(sub) if sub is not None else "")
            if not line.strip():
                continue
        key = _KEY.match(line)
        if section is None or section[0] != "remote" or key is None:
            continue
        if key.group(1).lower() == "url" and key.group(2) is not None:
            found.setdefault(section[1], _value(key.group(2)))
    return list(found.items())


def preferred(found: list[tuple[str, str]]) -> tuple[str, str]:
    """The remote a clone is known by: ``origin``, else its first; ``("", "")`` if none."""
    return next(((n, u) for n, u in found if n == "origin"), found[0] if found else ("", ""))


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def _value(raw: str) -> str:
    """A config value: quotes removed, an unquoted comment cut, escapes resolved."""
    out: list[str] = []
    quoted = False
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == "\\" and i + 1 < len(raw):
            out.append({"n": "\n", "t": "\t", "b": "\b"}.get(raw[i + 1], raw[i + 1]))
            i += 2
            continue
        if c == '"':
            quoted = not quoted
        elif c in "#;" and not quoted:
            break
        else:
            out.append(c)
        i += 1
    return "".join(out).strip()


def _read(path: str, limit: int = _MAX_CONFIG) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _symref(path: str, prefix: str) -> str:
    """The branch a symbolic ref file names below ``prefix``, or ``""``."""
    text = _read(path, 4096).strip()
    if text.startswith("ref:"):
        target = text[4:].strip()
        if target.startswith(prefix):
            return target[len(prefix) :]
    return ""


def default_branch(git_dir: str, remote_name: str) -> str:
    """The remote's default branch as the clone knows it (``refs/remotes/R/HEAD``), else
    the branch checked out; ``""`` when neither is known (a detached HEAD)."""
    if remote_name:
        prefix = f"refs/remotes/{remote_name}/"
        found = _symref(os.path.join(git_dir, prefix, "HEAD"), prefix)
        if found:
            return found
    return _symref(os.path.join(git_dir, "HEAD"), "refs/heads/")


def read_clone(path: str) -> Clone | None:
    """The clone whose top-level directory is ``path`` (holding a ``.git`` directory), or
    None. Its remote is ``origin``, else its first."""
    git_dir = os.path.join(path, ".git")
    if not os.path.isdir(git_dir):
        return None
    name, url = preferred(remotes(_read(os.path.join(git_dir, "config"))))
    return Clone(
        path=path,
        remote_name=name,
        remote_url=url,
        remote=normalize(url),
        default_branch=default_branch(git_dir, name),
    )


def _common_dir(dot_git: str) -> str | None:
    """The common git directory a ``.git`` entry leads to: itself when a directory; for a
    ``.git`` file (a linked worktree, a submodule), the directory its ``gitdir:`` names,
    or that directory's ``commondir``."""
    if os.path.isdir(dot_git):
        return dot_git
    text = _read(dot_git, 4096).strip()
    if not text.startswith("gitdir:"):
        return None
    git_dir = os.path.join(os.path.dirname(dot_git), text[7:].strip())
    common = _read(os.path.join(git_dir, "commondir"), 4096).strip()
    return os.path.normpath(os.path.join(git_dir, common)) if common else git_dir


def remote_of(path: str) -> str:
    """The normalised remote (``origin``, else the first) of the repository holding
    ``path``, read from its files; ``""`` outside a repository or without a remote."""
    current = os.path.abspath(path)
    while True:
        dot_git = os.path.join(current, ".git")
        if os.path.lexists(dot_git):
            common = _common_dir(dot_git)
            if common is None:
                return ""
            return normalize(preferred(remotes(_read(os.path.join(common, "config"))))[1])
        parent = os.path.dirname(current)
        if parent == current:
            return ""
        current = parent
