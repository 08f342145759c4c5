"""What every command shares: loading settings, logging, and turning errors into one line."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import asyncpg
import click
import sqlalchemy.exc
from pydantic import ValidationError

from controlplane import logs
from controlplane.errors import SuperagentError
from controlplane.settings import Settings


def fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@contextmanager
def clear_errors() -> Iterator[None]:
    """Expected failures print one line and exit non-zero; no stack traces for users."""
    try:
        yield
    except SuperagentError as exc:
        fail(exc.message)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
            for err in exc.errors()
        )
        fail(f"invalid configuration: {problems}")
    except (OSError, asyncpg.PostgresError, sqlalchemy.exc.DBAPIError) as exc:
        # Unreachable or refusing database: say which kind of failure, not a stack trace.
        detail = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        fail(f"database unavailable ({type(exc).__name__}: {detail}); check DATABASE_URL")


def load_settings(**overrides: Any) -> Settings:
    with clear_errors():
        settings = Settings()
        updates = {k: v for k, v in overrides.items() if v is not None}
        if updates:
            settings = settings.model_copy(update=updates)
        return settings


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logs.apply_format()
    # Third-party chatter that says nothing an operator needs at INFO.
    for noisy in ("pgserver", "uvicorn.error", "alembic.runtime.migration"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


def run_until_signalled(main: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> None:
    """Run ``main(stop)``; SIGINT/SIGTERM set ``stop``, a second Ctrl-C exits at once."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if stop.is_set():
                click.echo("\nforced exit", err=True)
                sys.exit(130)
            click.echo("\nstopping (Ctrl-C again to force)…", err=True)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        await main(stop)

    asyncio.run(runner())
