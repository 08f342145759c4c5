"""Slack events (``event_callback`` bodies) → the messages the agent hears.

Pure mapping, no I/O: which events count, on which thread, and whether they address the
agent. The same body arrives over the Events API and inside Socket Mode envelopes.

Each Slack message becomes at most one trigger, whatever the app subscribes to:

* ``app_mention`` in a channel, private channel or group DM: addresses the agent.
* ``message`` in a DM (``channel_type`` ``im``): addresses the agent.
* ``message`` anywhere else (``message.channels``, ``.groups``, ``.mpim``, when subscribed):
  does not address the agent; it informs tickets subscribed to its thread. If it mentions
  the bot, it is skipped: the same message also arrives as ``app_mention`` (with its own
  ``event_id``), and that delivery is the one that counts.
* ``app_mention`` in a DM is skipped for the same reason the other way round: the DM's
  ``message.im`` delivery counts.

Skipped outright: the agent's own messages (our bot user id or bot id, from
``auth.test``), message subtypes that are not a new message (edits, deletions, joins,
topic changes...), hidden messages and every other event type.

A thread is Slack's thread: ``{channel}:{thread_ts}``, or ``{channel}:{ts}`` for a
message that starts one (replies go under it, in its thread).

Who wrote it is a user id *and the workspace it belongs to*: a user id is unique only within
its workspace, and a Slack Connect channel carries members of other organisations. The
author's workspace is the event's ``user_team`` (or ``team``), as Slack sends them, and
otherwise the workspace the event was delivered for (``team_id``, ``authorizations``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from controlplane.channels.base import Ignored
from controlplane.errors import InvalidInput

# Subtypes that are someone saying something; every other subtype (message_changed,
# message_deleted, channel_join, channel_topic, ...) is Slack reporting a change.
_SPOKEN_SUBTYPES = frozenset({None, "file_share", "thread_broadcast", "bot_message", "me_message"})
_KIND_BY_CHANNEL_TYPE = {
    "im": "message.im",
    "channel": "message.channels",
    "group": "message.groups",
    "mpim": "message.mpim",
}
_CHANNEL_ID = re.compile(r"^[A-Z0-9]{2,40}$")
_TEAM_ID = re.compile(r"^[TE][A-Z0-9]{2,30}$")
_TS = re.compile(r"^\d{1,12}\.\d{1,9}$")


@dataclass(frozen=True)
class Identity:
    """Who the agent is on this workspace (``auth.test`` with the bot token)."""

    user_id: str
    bot_id: str | None = None
    team_id: str | None = None  # the workspace the app is installed in


@dataclass(frozen=True)
class SlackMessage:
    event_id: str
    kind: str
    channel: str
    ts: str
    thread_ts: str | None
    user: str | None  # the author's user id (bot users have one too)
    bot_id: str | None  # set when a bot or integration posted it
    bot_name: str | None
    text: str
    direct: bool
    user_team: str | None = None  # the author's workspace, as the event names it
    workspace: str | None = None  # the workspace the event was delivered for

    @property
    def team(self) -> str | None:
        """The author's workspace: the event's word for it, else the delivering one."""
        return self.user_team or self.workspace

    @property
    def thread_external_id(self) -> str:
        return thread_id(self.channel, self.thread_ts or self.ts)

    @property
    def ack_ref(self) -> str:
        return f"{self.channel}:{self.ts}"

    @property
    def starts_thread(self) -> bool:
        return self.thread_ts is None or self.thread_ts == self.ts


def thread_id(channel: str, thread_ts: str) -> str:
    return f"{channel}:{thread_ts}"


def split_ref(ref: str) -> tuple[str, str]:
    """``(channel, ts)`` of a thread external id or an ack ref; InvalidInput if malformed."""
    channel, _, ts = ref.partition(":")
    if not _CHANNEL_ID.match(channel) or not _TS.match(ts):
        raise InvalidInput(f"{ref!r} is not a Slack channel:ts reference")
    return channel, ts


def mentions(text: str, user_id: str) -> bool:
    """Whether ``text`` mentions ``user_id`` the way Slack encodes it (``<@U123>``)."""
    return re.search(rf"<@{re.escape(user_id)}(?:\|[^>]*)?>", text) is not None


def _str(event: dict[str, Any], key: str) -> str | None:
    value = event.get(key)
    return value if isinstance(value, str) and value else None


def parse(callback: Any, me: Identity) -> SlackMessage | Ignored:
    """The message an ``event_callback`` carries, or why it carries none.

    InvalidInput when the body is not shaped like Slack's."""
    if not isinstance(callback, dict):
        raise InvalidInput("the event body is not a JSON object")
    event = callback.get("event")
    event_id = callback.get("event_id")
    if not isinstance(event, dict) or not isinstance(event_id, str) or not event_id:
        raise InvalidInput("an event_callback needs an event object and an event_id")
    kind = event.get("type")
    if kind not in ("app_mention", "message"):
        return Ignored(f"{kind} is not an event the agent acts on")
    subtype = event.get("subtype")
    if subtype not in _SPOKEN_SUBTYPES or event.get("hidden"):
        return Ignored(f"message subtype {subtype} is not a new message")
    channel, ts = _str(event, "channel"), _str(event, "ts")
    if channel is None or ts is None or not _CHANNEL_ID.match(channel) or not _TS.match(ts):
        raise InvalidInput(f"the {kind} event needs a channel id and a message ts")
    thread_ts = _str(event, "thread_ts")
    if thread_ts is not None and not _TS.match(thread_ts):
        raise InvalidInput("thread_ts is not a Slack timestamp")
    user, bot_id = _str(event, "user"), _str(event, "bot_id")
    if user is None and bot_id is None:
        raise InvalidInput(f"the {kind} event names no user and no bot")
    if user == me.user_id or (me.bot_id is not None and bot_id == me.bot_id):
        return Ignored("the agent's own message")
    text = event.get("text") if isinstance(event.get("text"), str) else ""
    assert isinstance(text, str)
    is_dm = channel.startswith("D") or event.get("channel_type") == "im"
    if kind == "app_mention":
        if is_dm:
            return Ignored("app_mention in a DM; its message.im delivery counts")
        name, direct = "app_mention", True
    else:
        channel_type = event.get("channel_type")
        name = _KIND_BY_CHANNEL_TYPE.get(str(channel_type), "")
        if not name:
            return Ignored(f"message in a {channel_type} conversation")
        direct = channel_type == "im"
        if not direct and mentions(text, me.user_id):
            return Ignored("mentions the agent; its app_mention delivery counts")
    profile = event.get("bot_profile")
    bot_name = _str(event, "username") or (
        _str(profile, "name") if isinstance(profile, dict) else None
    )
    return SlackMessage(
        event_id=event_id,
        kind=name,
        channel=channel,
        ts=ts,
        thread_ts=thread_ts,
        user=user,
        bot_id=bot_id,
        bot_name=bot_name,
        text=text,
        direct=direct,
        user_team=_team(_str(event, "user_team") or _str(event, "team")),
        workspace=_team(_workspace(callback)),
    )


def _workspace(callback: dict[str, Any]) -> str | None:
    team = callback.get("team_id")
    if isinstance(team, str) and team:
        return team
    grants = callback.get("authorizations")
    for grant in grants if isinstance(grants, list) else []:
        if isinstance(grant, dict) and isinstance(grant.get("team_id"), str):
            return str(grant["team_id"])
    return None


def _team(team: str | None) -> str | None:
    if team is not None and not _TEAM_ID.match(team):
        raise InvalidInput(f"{team[:40]!r} is not a Slack team id")
    return team
