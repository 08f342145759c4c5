"""A command's work done by a deployment over its HTTP API (the context's), not on a database.

The API is the console's (``/console/api/…``, docs/console.md): the same functions the
commands call on the database, behind the same access rule, answering JSON. Its errors
come back as ``{"error": {"code", "message"}}`` and are said in one line, as a command's
own would be; an unreachable server or a refused token says which context, and what to do.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

from controlplane.cli.contexts import Context, chosen, command_line
from controlplane.errors import ConfigError, SuperagentError

TIMEOUT_SECONDS = 30.0


class RemoteError(SuperagentError):
    """The deployment refused or failed a request; the message is its own, or what failed.
    ``status``: its HTTP status (0: no answer)."""

    code = "remote"

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def segment(value: str) -> str:
    """One path segment, whatever the user typed (``../x`` is a name, not a path)."""
    return quote(value, safe="")


class Remote:
    def __init__(self, context: Context) -> None:
        self.context = context

    def get(self, path: str, **params: Any) -> Any:
        return self._request("GET", path, params=params).json()

    def text(self, path: str) -> str:
        """A plain-text answer (a worker's message, whole)."""
        return str(self._request("GET", path, accept="text/plain").text)

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._request("POST", path, json=body or {}).json()

    def _request(
        self, method: str, path: str, accept: str = "application/json", **kwargs: Any
    ) -> httpx.Response:
        url = self.context.url.rstrip("/") + path
        headers = {"Authorization": f"Bearer {self.context.token}", "Accept": accept}
        try:
            with httpx.Client(timeout=TIMEOUT_SECONDS) as client:
                response = client.request(method, url, headers=headers, **kwargs)
        except httpx.HTTPError as exc:
            raise RemoteError(
                f"cannot reach {self.context.url} (context {self.context.name}: "
                f"{type(exc).__name__}: {exc}); is the control plane running there?"
            ) from None
        if response.status_code == 401:
            raise RemoteError(
                f"{self.context.url} refused the token of context {self.context.name} "
                f"({_message(response)}); `superagent login {self.context.url} --name "
                f"{self.context.name}` with a live token",
                401,
            )
        if response.status_code >= 400:
            raise RemoteError(_message(response), response.status_code)
        answered = response.headers.get("content-type", "").split(";")[0].strip()
        if answered != accept:
            raise RemoteError(
                f"{url} answered {response.status_code} with {answered or 'no content type'}, "
                f"not {accept}; is that the control plane's address?"
            )
        return response


def _message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
        message = error.get("message") if isinstance(error, dict) else None
    except (ValueError, AttributeError):
        message = None
    return str(message) if message else f"HTTP {response.status_code} from {response.url}"


def remote() -> Remote | None:
    """The deployment this command works through, or None: the database."""
    context = chosen()
    return None if context is None else Remote(context)


def not_over_http() -> ConfigError:
    """For a command that has no HTTP API yet, run with a context: say so, and how."""
    context = chosen()
    name = context.name if context else "?"
    return ConfigError(
        f"`{command_line()}` works on the database only, not yet over a context's HTTP API "
        f"(context {name}): run it where the database is, or with --context local"
    )
