"""Who wrote a Slack message: the verified actor behind an event (users.info, usergroups).

The actor's id is ``TEAM/USER`` (:func:`controlplane.identities.slack_id`): the author's
workspace and user id, because a user id alone is unique only within one workspace and a
Slack Connect channel holds other organisations' members. The workspace is the event's
(``user_team``, ``team``), else the user's own record (``users.info``), else the workspace
the event was delivered for. The user's handle (``users.info``) is only the actor's name,
for display. User groups (``usergroups.list``) are our workspace's, so they count only for
our workspace's members. Both are cached for a few minutes.

A missing scope (``users:read``, ``usergroups:read``) degrades rather than blocks: the
name falls back to the id, the groups to none, with one warning. A transient failure with
nothing cached raises :class:`TransientError`, so the event is redelivered later instead of
being judged with less than we could know.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from controlplane import identities
from controlplane.channels.base import RateLimited
from controlplane.channels.slack.client import SlackError, WebApi
from controlplane.channels.slack.events import SlackMessage
from controlplane.errors import InvalidInput, TransientError
from controlplane.ingest.admission import Actor

log = logging.getLogger(__name__)

_MAX_USERS = 10_000  # cached at once; past that the cache starts over


@dataclass(frozen=True)
class _User:
    name: str
    is_bot: bool
    team: str | None = None


class Directory:
    def __init__(self, api: WebApi, *, ttl: float = 300.0) -> None:
        self._api = api
        self._ttl = ttl
        self._users: dict[str, tuple[float, _User]] = {}
        self._groups: tuple[float, dict[str, tuple[str, ...]]] | None = None
        self._groups_lock = asyncio.Lock()
        self._warned: set[str] = set()

    async def actor(self, message: SlackMessage, *, home_team: str | None = None) -> Actor:
        """The author, ``home_team`` being the workspace the app is installed in."""
        if message.user is None:  # an integration's message: a bot with no user behind it
            team = message.team
            if team is None:
                raise InvalidInput("the event names no Slack team")
            bot = message.bot_id or "BUNKNOWN"
            return Actor(
                id=identities.slack_id(team, bot), name=message.bot_name or bot, is_bot=True
            )
        user = await self._user(message.user)
        team = message.user_team or user.team or message.workspace
        if team is None:
            raise InvalidInput("the event names no Slack team")
        ours = home_team is None or team == home_team
        return Actor(
            id=identities.slack_id(team, message.user),
            name=user.name,
            is_bot=user.is_bot or message.bot_id is not None,
            # Our workspace's groups list our members' user ids; another team's member with
            # the same user id is not in them.
            groups=await self._groups_of(message.user) if ours else (),
        )

    async def _user(self, user_id: str) -> _User:
        cached = self._users.get(user_id)
        if cached is not None and time.monotonic() - cached[0] < self._ttl:
            return cached[1]
        try:
            body = await self._api.call("users.info", form={"user": user_id})
        except SlackError as exc:
            self._warn_once(
                f"users.{exc.code}", "slack users.info: %s; actors are named by id", exc
            )
            found = _User(name=user_id, is_bot=user_id == "USLACKBOT")
        except RateLimited as exc:
            if cached is not None:
                return cached[1]
            raise TransientError(str(exc)) from None
        except TransientError:
            if cached is not None:
                return cached[1]
            raise
        else:
            info = body.get("user") if isinstance(body.get("user"), dict) else {}
            assert isinstance(info, dict)
            team = info.get("team_id")
            found = _User(
                name=str(info.get("name") or user_id),
                is_bot=bool(info.get("is_bot")) or user_id == "USLACKBOT",
                team=team if isinstance(team, str) and team else None,
            )
        if len(self._users) >= _MAX_USERS:
            self._users.clear()
        self._users[user_id] = (time.monotonic(), found)
        return found

    async def _groups_of(self, user_id: str) -> tuple[str, ...]:
        async with self._groups_lock:
            if self._groups is None or time.monotonic() - self._groups[0] >= self._ttl:
                try:
                    self._groups = (time.monotonic(), await self._load_groups())
                except SlackError as exc:
                    self._warn_once(
                        f"groups.{exc.code}", "slack usergroups.list: %s; no user groups", exc
                    )
                    self._groups = (time.monotonic(), {})
                except (TransientError, RateLimited) as exc:
                    if self._groups is None:
                        raise TransientError(f"Slack user groups unavailable: {exc}") from None
                    # A stale membership beats none; try again next time.
            return self._groups[1].get(user_id, ())

    async def _load_groups(self) -> dict[str, tuple[str, ...]]:
        body = await self._api.call("usergroups.list", form={"include_users": "true"})
        members: dict[str, list[str]] = {}
        for group in body.get("usergroups") or []:
            if not isinstance(group, dict) or not group.get("id"):
                continue
            for user in group.get("users") or []:
                members.setdefault(str(user), []).append(str(group["id"]))
        return {user: tuple(sorted(ids)) for user, ids in members.items()}

    def _warn_once(self, key: str, template: str, exc: Exception) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(template, exc)
