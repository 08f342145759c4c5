"""Who a Slack handle names: a member's ``TEAM/USER`` id, for a policy or a link being saved.

People write a member as a user id (``U024BE7LH``), an email or a ``@handle``. Each is
looked up once, on save, and the saved document keeps the id:

* a user id: ``users.info`` says which workspace it belongs to;
* an email: ``users.lookupByEmail``;
* a handle: ``users.list``, matching the workspace-unique ``name`` of our own workspace's
  members only (a Slack Connect partner's member may carry the same handle; display names
  are not unique at all, so they are never matched).

Not found is ``None``; Slack's own failures are raised as :mod:`.client` raises them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from controlplane import identities
from controlplane.channels.slack.client import SlackError, WebApi

USER_ID = re.compile(r"^[UW][A-Z0-9]{2,30}$")
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


@dataclass(frozen=True)
class Member:
    id: str  # TEAM/USER
    name: str


def _member(user: Any) -> Member | None:
    if not isinstance(user, dict) or user.get("deleted"):
        return None
    team, ident = user.get("team_id"), user.get("id")
    if not isinstance(team, str) or not isinstance(ident, str) or not team or not ident:
        return None
    return Member(identities.slack_id(team, ident), str(user.get("name") or ident))


async def home_team(api: WebApi) -> str | None:
    """The workspace the bot token belongs to (``auth.test``)."""
    team = (await api.call("auth.test", form={})).get("team_id")
    return team if isinstance(team, str) and team else None


async def find(api: WebApi, handle: str) -> Member | None:
    """The member ``handle`` names (see the module docstring), or None."""
    text = handle.strip()
    if USER_ID.match(text.upper()):
        try:
            body = await api.call("users.info", form={"user": text.upper()})
        except SlackError as exc:
            if exc.code == "user_not_found":
                return None
            raise
        return _member(body.get("user"))
    if EMAIL.match(text):
        try:
            body = await api.call("users.lookupByEmail", form={"email": text})
        except SlackError as exc:
            if exc.code == "users_not_found":
                return None
            raise
        return _member(body.get("user"))
    name = text.removeprefix("@").casefold()
    ours = await home_team(api)
    found: list[Member] = []
    async for user in api.pages("users.list", {"limit": "200"}, "members"):
        member = _member(user)
        if member is None or str(user.get("name", "")).casefold() != name:
            continue
        if ours is not None and user.get("team_id") != ours:
            continue  # another organisation's member with the same handle
        found.append(member)
    return found[0] if len(found) == 1 else None
