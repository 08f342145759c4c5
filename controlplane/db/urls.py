"""Database URL spellings: users write ``postgresql://``; SQLAlchemy and asyncpg differ."""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url

from controlplane.errors import ConfigError


def parse(url: str) -> URL:
    try:
        parsed = make_url(url)
    except Exception as exc:  # sqlalchemy raises ArgumentError with the raw URL inside
        raise ConfigError(
            "DATABASE_URL is not a valid URL; expected postgresql://user:password@host:port/db"
        ) from exc
    if parsed.get_backend_name() not in {"postgresql", "postgres"}:
        raise ConfigError(f"DATABASE_URL must point at Postgres, not {parsed.get_backend_name()!r}")
    return parsed


def sqlalchemy_url(url: str) -> URL:
    """The URL for SQLAlchemy's async engine (the asyncpg driver)."""
    return parse(url).set(drivername="postgresql+asyncpg")


def asyncpg_dsn(url: str) -> str:
    """The DSN for raw asyncpg connections (the outbox hot path and LISTEN)."""
    return parse(url).set(drivername="postgresql").render_as_string(hide_password=False)


def redacted(url: str) -> str:
    """The URL safe to print: the password is masked."""
    try:
        return parse(url).render_as_string(hide_password=True)
    except ConfigError:
        return "<invalid DATABASE_URL>"
