"""What every command shares: loading settings, logging, and turning errors into one line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import asyncpg
import click
from pydantic import ValidationError

from controlplane import logs
from controlplane.errors import SuperagentError
from controlplane.settings import Settings, unknown_variables


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
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        # Unreachable or refusing database: say which kind of failure, not a stack trace.
        detail = next(iter(str(exc).splitlines()), "")
        fail(f"database unavailable ({type(exc).__name__}: {detail}); check DATABASE_URL")


def load_settings(**overrides: Any) -> Settings:
    with clear_errors():
        for line in unknown_variables(os.environ):
            click.echo(f"warning: {line}", err=True)
        settings = Settings()
        updates = {k: v for k, v in overrides.items() if v is not None}
        if updates:
            settings = settings.model_copy(update=updates)
        return settings


def setup_logging(level: str) -> None:
    handler = _QuietOnBrokenPipe(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    logs.apply_format()
    # Third-party chatter that says nothing an operator needs at INFO.
    for noisy in ("pgserver", "uvicorn.error", "alembic"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


class _QuietOnBrokenPipe(logging.StreamHandler):  # type: ignore[type-arg]
    """A stderr handler that, once its reader is gone, writes to /dev/null instead.

    Without it every log line would raise, print "--- Logging error ---" to that same
    broken stream and fail again: slow, and noisy for nobody.
    """

    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ValueError)):
            _silence_broken_streams()
            return
        super().handleError(record)


def _silence_broken_streams() -> None:
    """Point stdout/stderr at /dev/null, keeping their objects (and any handler on them)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            fd = stream.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)


F = TypeVar("F", bound=Callable[..., Any])

# Every command takes it (tests/controlplane/cli/test_cli_grammar.py): scripts read one
# JSON document on stdout, whatever the command did.
json_option: Callable[[F], F] = click.option(
    "--json", "as_json", is_flag=True, help="Machine-readable output."
)


def outcome(as_json: bool, data: Any, *lines: str) -> None:
    """What a command did: ``data`` as one JSON document with --json, else ``lines``."""
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
        return
    for line in lines:
        click.echo(line)


def say(message: str) -> None:
    """A line for the operator on stderr that can never fail: the terminal may be gone."""
    try:
        click.echo(message, err=True)
    except (OSError, ValueError):  # a broken pipe, a closed stream
        _silence_broken_streams()


def run_until_signalled(
    main: Callable[[asyncio.Event], Coroutine[Any, Any, None]], *, shutdown_timeout: float
) -> None:
    """Run ``main(stop)``; SIGINT/SIGTERM set ``stop``, a second Ctrl-C exits at once.

    The process is gone at the latest ``shutdown_timeout`` seconds after the first signal,
    whatever ``main`` is stuck on (a loop that ignores cancellation, a log line blocked on
    a full pipe). The signal handlers are plain ``signal.signal`` handlers, not the event
    loop's: they run even while the loop's thread is blocked in a write, and they set the
    stop flag before they do anything that could fail.
    """
    signalled = threading.Event()
    received: list[int] = []

    def deadline() -> None:
        signalled.wait()
        time.sleep(shutdown_timeout)
        # Past the deadline nothing may hold the process up: not atexit, not a flush.
        os._exit(128 + (received[0] if received else signal.SIGTERM))

    threading.Thread(target=deadline, name="shutdown-deadline", daemon=True).start()

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(signum: int, frame: object) -> None:
            first = not signalled.is_set()
            received.append(signum)
            signalled.set()
            # call_soon_threadsafe: this handler may interrupt the loop anywhere.
            loop.call_soon_threadsafe(stop.set)
            if first and signum == signal.SIGINT:
                # A person pressed Ctrl-C. (A SIGTERM comes from a supervisor, such as
                # `up` stopping its watchdog: no hint about Ctrl-C, no second line.)
                say("\nstopping (Ctrl-C again to force)…")
            elif signum == signal.SIGINT:
                say("\nforced exit")
                # Raised where the main thread is: cleanup still runs (the embedded
                # Postgres is stopped), and the deadline above still bounds it.
                raise SystemExit(130)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
        await main(stop)

    asyncio.run(runner())
