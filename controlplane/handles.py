"""Handles to ids, once, on save: what people write for an account becomes the channel's
immutable id before a policy version or an account link is stored.

Authority matches immutable ids only (:mod:`controlplane.identities`). People write
``github:octocat``, ``@alice``, ``slack:alice@acme.example``, ``lark:li@acme.example``:
each is looked up here, when the document is saved, and the saved document keeps the id
(a policy keeps the handle too, in ``labels``, for people reading it; a link keeps it as
its label). Nothing is looked up again when events arrive, so a later rename, or a
registration of a freed login, changes nothing.

Where an id comes from:

* the channel's API, when the channel is configured: GitHub ``GET /users/{login}``; Slack
  ``users.info``, ``users.lookupByEmail``, ``users.list``
  (:mod:`controlplane.channels.slack.members`); Lark's contact API (emails). Matrix ids
  are ids already. The web chat has one principal, ``web:admin``. A handle the API does not
  know is refused: the old owner of a login is exactly who must not be found by it;
* otherwise the directory of actors seen in stored triggers, and only when the handle was
  seen with exactly one id (GitHub logins and Slack handles; never a Lark display name or a
  web chat name, which their owners type).

Whatever cannot be resolved is refused with :class:`InvalidInput` naming the entry and how
to give the id instead; nothing is saved then. The API calls are made before the saving
transaction opens, never inside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

import asyncpg
import httpx

from controlplane import identities
from controlplane.channels.base import ChannelError, RateLimited
from controlplane.errors import InvalidInput, SuperagentError, TransientError
from controlplane.settings import Settings

if TYPE_CHECKING:
    from controlplane.channels.github.client import GithubClient
    from controlplane.channels.lark.client import LarkApi
    from controlplane.channels.slack.client import WebApi

__all__ = ["Resolved", "Resolver"]

_GITHUB_LOGIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})(?:\[bot\])?$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_SEEN_LIMIT = 20
_CHANNEL_NAMES = {"github": "GitHub", "slack": "Slack", "lark": "Lark"}


@dataclass(frozen=True)
class Resolved:
    source: str
    id: str
    label: str | None = None  # what it was written as, when that was not the id itself
    via: str | None = None  # where the id came from, for the person saving


@dataclass
class _Lists:
    """The entries of one policy list and what they may be."""

    where: str  # "sources.github.users"
    source: str | None  # the channel its actors come from; None: any (default, agent_ids)
    people: bool  # person names count (allowlists only)
    entries: list[str] = field(default_factory=list)


def _refuse(written: str, why: str, source: str | None) -> InvalidInput:
    given = identities.HOW_TO_GIVE.get(source or "")
    how = f"; give {given} instead" if given else ""
    return InvalidInput(f"cannot resolve {written}: {why}{how}")


class Resolver:
    """Resolves handles with the configured channels' APIs and the stored triggers."""

    def __init__(self, settings: Settings, pool: asyncpg.Pool) -> None:
        self.settings = settings
        self.pool = pool
        self._http: httpx.AsyncClient | None = None
        self._github: GithubClient | None = None
        self._slack: WebApi | None = None
        self._lark: LarkApi | None = None
        self._cache: dict[tuple[str, str], Resolved] = {}

    async def __aenter__(self) -> Resolver:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        for client in (self._github, self._lark):
            if client is not None:
                await client.close()
        if self._http is not None:
            await self._http.aclose()

    # ------------------------------------------------------------------ accounts

    async def account(self, source: str, written: str) -> Resolved:
        """The id of the ``source`` account ``written`` names (an id is returned as it is)."""
        key = (source, written)
        if key not in self._cache:
            self._cache[key] = await self._account(source, written.strip())
        return self._cache[key]

    async def _account(self, source: str, handle: str) -> Resolved:
        written = identities.account_text(source, handle)
        if not handle:
            raise _refuse(written, "it is empty", source)
        if source == "web":
            if handle in ("admin", identities.WEB_ADMIN):
                return Resolved(source, identities.WEB_ADMIN)
            why = "names typed in the web chat are labels, not identities"
            raise _refuse(written, why, "web")
        if source == "slack" and identities.is_id(source, handle.upper()):
            return Resolved(source, handle.upper())
        if identities.is_id(source, handle):
            return Resolved(source, handle)
        if source == "github":
            return await self._github_login(written, handle.removeprefix("@"))
        if source == "slack":
            return await self._slack_member(written, handle)
        if source == "lark":
            return await self._lark_email(written, handle)
        if source not in identities.SOURCES:
            raise _refuse(written, f"no channel is called {source!r}", None)
        raise _refuse(written, f"it is not a {source} id", source)

    async def _github_login(self, written: str, login: str) -> Resolved:
        if not _GITHUB_LOGIN.match(login):
            raise _refuse(written, "that is not a GitHub login", "github")
        client = self._github_client()
        if client is None:
            return await self._seen_once("github", written, login)
        repos = self.settings.github.repos
        try:
            user = await client.user(login, repo=repos[0] if repos else "")
        except (ChannelError, RateLimited, TransientError) as exc:
            raise _refuse(written, f"asking GitHub failed ({exc})", "github") from None
        if user is None or not identities.is_id("github", str(user.get("id"))):
            raise _refuse(written, "GitHub has no user with that login", "github")
        return Resolved("github", str(user["id"]), written, "GitHub")

    async def _slack_member(self, written: str, handle: str) -> Resolved:
        from controlplane.channels.slack import members

        api = self._slack_api()
        if api is None:
            if members.EMAIL.match(handle):
                raise _refuse(written, "emails need Slack (SUPERAGENT_SLACK__BOT_TOKEN)", "slack")
            if members.USER_ID.match(handle.upper()):
                return await self._seen_once("slack", written, handle.upper(), by_user=True)
            return await self._seen_once("slack", written, handle.removeprefix("@"))
        try:
            member = await members.find(api, handle)
        except (ChannelError, RateLimited, TransientError) as exc:
            raise _refuse(written, f"asking Slack failed ({exc})", "slack") from None
        if member is None:
            why = "Slack knows no such member of this workspace (display names never count)"
            raise _refuse(written, why, "slack")
        return Resolved("slack", member.id, written, "Slack")

    async def _lark_email(self, written: str, handle: str) -> Resolved:
        if not _EMAIL.match(handle):
            why = "a Lark display name is not an identity (anyone's may be the same)"
            raise _refuse(written, why, "lark")
        api = self._lark_api()
        if api is None:
            raise _refuse(written, "emails need Lark (SUPERAGENT_LARK__APP_ID)", "lark")
        try:
            open_id = await api.open_id_by_email(handle)
        except (ChannelError, RateLimited, TransientError, httpx.HTTPError) as exc:
            raise _refuse(written, f"asking Lark failed ({exc})", "lark") from None
        if open_id is None or not identities.is_id("lark", open_id):
            raise _refuse(written, "Lark knows no member with that email", "lark")
        return Resolved("lark", open_id, written, "Lark")

    async def _seen_once(
        self, source: str, written: str, name: str, *, by_user: bool = False
    ) -> Resolved:
        """The one id ``name`` was seen with in stored triggers (the channel's API is not
        configured here); refused when it was seen with none or several."""
        if by_user:  # a bare Slack user id: the team it was seen in
            rows = await self.pool.fetch(
                "SELECT DISTINCT actor_id FROM triggers WHERE source = $1 AND actor_id LIKE $2 "
                "ORDER BY actor_id LIMIT $3",
                source,
                f"%/{name}",
                _SEEN_LIMIT,
            )
        else:
            rows = await self.pool.fetch(
                "SELECT DISTINCT actor_id FROM triggers "
                "WHERE source = $1 AND lower(actor_name) = lower($2) ORDER BY actor_id LIMIT $3",
                source,
                name,
                _SEEN_LIMIT,
            )
        ids = [row["actor_id"] for row in rows if identities.is_id(source, row["actor_id"])]
        channel = _CHANNEL_NAMES.get(source, source)
        if not ids:
            why = f"{channel} is not configured here to look it up, and no event from it is stored"
            raise _refuse(written, why, source)
        if len(ids) > 1:
            why = f"events from it came from several accounts ({', '.join(ids)}): renamed?"
            raise _refuse(written, why, source)
        return Resolved(source, ids[0], written, "the events stored")

    # ------------------------------------------------------------------ clients

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=20.0)
        return self._http

    def _github_client(self) -> GithubClient | None:
        if self._github is None and self.settings.github.has_credentials:
            from controlplane.channels.github.adapter import make_auth
            from controlplane.channels.github.client import GithubClient

            settings = self.settings.github
            self._github = GithubClient(settings.api_url, make_auth(settings))
        return self._github

    def _slack_api(self) -> WebApi | None:
        token = self.settings.slack.bot_token
        if self._slack is None and token is not None:
            from controlplane.channels.slack.client import WebApi

            api_url = self.settings.slack.api_url
            self._slack = WebApi(api_url, token, "SUPERAGENT_SLACK__BOT_TOKEN", self._client())
        return self._slack

    def _lark_api(self) -> LarkApi | None:
        settings = self.settings.lark
        if self._lark is None and settings.app_id and settings.app_secret is not None:
            from controlplane.channels.lark.client import LarkApi

            secret = settings.app_secret.get_secret_value()
            self._lark = LarkApi(
                settings.domain, settings.app_id, secret, timeout=settings.timeout_seconds
            )
        return self._lark

    # ------------------------------------------------------------------ policies

    async def policy(self, body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """``body`` (a validated policy document) with every handle in ``agent_ids``,
        ``users`` and ``bots`` replaced by its id, ``labels`` saying what each was written
        as; and one line per lookup, for the person saving. InvalidInput for the first
        entry that cannot be resolved."""
        resolved = dict(body)
        resolved["sources"] = {name: dict(part) for name, part in body["sources"].items()}
        resolved["default"] = dict(body["default"])
        rows = await self.pool.fetch("SELECT name FROM people")
        persons = {str(row["name"]).casefold() for row in rows}
        labels: dict[str, str] = dict(body.get("labels") or {})
        notes: list[str] = []
        present: set[str] = set()

        async def convert(part: _Lists) -> list[str]:
            kept: list[str] = []
            for entry in part.entries:
                found = await self._entry(part, entry.strip(), persons)
                if isinstance(found, Resolved):
                    value = found.id
                    if found.label is not None:
                        labels[found.id] = found.label
                        notes.append(f"{found.label} → {found.id} (from {found.via})")
                else:
                    value = found
                present.add(value)
                if value not in kept:
                    kept.append(value)
            return kept

        resolved["agent_ids"] = await convert(_Lists("agent_ids", None, False, body["agent_ids"]))
        for key in ("users", "bots"):
            part = _Lists(f"default.{key}", None, key == "users", body["default"][key])
            resolved["default"][key] = await convert(part)
        for name, source in resolved["sources"].items():
            for key in ("users", "bots"):
                part = _Lists(f"sources.{name}.{key}", name, key == "users", source[key])
                source[key] = await convert(part)
        resolved["labels"] = {k: v for k, v in labels.items() if k in present}
        return resolved, notes

    async def _entry(self, part: _Lists, entry: str, persons: set[str]) -> Resolved | str:
        """One list entry: a Resolved handle, or the entry itself (an id, a person)."""
        where = f"{part.where}: {entry!r}"
        prefix, sep, rest = entry.partition(":")
        if sep and prefix.lower() in identities.SOURCES and rest.strip():
            source = prefix.lower()
            if part.source is not None and source != part.source:
                raise InvalidInput(
                    f"{where} is a {source} account; events on {part.source} never come from it"
                )
            return await self._in(where, source, rest)
        if part.source is not None:
            if identities.is_id(part.source, entry):
                return entry
            if part.people and entry.casefold() in persons:
                return entry
            return await self._in(where, part.source, entry, people=part.people)
        if identities.source_of(entry) is not None:
            return entry
        if part.people and entry.casefold() in persons:
            return entry
        who = "an id nor a person (`superagent users list`)" if part.people else "an id"
        raise InvalidInput(
            f"{where} is neither {who}; write it as SOURCE:HANDLE to resolve it "
            f"(e.g. github:{entry}), or give the id"
        )

    async def _in(self, where: str, source: str, handle: str, *, people: bool = False) -> Resolved:
        try:
            return await self.account(source, handle)
        except SuperagentError as exc:
            also = " (or the name of a person: `superagent users list`)" if people else ""
            raise InvalidInput(f"{where}: {exc.message}{also}") from None
