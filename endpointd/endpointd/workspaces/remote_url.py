"""Which transport a remote's URL needs, and whether endpointd fetches over it at all.

The URL is the clone's ``remote.<name>.url`` as endpointd's own parser reads it
(:mod:`endpointd.rules.remotes`), after the rewrites of the owner's own configuration
(endpointd's environment), never the clone's. It is fetched only over ``https``,
``http``, ``ssh`` (``ssh://``, ``git+ssh://``, ``ssh+git://`` and scp-like
``[user@]host:path``), ``git`` or ``file`` (``file://`` and local paths), and git is told
that one transport (``GIT_ALLOW_PROTOCOL``): never ``ext::``, ``fd::`` or another remote
helper (``<helper>::<address>``). A local repository is a path like any other: it is
judged by the policy (a denied path is never fetched from).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote

from endpointd.workspaces.errors import WorkspaceError

__all__ = ["Transport", "transport"]

_SCHEMES = {
    "https": "https",
    "http": "http",
    "ssh": "ssh",
    "git+ssh": "ssh",
    "ssh+git": "ssh",
    "git": "git",
    "file": "file",
}
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
# [user@]host:path with no slash before the colon: git reads it as ssh.
_SCP = re.compile(r"(?:[^@/]*@)?(\[[^\]/]+\]|[^:/]+):")


@dataclass(frozen=True)
class Transport:
    protocol: str  # what GIT_ALLOW_PROTOCOL names
    local_path: str = ""  # for file: the repository's path


def transport(url: str, denied_rule: Callable[[str], str | None]) -> Transport:
    """The transport ``url`` needs; :class:`WorkspaceError` when endpointd does not fetch
    from it (another transport, or a local path the policy denies)."""
    text = url.strip()
    if not text or any(ord(c) < 0x20 for c in text) or text.startswith("-"):
        raise WorkspaceError(f"the remote {url!r} is not a URL endpointd fetches from")
    if "::" in text.partition("://")[0] and not _SCHEME.match(text):
        helper = text.partition("::")[0]
        raise WorkspaceError(
            f"the remote {url!r} names the git transport {helper!r}: endpointd fetches only"
            " over https, http, ssh, git or a local path"
        )
    scheme = _SCHEME.match(text)
    if scheme is not None:
        name = scheme.group(1).lower()
        protocol = _SCHEMES.get(name)
        if protocol is None:
            raise WorkspaceError(
                f"the remote {url!r} uses the transport {name!r}: endpointd fetches only"
                " over https, http, ssh, git or a local path"
            )
        if protocol != "file":
            return Transport(protocol)
        path = unquote(text[scheme.end() :].partition("?")[0])
        if path.startswith("localhost/"):
            path = path.removeprefix("localhost")
        return _local(path, url, denied_rule)
    if os.path.isabs(text) or text.startswith(("./", "../")):
        return _local(text, url, denied_rule)
    if _SCP.match(text):
        return Transport("ssh")
    raise WorkspaceError(f"the remote {url!r} is not a URL endpointd fetches from")


def _local(path: str, url: str, denied_rule: Callable[[str], str | None]) -> Transport:
    if not os.path.isabs(path):
        raise WorkspaceError(f"the remote {url!r} is a relative path: endpointd fetches by URL")
    rule = denied_rule(path) or denied_rule(os.path.realpath(path))
    if rule is not None:
        raise WorkspaceError(f"the remote {url!r} is a local repository under {rule}")
    return Transport("file", os.path.realpath(path))
