"""Client frames on the chat socket, checked, and what a said message becomes.

Who says it is the authenticated principal, not the name the page sends: every holder of
the admin token is one principal, the admin, so every chat user's actor id is
``web:admin`` (:data:`controlplane.identities.WEB_ADMIN`). The chosen ``name`` is the
actor's name, a label for who said what, and grants nothing: choosing someone's name does
not make a chat user that person.

A said message is a Trigger of source ``web`` with external id
``<actor id>:<client id>`` (``web:admin:<client id>``): a client resending a frame it is
unsure about (its socket dropped before ``accepted``) records nothing twice. A new
conversation's id is derived from the same pair, so a resent first message does not open a
second, empty conversation either.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from controlplane.channels.webhook_body import parse_json
from controlplane.errors import InvalidInput
from controlplane.identities import WEB_ADMIN
from controlplane.ingest.admission import WEB_CONSOLE_GROUP, Actor
from controlplane.ingest.intake import IncomingTrigger, ThreadRef

SOURCE = "web"
ADMIN_PRINCIPAL = WEB_ADMIN.removeprefix(f"{SOURCE}:")  # every holder of the admin token
GROUP = WEB_CONSOLE_GROUP  # every chat user: the default ingest policy allowlists it for "web"
MAX_FRAME_CHARS = 64 * 1024
MAX_TEXT_CHARS = 16_000
_TITLE_CHARS = 80
_CLIENT_ID = re.compile(r"^[A-Za-z0-9_-]{8,100}$")
_THREAD = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


@dataclass(frozen=True)
class Say:
    thread: str | None  # None: a new conversation
    text: str
    client_id: str
    # The sender wants ``progress`` frames about this message (what it was promised, and
    # when that arrived). Opt-in, so clients that predate them (the chat page) see none.
    track: bool = False


@dataclass(frozen=True)
class Watch:
    thread: str


@dataclass(frozen=True)
class Unwatch:
    thread: str


Frame = Say | Watch | Unwatch


def actor(name: str, principal: str = ADMIN_PRINCIPAL) -> Actor:
    """The chat user: ``principal`` is who authenticated (the admin token's holder), and is
    the identity; ``name`` is what they chose to be called, for display only."""
    return Actor(id=f"{SOURCE}:{principal}", name=name, is_bot=False, groups=(GROUP,))


def client_id_in(raw: str) -> str | None:
    """The client id of a frame, if one can be read: error frames carry it back."""
    try:
        value = json.loads(raw).get("client_id")
    except (ValueError, RecursionError, AttributeError):
        return None
    return value if isinstance(value, str) and _CLIENT_ID.match(value) else None


def _thread(value: Any, *, required: bool) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not _THREAD.match(value):
        raise InvalidInput("thread must be a conversation id" + ("" if required else " or null"))
    return value


def parse(raw: str | None) -> Frame:
    """One client frame, or InvalidInput saying what is wrong with it."""
    if raw is None:
        raise InvalidInput("frames must be JSON text, not binary")
    if len(raw) > MAX_FRAME_CHARS:
        raise InvalidInput(f"the frame is over {MAX_FRAME_CHARS // 1024} KiB")
    frame = parse_json(raw, "the frame")
    if not isinstance(frame, dict):
        raise InvalidInput('the frame must be a JSON object with a "type"')
    kind = frame.get("type")
    if kind == "say":
        text = frame.get("text")
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput("text is empty")
        if len(text) > MAX_TEXT_CHARS:
            raise InvalidInput(f"text is over {MAX_TEXT_CHARS} characters")
        if "\x00" in text:
            raise InvalidInput("text must not contain NUL characters")
        client_id = frame.get("client_id")
        if not isinstance(client_id, str) or not _CLIENT_ID.match(client_id):
            raise InvalidInput(
                "client_id must be a fresh UUID per message (resend the same one to retry)"
            )
        track = frame.get("track", False)
        if not isinstance(track, bool):
            raise InvalidInput("track must be true or false")
        return Say(_thread(frame.get("thread"), required=False), text, client_id, track)
    if kind in ("watch", "unwatch"):
        thread = _thread(frame.get("thread"), required=True)
        assert thread is not None
        return Watch(thread) if kind == "watch" else Unwatch(thread)
    raise InvalidInput(f"unknown frame type {str(kind)[:40]!r}; expected say, watch or unwatch")


def new_conversation(actor_id: str, client_id: str) -> str:
    digest = hashlib.sha256(f"{actor_id}\n{client_id}".encode()).hexdigest()
    return f"chat_{digest[:16]}"


def title(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _TITLE_CHARS else line[: _TITLE_CHARS - 1] + "…"


def trigger(who: Actor, say: Say, thread: str) -> IncomingTrigger:
    """The Trigger of a said message; ``thread`` is its (possibly new) conversation id."""
    return IncomingTrigger(
        source=SOURCE,
        external_id=f"{who.id}:{say.client_id}",
        # A title only for a new conversation: ingest keeps the thread's title otherwise.
        thread=ThreadRef(external_id=thread, title=title(say.text) if say.thread is None else None),
        actor=who,
        kind="message",
        text=say.text,
        direct=True,  # the chat is a conversation with the agent: no mention needed
    )
