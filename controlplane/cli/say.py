"""``superagent say``: talk to the agent from the terminal, through the web chat's websocket.

The running control plane does the work (this command only speaks the chat protocol of
:mod:`controlplane.channels.webchat.connection`), so what is said here shows up in the
console's chat page as well, and a conversation can go on in either place.

stdout carries only the agent's replies, so they can be piped; the conversation id and
hints go to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import uuid
from dataclasses import dataclass, field
from ipaddress import ip_address
from typing import Any, NoReturn
from urllib.parse import quote, urlsplit, urlunsplit

import click
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from controlplane.access import admin_token
from controlplane.cli.common import fail, load_settings, setup_logging
from controlplane.settings import Settings

OPEN_TIMEOUT = 10.0
MORE_REPLIES_SECONDS = 1.0  # after a reply, how long to wait for another one of the same turn
CLOSE_UNAUTHORIZED = 1008  # as controlplane.channels.webchat.connection


class SayError(Exception):
    """One line for the user; ``code`` is the exit status."""


@dataclass
class Outcome:
    thread: str = ""
    trigger: str = ""
    verdict: str = ""
    route: str = ""
    replies: list[dict[str, Any]] = field(default_factory=list)


def _default_url(settings: Settings) -> str:
    host = settings.http.host
    if host in ("", "0.0.0.0", "::"):  # noqa: S104 - a wildcard bind, reached on loopback
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.http.port}"


def _socket_url(url: str, name: str) -> str:
    parts = urlsplit(url.rstrip("/"))
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise SayError(f"--url must look like http://HOST:PORT, not {url!r}")
    return urlunsplit((scheme, parts.netloc, parts.path + "/chat/ws", f"name={quote(name)}", ""))


def _loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


async def _frame(ws: ClientConnection, deadline: float) -> dict[str, Any]:
    """The next server frame; TimeoutError at ``deadline`` (a time.monotonic() value)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    raw = await asyncio.wait_for(ws.recv(), left)
    frame = json.loads(raw)
    if not isinstance(frame, dict):
        raise SayError("the control plane sent something that is not a chat frame")
    return frame


async def _refusal(ws: ClientConnection, message: str, *, has_token: bool, url: str) -> SayError:
    """Why the control plane refused the connection, from the close that follows."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ws.wait_closed(), 5)
    if ws.close_code == CLOSE_UNAUTHORIZED:
        if has_token:
            return SayError(
                f"the control plane at {url} refused the admin token; set "
                "SUPERAGENT_ADMIN_TOKEN to the token it runs with"
            )
        return SayError(
            f"the control plane at {url} needs its admin token; set SUPERAGENT_ADMIN_TOKEN, "
            "or SUPERAGENT_STATE_DIR to the state directory of the `superagent up` it is"
        )
    return SayError(message)


async def _converse(
    url: str,
    token: str | None,
    name: str,
    text: str,
    thread: str | None,
    wait: float | None,
    echo: bool,
) -> Outcome:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    client_id = str(uuid.uuid4())
    outcome = Outcome()
    async with connect(
        _socket_url(url, name),
        additional_headers=headers,
        open_timeout=OPEN_TIMEOUT,
        proxy=None if _loopback(url) else True,
        max_size=4 * 1024 * 1024,
    ) as ws:
        first = await _frame(ws, time.monotonic() + OPEN_TIMEOUT)
        if first.get("type") != "ready":
            message = str(first.get("message", "the control plane refused the chat"))
            raise await _refusal(ws, message, has_token=token is not None, url=url)
        await ws.send(
            json.dumps({"type": "say", "thread": thread, "text": text, "client_id": client_id})
        )
        deadline = time.monotonic() + OPEN_TIMEOUT
        while not outcome.trigger:
            frame = await _frame(ws, deadline)
            if frame.get("type") == "error" and frame.get("client_id") in (client_id, None):
                raise SayError(str(frame.get("message")))
            if frame.get("type") == "accepted" and frame.get("client_id") == client_id:
                outcome.thread = str(frame["thread"])
                outcome.trigger = str(frame["trigger"])
                outcome.verdict = str(frame.get("verdict", ""))
                outcome.route = str(frame.get("route", ""))
                if outcome.route == "dropped":
                    raise SayError(
                        f"recorded, but the agent will not act on it: {frame.get('reason')} "
                        "(see `superagent policy`)"
                    )
        click.echo(
            f"conversation {outcome.thread} (continue: superagent say --thread "
            f"{outcome.thread} ...)",
            err=True,
        )
        if wait is None:
            return outcome
        deadline = time.monotonic() + wait
        said = False  # replies count only after our own message: earlier ones are history
        while True:
            try:
                frame = await _frame(ws, deadline)
            except TimeoutError:
                if outcome.replies:
                    return outcome
                raise SayError(
                    f"no reply within {wait:g}s; the message is recorded and the conversation "
                    f"goes on ({url.rstrip('/')}/chat#{outcome.thread})"
                ) from None
            if frame.get("type") != "message" or frame.get("thread") != outcome.thread:
                continue
            if frame.get("client_id") == client_id:
                said = True
            elif said and frame.get("role") == "agent":
                outcome.replies.append(frame)
                if echo:
                    click.echo(str(frame.get("text", "")))
                deadline = time.monotonic() + MORE_REPLIES_SECONDS


def _run(coro: Any, url: str) -> Outcome:
    try:
        result = asyncio.run(coro)
        assert isinstance(result, Outcome)
        return result
    except SayError as exc:
        fail(str(exc))
    except InvalidStatus as exc:
        status = exc.response.status_code
        if status == 404:
            fail(f"{url} has no web chat (/chat/ws); is it a Super-agent control plane?")
        fail(f"{url} refused the chat connection (HTTP {status})")
    except (InvalidURI, InvalidHandshake) as exc:
        fail(f"cannot open the chat at {url}: {exc}")
    except ConnectionClosed as exc:
        why = f": {exc.rcvd.reason}" if exc.rcvd and exc.rcvd.reason else ""
        fail(f"the control plane closed the connection{why}")
    except TimeoutError:
        fail(f"no answer from {url} within {OPEN_TIMEOUT:g}s")
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        fail(
            f"the control plane is not running at {url} ({reason}); start it with "
            "`superagent up`, or point --url at it"
        )
    except KeyboardInterrupt:
        _interrupted()


def _interrupted() -> NoReturn:
    click.echo("interrupted", err=True)
    sys.exit(130)


@click.command()
@click.argument("text")
@click.option(
    "--thread",
    metavar="CONVERSATION",
    help="Continue this conversation (its id is printed after each message).",
)
@click.option(
    "--url",
    help="The control plane. [default: http://127.0.0.1:PORT, PORT from SUPERAGENT_HTTP__PORT]",
)
@click.option("--name", default="admin", show_default=True, help="Who is speaking.")
@click.option(
    "--wait",
    "wait_seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=120.0,
    show_default=True,
    help="Seconds to wait for the agent's reply.",
)
@click.option("--no-wait", is_flag=True, help="Return once the message is recorded.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def say(
    text: str,
    thread: str | None,
    url: str | None,
    name: str,
    wait_seconds: float,
    no_wait: bool,
    as_json: bool,
) -> None:
    """Say TEXT to the agent and print its reply (TEXT "-" reads standard input).

    This is the web chat from a terminal: the control plane must be running (`superagent
    up`), and the conversation shows in the console's chat page (/chat) too. It sends
    the admin token: SUPERAGENT_ADMIN_TOKEN, or else the one `superagent up` generated in
    its state directory (STATE_DIR/admin-token).

    \b
    Examples:
      superagent say "Why is CI red on main?"
      superagent say --thread chat_4f0c2a9e1b7d3c55 "Go ahead and fix it"
      git diff | superagent say --no-wait -

    The reply goes to stdout; the conversation id goes to stderr. Exits 1 with one line
    when the control plane is not running, refuses the token, will not act on the
    message, or sends no reply within --wait seconds.
    """
    setup_logging("WARNING")
    if text == "-":
        text = sys.stdin.read()
    settings = load_settings()
    target = url or _default_url(settings)
    token = admin_token.for_client(settings)
    outcome = _run(
        _converse(
            target,
            token,
            name,
            text,
            thread,
            None if no_wait else wait_seconds,
            echo=not as_json,
        ),
        target,
    )
    if as_json:
        click.echo(
            json.dumps(
                {
                    "thread": outcome.thread,
                    "trigger": outcome.trigger,
                    "verdict": outcome.verdict,
                    "route": outcome.route,
                    "replies": [
                        {"id": r.get("id"), "text": r.get("text"), "at": r.get("at")}
                        for r in outcome.replies
                    ],
                },
                indent=2,
            )
        )
