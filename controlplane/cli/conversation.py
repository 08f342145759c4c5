"""What ``superagent say`` does (:mod:`controlplane.cli.say`): talk to the agent through the
web chat's websocket.

The running control plane does the work (this command only speaks the chat protocol of
:mod:`controlplane.channels.webchat.connection`), so what is said here shows up in the
console's chat page as well, and a conversation can go on in either place.

stdout carries only the agent's replies, each ending with a newline, so they can be piped;
the conversation id and hints go to stderr, each on its own line.

What a message was promised (a ``/run``'s result, a ticket's first report) is known from
the server's ``progress`` frames (:mod:`controlplane.channels.webchat.progress`), never
from the replies' wording; ``say`` waits for it within ``--wait``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from ipaddress import ip_address
from typing import Any, NoReturn
from urllib.parse import quote, urlsplit, urlunsplit

import click
import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from controlplane.access import admin_token
from controlplane.cli import contexts
from controlplane.cli.common import clear_errors, fail, load_settings, setup_logging

OPEN_TIMEOUT = 10.0
CLOSE_TIMEOUT = 2.0  # seconds for the closing handshake when say leaves
EXIT_PENDING = 3  # replies came, but something they promised did not within --wait
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
    progress: dict[str, Any] | None = None  # the latest ``progress`` frame of the message
    timed_out: bool = False  # --wait ran out

    def owed(self) -> list[dict[str, Any]]:
        """What the message was promised that has not arrived."""
        return self._items("pending")

    def dropped(self) -> list[dict[str, Any]]:
        return self._items("dropped")

    def refused(self) -> list[dict[str, Any]]:
        """What the agent would not do (a /run to no such device): the message failed."""
        return self._items("refused")

    def _items(self, key: str) -> list[dict[str, Any]]:
        """The progress frame's list ``key`` (anything malformed in it ignored)."""
        found = (self.progress or {}).get(key)
        return [p for p in found if isinstance(p, dict)] if isinstance(found, list) else []


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
    text: str | None,
    thread: str | None,
    wait: float,
    follow: bool,
    echo: bool,
) -> Outcome:
    stop = asyncio.Event()  # Ctrl-C, while following
    if not follow:
        return await _talk(url, token, name, text, thread, wait, stop, echo=echo)
    # Taken before anything is printed: one who has seen a reply may press Ctrl-C at once.
    with _ctrl_c_sets(stop):
        return await _talk(url, token, name, text, thread, None, stop, echo=echo)


@contextlib.contextmanager
def _ctrl_c_sets(stop: asyncio.Event) -> Iterator[None]:
    """While following, Ctrl-C sets ``stop``, and following ends as a plain return.

    Not the default KeyboardInterrupt: raised wherever the loop happens to be (inside the
    websocket library's receive or close, or before the stream began), it left the follower
    running after the person asked it to stop. A second Ctrl-C interrupts outright (the
    default handler is back by then)."""
    # A blocked SIGINT is inherited across exec: a follower started by a process that
    # blocks it would never hear Ctrl-C. Ctrl-C is how following ends, so take it.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    loop = asyncio.get_running_loop()

    def on_ctrl_c() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)

    with contextlib.suppress(NotImplementedError, RuntimeError):  # no signals here
        loop.add_signal_handler(signal.SIGINT, on_ctrl_c)
    try:
        yield
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)


async def _talk(
    url: str,
    token: str | None,
    name: str,
    text: str | None,
    thread: str | None,
    wait: float | None,
    stop: asyncio.Event,
    *,
    echo: bool,
) -> Outcome:
    """Say ``text`` (or only watch ``thread``), then wait up to ``wait`` seconds for the
    replies, or (``wait`` None) stream them until ``stop``."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    outcome = Outcome(thread=thread or "")
    async with connect(
        _socket_url(url, name),
        additional_headers=headers,
        open_timeout=OPEN_TIMEOUT,
        # Leaving (Ctrl-C, or done) need not wait long for the server's half of the
        # closing handshake: nothing more is read, and the server cleans up on its own.
        close_timeout=CLOSE_TIMEOUT,
        proxy=None if _loopback(url) else True,
        max_size=4 * 1024 * 1024,
    ) as ws:
        first = await _frame(ws, time.monotonic() + OPEN_TIMEOUT)
        if first.get("type") != "ready":
            message = str(first.get("message", "the control plane refused the chat"))
            raise await _refusal(ws, message, has_token=token is not None, url=url)
        if text is None:  # following a conversation: its latest replies, then what comes
            assert thread is not None
            click.echo(f"conversation {thread} (following it; Ctrl-C stops)", err=True)
            heard = await _latest_replies(url, headers, thread)
            await ws.send(json.dumps({"type": "watch", "thread": thread}))
            await _stream(ws, thread, outcome, heard, stop, said=True)
            return outcome
        if stop.is_set():  # Ctrl-C before the message went: it is not sent
            return outcome
        client_id = str(uuid.uuid4())
        await ws.send(
            json.dumps(
                {
                    "type": "say",
                    "thread": thread,
                    "text": text,
                    "client_id": client_id,
                    "track": True,  # progress frames: what this message was promised
                }
            )
        )
        await _accepted(ws, outcome, client_id)
        click.echo(
            f"conversation {outcome.thread} (continue it: superagent say --conversation "
            f"{outcome.thread} TEXT)",
            err=True,
        )
        if wait is None:
            await _stream(ws, outcome.thread, outcome, {}, stop, said=False, client_id=client_id)
        elif wait > 0:
            await _await_replies(ws, outcome, client_id, wait, echo)
        return outcome


async def _accepted(ws: ClientConnection, outcome: Outcome, client_id: str) -> None:
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
                    "(see `superagent admission`)"
                )


def _print(reply: dict[str, Any]) -> None:
    """One reply, ending with exactly one newline, whatever its text ends with."""
    click.echo(str(reply.get("text", "")).rstrip("\n"))


async def _await_replies(
    ws: ClientConnection, outcome: Outcome, client_id: str, wait: float, echo: bool
) -> None:
    """Replies to the message, until what it was promised has arrived or ``wait`` runs out.

    The server's ``progress`` frames say what is owed (a /run's result, a ticket's first
    report, replies still queued) and when all of it arrived ("settled"). Short of that,
    :data:`MORE_REPLIES_SECONDS` of quiet after a reply ends the wait while nothing is
    owed, as with a control plane that sends no progress (or a router still deciding).
    """
    started = time.monotonic()
    deadline = started + wait
    quiet_until: float | None = None
    said = False  # replies count only after our own message: earlier ones are history
    waiting = _Waiting(wait)
    # Settled with no reply yet: a message passed to a ticket's inbox is settled at once,
    # and its ticket may still answer; so the wait goes on, as it would have without it.
    while not (outcome.replies and outcome.progress and outcome.progress.get("settled")):
        owed = outcome.progress is not None and bool(
            outcome.progress.get("pending") or outcome.progress.get("replies_queued")
        )
        waiting.show(outcome, time.monotonic() - started)
        until = deadline if quiet_until is None or owed else min(deadline, quiet_until)
        try:
            # On a terminal the status line's clock ticks: wake at least once a second.
            frame = await _frame(ws, min(until, time.monotonic() + 1) if waiting.tty else until)
        except TimeoutError:
            if time.monotonic() < until:
                continue  # (the tick)
            if time.monotonic() >= deadline:
                outcome.timed_out = True
            waiting.clear()
            return
        kind = frame.get("type")
        if kind == "progress" and frame.get("trigger") == outcome.trigger:
            outcome.progress = frame
        elif kind == "message" and frame.get("thread") == outcome.thread:
            if frame.get("client_id") == client_id:
                said = True
            elif said and frame.get("role") == "agent":
                outcome.replies.append(frame)
                if echo:
                    waiting.clear()
                    _print(frame)
                quiet_until = time.monotonic() + MORE_REPLIES_SECONDS
    waiting.clear()


class _Waiting:
    """What ``say`` waits for, on stderr while it waits: on a terminal one status line,
    its clock ticking, rewritten in place and cleared before a reply prints; otherwise a
    line each time what is owed changes (a log reads well, and stdout stays the replies)."""

    def __init__(self, wait: float) -> None:
        self.wait = wait
        self.tty = sys.stderr.isatty()
        self.said = ""  # the last line written
        self.drawn = False  # a status line is on the terminal

    def show(self, outcome: Outcome, elapsed: float) -> None:
        owed = outcome.owed()
        what = "; ".join(_promise(p) for p in owed) if owed else "a reply"
        if self.tty:
            line = f"waiting for {what}: {elapsed:.0f}s of {self.wait:g}s (Ctrl-C stops waiting)"
            click.echo(f"\r\x1b[K{line}", err=True, nl=False)
            self.drawn = True
        elif owed and what != self.said:
            click.echo(f"waiting for {what} (up to {self.wait:g}s)", err=True)
        self.said = what

    def clear(self) -> None:
        if self.drawn:
            click.echo("\r\x1b[K", err=True, nl=False)
            self.drawn = False


async def _stream(
    ws: ClientConnection,
    thread: str,
    outcome: Outcome,
    heard: dict[str, dict[str, Any]],
    stop: asyncio.Event,
    *,
    said: bool,
    client_id: str | None = None,
) -> None:
    """Every later reply on the conversation, until ``stop`` (Ctrl-C) or the connection ends."""
    stopped = asyncio.ensure_future(stop.wait())
    receiving: asyncio.Future[Any] | None = None
    try:
        while True:
            receiving = asyncio.ensure_future(ws.recv())
            await asyncio.wait({receiving, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not receiving.done():
                return
            frame = json.loads(receiving.result())
            if not isinstance(frame, dict) or frame.get("type") != "message":
                continue
            if frame.get("thread") != thread or frame.get("id") in heard:
                continue
            if client_id is not None and frame.get("client_id") == client_id:
                said = True
            elif said and frame.get("role") == "agent":
                heard[str(frame.get("id"))] = frame
                outcome.replies.append(frame)
                _print(frame)
    finally:
        # Neither left behind: a receive the close ends would report its error at exit.
        for pending in (stopped, receiving):
            if pending is not None and not pending.done():
                pending.cancel()
        await asyncio.gather(stopped, *([receiving] if receiving else []), return_exceptions=True)


async def _latest_replies(
    url: str, headers: dict[str, str] | None, thread: str
) -> dict[str, dict[str, Any]]:
    """The conversation's history by id (so that watching it does not repeat it), after
    printing the replies to its latest message: what a later ``--follow`` came to see."""
    path = f"{url.rstrip('/')}/chat/api/threads/{quote(thread, safe='')}/messages"
    async with httpx.AsyncClient(
        headers=headers, timeout=OPEN_TIMEOUT, trust_env=not _loopback(url)
    ) as http:
        response = await http.get(path)
    if response.status_code == 404:
        raise SayError(f"no conversation {thread}")
    if response.status_code != 200:
        raise SayError(f"{url} refused to read conversation {thread} (HTTP {response.status_code})")
    messages = response.json().get("messages", [])
    latest: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") == "person":
            latest = []
        elif message.get("role") == "agent":  # (not a worker's report: the agent relays it)
            latest = [*latest, message]
    for message in latest:
        _print(message)
    return {str(message.get("id")): message for message in messages}


def _run(coro: Any, url: str, *, following: bool) -> Outcome:
    try:
        result = asyncio.run(coro)
        assert isinstance(result, Outcome)
        return result
    except KeyboardInterrupt:
        if following:
            sys.exit(0)  # Ctrl-C is how following ends: not a failure
        _interrupted()
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
    except httpx.HTTPError as exc:
        fail(f"cannot read the conversation from {url}: {exc}")
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        fail(
            f"the control plane is not running at {url} ({reason}); start it with "
            "`superagent up`, or point --url at it"
        )


def _interrupted() -> NoReturn:
    click.echo("interrupted", err=True)
    sys.exit(130)


def _promise(item: dict[str, Any]) -> str:
    what = "the result of the /run" if item.get("kind") == "run" else str(item.get("id"))
    see = f" ({item['see']})" if item.get("see") else ""
    return what + see


def _finish(outcome: Outcome, url: str, wait: float) -> int:
    """Say on stderr what did not arrive, and how to see it later; the exit status."""
    follow = f"superagent say --follow --conversation {outcome.thread}"
    refused = outcome.refused()
    if refused:
        fail("; ".join(str(item.get("why") or "refused") for item in refused))
    for item in outcome.dropped():
        click.echo(f"will not arrive: {_promise(item)}", err=True)
    owed = outcome.owed()
    if outcome.timed_out and owed:
        click.echo(
            f"still pending after {wait:g}s: " + "; ".join(_promise(p) for p in owed), err=True
        )
        click.echo(f"to see it when it arrives: {follow}", err=True)
        return EXIT_PENDING
    if outcome.timed_out and not outcome.replies:
        fail(
            f"no reply within {wait:g}s; the message is recorded and the conversation goes on "
            f"({url.rstrip('/')}/chat#{outcome.thread}, or {follow})"
        )
    return 0


def main(
    text: str | None,
    thread: str | None,
    url: str | None,
    name: str,
    wait: float,
    follow: bool,
    as_json: bool,
) -> NoReturn:
    """``superagent say``'s work, its arguments checked (:mod:`controlplane.cli.say`)."""
    setup_logging("WARNING")
    settings = load_settings()
    with clear_errors():
        context = None if url else contexts.chosen()
    token: str | None
    if context is not None:  # the deployment `superagent login` stored, with its token
        target, token = context.url, context.token
    else:
        target = url or settings.http.local_url()
        token = admin_token.for_client(settings)
    outcome = _run(
        _converse(target, token, name, text, thread, wait, follow, echo=not as_json),
        target,
        following=follow,
    )
    if follow:
        sys.exit(0)  # Ctrl-C is how following ends: not a failure
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
                    "pending": outcome.owed(),
                    "dropped": outcome.dropped(),
                    "refused": outcome.refused(),
                },
                indent=2,
            )
        )
    code = _finish(outcome, target, wait) if text is not None and wait > 0 else 0
    sys.exit(code)
