"""Polling GitHub, for deployments GitHub cannot reach (``poll_repos``).

Per repository, three listings sorted by ``updated`` ascending, from a cursor:

* ``/issues/comments``: new comments on issues and PRs;
* ``/pulls/comments``: new review comments;
* ``/issues`` (issues and PRs): those opened since polling began.

Each object becomes the trigger its webhook would make (the webhook mapping is reused on a
webhook-shaped payload), with the same stable external id (``issue_comment:<id>``...): an
object listed twice, or seen by a webhook too, is ingested once. Its actor is the same too:
the user's numeric id, never the login (an object whose user has no id is skipped).

What is kept, per listing, in ``channel_state`` (key ``poll:<owner/repo>:<listing>``): the
cursor (the newest ``updated_at`` ingested), when polling began, and the ETag of the last
answer with the request it answers. A cursor moves only after what it covers is ingested
(page by page), so a restart at any point resumes without a gap; what is read twice
dedupes. Each request re-reads :data:`OVERLAP` before the cursor, for objects GitHub lists a
little after their ``updated_at``. The same request again carries ``If-None-Match``: a 304
costs nothing against the rate limit and ingests nothing.

GitHub's pacing wins: the next round waits for ``X-Poll-Interval`` when it is longer than
``poll_seconds``, and for the rate limit's reset (or ``Retry-After``) when limited.

Not seen by polling (webhooks only): later assignments and review requests, reviews, CI.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import asyncpg

from controlplane.channels.base import ChannelError, Ignored, RateLimited, save_state
from controlplane.channels.github import events
from controlplane.channels.github.client import GithubClient
from controlplane.errors import InvalidInput
from controlplane.ingest.intake import IncomingTrigger, Intake
from controlplane.services import Service, critical_loop, sleep_unless

log = logging.getLogger(__name__)

OVERLAP = timedelta(seconds=60)
_UPDATED = {"sort": "updated", "direction": "asc", "per_page": "100"}


@dataclass(frozen=True)
class Listing:
    name: str
    path: str  # with {repo}
    params: dict[str, str] = field(default_factory=dict)


LISTINGS = (
    Listing("issue_comments", "/repos/{repo}/issues/comments", _UPDATED),
    Listing("review_comments", "/repos/{repo}/pulls/comments", _UPDATED),
    Listing("issues", "/repos/{repo}/issues", {"state": "all", **_UPDATED}),
)


@dataclass(frozen=True)
class Cursor:
    since: datetime  # the newest updated_at ingested
    began: datetime  # when polling this listing began: older issues are not news
    request: str | None = None  # the request the ETag answers
    etag: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "since": _iso(self.since),
            "began": _iso(self.began),
            "request": self.request,
            "etag": self.etag,
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Cursor:
        return cls(
            _time(value["since"]), _time(value["began"]), value.get("request"), value.get("etag")
        )


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _time(text: Any) -> datetime:
    return datetime.fromisoformat(str(text))


def _updated(item: dict[str, Any], otherwise: datetime) -> datetime:
    try:
        return _time(item["updated_at"])
    except (KeyError, ValueError):
        return otherwise


def _number(api_url: Any) -> int:
    """The issue or PR number at the end of an API URL (``.../issues/7``, ``.../pulls/7``)."""
    return int(str(api_url).rstrip("/").rsplit("/", 1)[1])


# A listed comment is delivered as this webhook event would be: (event, parent key, the
# field holding the parent's API URL).
_COMMENT_LISTINGS = {
    "issue_comments": ("issue_comment", "issue", "issue_url"),
    "review_comments": ("pull_request_review_comment", "pull_request", "pull_request_url"),
}


def triggers_for(
    listing: str, repo: str, item: dict[str, Any], began: datetime, agent_login: str | None
) -> list[IncomingTrigger]:
    """The triggers a listed object makes: what its webhook delivery would have made."""
    body = json.dumps(item).encode()
    repository = {"full_name": repo}
    if listing in _COMMENT_LISTINGS:
        event, parent, url_field = _COMMENT_LISTINGS[listing]
        payload: dict[str, Any] = {
            "action": "created",
            parent: {
                "number": _number(item[url_field]),
                "html_url": str(item.get("html_url", "")).split("#")[0] or None,
            },
            "comment": item,
            "repository": repository,
            "sender": item.get("user"),
        }
        made = events.to_triggers(
            event, f"{event}:{item['id']}", payload, body, agent_login=agent_login
        )
    else:
        if _time(item["created_at"]) < began:
            return []  # an older issue with news: its comments are the news
        pull = "pull_request" in item
        event = "pull_request" if pull else "issues"
        payload = {
            "action": "opened",
            "pull_request" if pull else "issue": item,
            "repository": repository,
            "sender": item["user"],
        }
        # Opened already assigned to the agent addresses it, as an assignment would.
        mine = [a for a in item.get("assignees") or [] if events.by_agent(a, agent_login)]
        if mine:
            payload["assignee"] = mine[0]
        made = events.to_triggers(
            event, f"opened:{repo}#{item['number']}", payload, body, agent_login=agent_login
        )
    return [] if isinstance(made, Ignored) else made


class CursorStore:
    """Cursors in ``channel_state``."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    @staticmethod
    def key(repo: str, listing: Listing) -> str:
        return f"poll:{repo}:{listing.name}"

    async def load(self, key: str) -> Cursor | None:
        value = await self.pool.fetchval(
            "SELECT value FROM channel_state WHERE source = $1 AND key = $2",
            events.SOURCE,
            key,
        )
        return None if value is None else Cursor.from_json(value)

    async def save(self, key: str, cursor: Cursor) -> None:
        await save_state(self.pool, events.SOURCE, key, cursor.to_json())


class GithubPoller(Service):
    """Polls ``repos`` and ingests what is new. Run once per deployment (on the leader)."""

    name = "github-poller"

    def __init__(
        self,
        client: GithubClient,
        intake: Intake,
        pool: asyncpg.Pool,
        repos: list[str],
        *,
        interval: float,
        agent_login: str | None = None,
    ) -> None:
        super().__init__()
        self.client = client
        self.intake = intake
        self.cursors = CursorStore(pool)
        self.repos = repos
        self.interval = interval
        self.agent_login = agent_login

    async def run(self) -> None:
        async def round_then_wait() -> None:
            wait = await self.poll_once()
            await sleep_unless(self.stopping, wait)

        await critical_loop(self.name, round_then_wait, self.stopping)

    async def poll_once(self) -> float:
        """One round over every repository; returns the seconds to wait before the next.

        A rate limit ends the round (the budget is shared); a repository GitHub refuses is
        logged with what to fix, and the others are still polled. Network failures and
        5xx propagate (transient: the service retries with backoff).
        """
        wait = self.interval
        for repo in self.repos:
            for listing in LISTINGS:
                if self.stopping.is_set():
                    return 0.0
                try:
                    asked = await self.poll(repo, listing)
                except RateLimited as limited:
                    log.warning("github polling paused: %s", limited)
                    return max(wait, limited.seconds)
                except ChannelError as exc:
                    log.error("github polling of %s skipped this round: %s", repo, exc)
                    break
                if asked is not None:
                    wait = max(wait, asked)
        return wait

    async def poll(self, repo: str, listing: Listing) -> float | None:
        """Ingest what is new in one listing; returns GitHub's X-Poll-Interval, if any."""
        key = self.cursors.key(repo, listing)
        cursor = await self.cursors.load(key)
        if cursor is None:
            # Polling begins now, and says so at once: a restart keeps this starting point.
            now = datetime.fromtimestamp(self.client.clock(), UTC).replace(microsecond=0)
            cursor = Cursor(since=now, began=now)
            await self.cursors.save(key, cursor)
        path = listing.path.format(repo=repo)
        params = {**listing.params, "since": _iso(cursor.since - OVERLAP)}
        request = f"{path}?{urlencode(sorted(params.items()))}"
        etag = cursor.etag if cursor.request == request else None
        page = await self.client.page(repo, path, params, etag)
        if page.not_modified:
            return page.poll_interval
        newest = cursor.since
        pages = 1
        while True:
            for item in page.items:
                await self._ingest(listing, repo, item, cursor.began)
                newest = max(newest, _updated(item, newest))
            if page.next_url is None:
                break
            # Progress is kept page by page: a restart resumes here, not at the start.
            await self.cursors.save(key, Cursor(newest, cursor.began))
            page = await self.client.page(repo, page.next_url)
            pages += 1
        # A 304 to the first page says nothing of later ones: keep an ETag for one-page
        # answers only.
        single = pages == 1
        await self.cursors.save(
            key,
            Cursor(
                newest,
                cursor.began,
                request if single else None,
                page.etag if single else None,
            ),
        )
        return page.poll_interval

    async def _ingest(
        self, listing: Listing, repo: str, item: dict[str, Any], began: datetime
    ) -> None:
        try:
            made = triggers_for(listing.name, repo, item, began, self.agent_login)
            for trigger in made:
                await self.intake.ingest(trigger)
        except (KeyError, TypeError, ValueError, AttributeError, InvalidInput) as exc:
            # One odd object must not stop the listing behind it.
            log.warning(
                "github polling: skipped %s %s in %s (%s: %s)",
                listing.name,
                item.get("id"),
                repo,
                type(exc).__name__,
                exc,
            )
