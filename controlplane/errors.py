"""The control plane's one error tree.

Domain code raises these; the HTTP layer maps them to status codes in one handler
(``api/errors.py``) and the gRPC layer in one function. Messages are written for the person
who will read them: what went wrong and what to do about it. They never carry secrets.
"""

from __future__ import annotations

import importlib.util


class SuperagentError(Exception):
    """Base of every error the control plane raises on purpose."""

    http_status = 500
    code = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(SuperagentError):
    """The configuration cannot work; the message names the setting and the fix."""

    code = "config"


class DatabaseNotMigrated(ConfigError):
    """The database schema is older (or newer) than this release expects."""

    code = "not_migrated"

    def __init__(self, current: str | None, expected: str) -> None:
        where = "an empty database" if current is None else f"revision {current}"
        super().__init__(
            f"the database is at {where}, this release needs revision {expected}; "
            "run `superagent migrate` first"
        )
        self.current = current
        self.expected = expected


class MissingExtra(ConfigError):
    """What is configured needs an optional part of the install (an extra) that is missing."""

    code = "missing_extra"

    def __init__(self, what: str, extra: str) -> None:
        super().__init__(
            f"{what} needs the {extra!r} extra, which is not installed: "
            f"pip install 'superagent-server[{extra}]'"
        )
        self.extra = extra


def require_extra(module: str, extra: str, what: str) -> None:
    """Raise :class:`MissingExtra` unless ``module`` (one the extra installs) can be imported.

    Looked up, not imported: the check costs nothing when the module is there.
    """
    if importlib.util.find_spec(module) is None:
        raise MissingExtra(what, extra)


class InvalidInput(SuperagentError):
    """The caller sent something malformed."""

    http_status = 400
    code = "invalid_input"


class PayloadTooLarge(InvalidInput):
    """The body is over the size this endpoint accepts."""

    http_status = 413
    code = "too_large"


class NotFound(SuperagentError):
    http_status = 404
    code = "not_found"


class Conflict(SuperagentError):
    http_status = 409
    code = "conflict"


class Unauthorized(SuperagentError):
    http_status = 401
    code = "unauthorized"


class Forbidden(SuperagentError):
    """The caller is known, but this is not theirs to do."""

    http_status = 403
    code = "forbidden"


class TooManyAttempts(SuperagentError):
    """Too many failed attempts from one place; ``retry_after`` seconds until the next."""

    http_status = 429
    code = "too_many_attempts"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TransientError(SuperagentError):
    """Something outside us failed in a way that may succeed if tried again later."""

    http_status = 503
    code = "unavailable"
