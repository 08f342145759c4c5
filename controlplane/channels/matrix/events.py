"""Matrix room events as the control plane sees them: threads, mentions, Triggers.

Pure functions over the client-server API's event JSON; no I/O here. The sync loop
(:mod:`controlplane.channels.matrix.receiver`) feeds them and sends what they return to ingest.

* A thread is a room plus the event id of its root: an event related with ``rel_type``
  ``m.thread`` belongs to the thread of the related event; any other message roots its own.
  Its external id is ``"{room_id}|{root_event_id}"`` (room ids contain ``!`` and ``:``, never
  ``|``), so a reply's target is known from the external id alone.
* A message addresses the agent when its intentional mentions (``m.mentions``) name the bot,
  when its text names the bot (Matrix id, display name or localpart, as a whole word, or a
  matrix.to link to it), or when the room is a direct chat (the bot and one person).
* The actor is the sender's Matrix id, for both id and name: display names are chosen by
  their owners and are not unique, so they never decide who is allowlisted. Messages sent as
  ``m.notice`` are bots' by Matrix convention (``is_bot``); the bot's own are skipped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from controlplane.ingest.admission import Actor
from controlplane.ingest.intake import IncomingTrigger, ThreadRef

SOURCE = "matrix"
KIND = "message"
THREAD_SEPARATOR = "|"


@dataclass(frozen=True)
class BotIdentity:
    user_id: str  # @agent:example.org
    display_name: str | None = None

    @property
    def localpart(self) -> str:
        return self.user_id[1:].partition(":")[0]


@dataclass(frozen=True)
class Message:
    """An ``m.room.message`` worth ingesting, before the direct-chat question is settled."""

    room_id: str
    event_id: str
    sender: str
    body: str
    root_event_id: str
    mentions_bot: bool
    is_notice: bool
    event: dict[str, Any]

    @property
    def thread_external_id(self) -> str:
        return thread_external_id(self.room_id, self.root_event_id)


def thread_external_id(room_id: str, root_event_id: str) -> str:
    return f"{room_id}{THREAD_SEPARATOR}{root_event_id}"


def parse_thread(external_id: str) -> tuple[str, str] | None:
    """(room id, root event id) of a thread external id, or None if it is not one."""
    room_id, separator, root = external_id.partition(THREAD_SEPARATOR)
    if not separator or not room_id.startswith("!") or not root.startswith("$"):
        return None
    return room_id, root


def event_url(room_id: str, event_id: str) -> str:
    return f"https://matrix.to/#/{quote(room_id, safe='')}/{quote(event_id, safe='')}"


def became(event: dict[str, Any], user_id: str, membership: str) -> bool:
    """Whether ``event`` changes ``user_id``'s membership to ``membership`` (a member event
    that only renames someone, with the same membership before and after, does not)."""
    content = event.get("content")
    if (
        event.get("type") != "m.room.member"
        or event.get("state_key") != user_id
        or not isinstance(content, dict)
        or content.get("membership") != membership
    ):
        return False
    unsigned = event.get("unsigned")
    previous = unsigned.get("prev_content") if isinstance(unsigned, dict) else None
    return not isinstance(previous, dict) or previous.get("membership") != membership


def since_invited(events: list[dict[str, Any]], bot_user_id: str) -> list[dict[str, Any]]:
    """``events`` without those from before the bot was invited.

    A room the bot has just joined comes with its history; what was said there before the
    invitation was not said to the bot, what was said since was. Without the invitation
    among ``events`` but with the bot's join (a room joined without one, or an invitation
    too far back), what came before the join is left out. With neither, the bot was there
    all along.
    """
    for membership, skip in (("invite", 1), ("join", 0)):
        for index in range(len(events) - 1, -1, -1):
            if became(events[index], bot_user_id, membership):
                return events[index + skip :]
    return events


def _names_pattern(bot: BotIdentity) -> re.Pattern[str]:
    names = [bot.user_id, bot.localpart]
    if bot.display_name and bot.display_name.strip():
        names.append(bot.display_name.strip())
    alternatives = "|".join(re.escape(name) for name in sorted(set(names), key=len, reverse=True))
    # A whole word, "@" allowed in front: "@agent", "agent:" and "Agent," name it;
    # "agents" and "re-agent" do not.
    return re.compile(rf"(?<![\w-])@?(?:{alternatives})(?![\w-])", re.IGNORECASE)


def mentions_bot(content: dict[str, Any], bot: BotIdentity) -> bool:
    mentions = content.get("m.mentions")
    if isinstance(mentions, dict):
        user_ids = mentions.get("user_ids")
        if isinstance(user_ids, list) and bot.user_id in user_ids:
            return True
    body = content.get("body")
    if isinstance(body, str) and _names_pattern(bot).search(body):
        return True
    formatted = content.get("formatted_body")
    # A "pill" from clients that predate intentional mentions: a link to the bot's id.
    return isinstance(formatted, str) and f"matrix.to/#/{bot.user_id}" in unquote(formatted)


def parse_message(room_id: str, event: dict[str, Any], bot: BotIdentity) -> Message | None:
    """The message in ``event``, or None for what is not a request to consider: other event
    types, the bot's own messages, edits (the original was already taken), redactions."""
    if event.get("type") != "m.room.message":
        return None
    sender, event_id, content = event.get("sender"), event.get("event_id"), event.get("content")
    if not isinstance(sender, str) or not isinstance(event_id, str) or sender == bot.user_id:
        return None
    if not isinstance(content, dict) or not isinstance(content.get("body"), str):
        return None  # redacted, or not a message at all
    relation = content.get("m.relates_to")
    root = event_id
    if isinstance(relation, dict):
        if relation.get("rel_type") == "m.replace":
            return None
        related = relation.get("event_id")
        if relation.get("rel_type") == "m.thread" and isinstance(related, str):
            root = related
    return Message(
        room_id=room_id,
        event_id=event_id,
        sender=sender,
        body=content["body"],
        root_event_id=root,
        mentions_bot=mentions_bot(content, bot),
        is_notice=content.get("msgtype") == "m.notice",
        event=event,
    )


def to_trigger(message: Message, *, direct: bool, room_name: str | None) -> IncomingTrigger:
    return IncomingTrigger(
        source=SOURCE,
        external_id=message.event_id,
        thread=ThreadRef(
            external_id=message.thread_external_id,
            title=room_name[:500] if room_name else None,
            url=event_url(message.room_id, message.root_event_id),
        ),
        actor=Actor(
            id=message.sender,
            name=message.sender,
            is_bot=message.is_notice,
            groups=(message.room_id,),
        ),
        kind=KIND,
        text=message.body.replace("\x00", ""),
        direct=direct,
        payload=json.dumps(message.event, separators=(",", ":")).encode(),
        ack_ref=message.event_id,
    )
