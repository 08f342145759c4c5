"""The workspaces' failures: each one line a control plane can show as it is."""

from __future__ import annotations

from endpointd.errors import EndpointdError

__all__ = ["FetchFailed", "GitError", "WorkspaceError"]


class WorkspaceError(EndpointdError):
    """A workspace could not be prepared, released or removed; the message says why."""


class GitError(WorkspaceError):
    """A git command endpointd ran failed; the message is one line."""


class FetchFailed(GitError):
    """Fetching from the clone's remote failed (``url``: the remote, as git reaches it):
    the daemon may try again with a credential the owner stored for that host."""

    def __init__(self, message: str, url: str) -> None:
        super().__init__(message)
        self.url = url
