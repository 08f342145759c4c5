"""The GitHub REST calls this channel makes, over one HTTP client.

Every call is made for a repository (the credential may differ per repository when a GitHub
App has several installations), answers are mapped to errors in one place
(:mod:`controlplane.channels.github.errors`), and the rate limit GitHub reports is
honoured before it is hit: once ``X-RateLimit-Remaining`` reaches 0, calls spending the same
budget raise :class:`RateLimited` until ``X-RateLimit-Reset`` instead of going out.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from controlplane.channels.base import ChannelError, RateLimited
from controlplane.channels.github.auth import Auth, Clock
from controlplane.channels.github.errors import body_of, raise_for_status
from controlplane.errors import TransientError

API_VERSION = "2022-11-28"
PER_PAGE = 100
REACTION_PATHS = {  # a message reference's kind -> where its reactions live
    "issue": "/repos/{repo}/issues/{id}/reactions",
    "issue_comment": "/repos/{repo}/issues/comments/{id}/reactions",
    "pull_request_review_comment": "/repos/{repo}/pulls/comments/{id}/reactions",
}


@dataclass(frozen=True)
class Page:
    """One page of a listing; ``not_modified`` when GitHub answered 304 to our ETag."""

    items: list[dict[str, Any]]
    etag: str | None = None
    next_url: str | None = None
    poll_interval: float | None = None  # X-Poll-Interval: GitHub's wish for the next poll
    not_modified: bool = False


class GithubClient:
    def __init__(
        self,
        api_url: str,
        auth: Auth,
        *,
        clock: Clock = time.time,
        timeout: float = 20.0,
    ) -> None:
        self.auth = auth
        self.clock = clock
        self.http = httpx.AsyncClient(
            base_url=api_url.rstrip("/"),
            timeout=timeout,
            headers={
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": API_VERSION,
                "User-Agent": "superagent",
            },
        )
        self._exhausted: dict[str, float] = {}  # rate budget -> when it resets

    async def close(self) -> None:
        await self.http.aclose()

    async def request(
        self,
        method: str,
        repo: str,
        url: str,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
        etag: str | None = None,
        allow: frozenset[int] = frozenset(),
    ) -> httpx.Response:
        """``method url`` on behalf of ``repo``; the response if it is a success, a 304, or
        one of the ``allow`` statuses the caller reads itself."""
        what = f"{method} {httpx.URL(url).path}"
        for attempt in (1, 2):
            credential = await self.auth.credential(self.http, repo)
            self._check_budget(credential.bucket, what)
            headers = {"Authorization": f"Bearer {credential.token}"}
            if etag is not None:
                headers["If-None-Match"] = etag
            try:
                response = await self.http.request(
                    method, url, json=json, params=params, headers=headers
                )
            except httpx.TransportError as exc:
                raise TransientError(f"GitHub did not answer {what} ({exc!r})") from None
            self._note_budget(credential.bucket, response)
            # An installation token can be revoked before it expires: one fresh try.
            if response.status_code == 401 and attempt == 1 and self.auth.forget(repo):
                continue
            if response.status_code in allow:
                return response
            raise_for_status(response, what, self.clock())
            return response
        raise AssertionError("unreachable")

    def _check_budget(self, bucket: str, what: str) -> None:
        reset = self._exhausted.get(bucket)
        if reset is None:
            return
        wait = reset - self.clock()
        if wait <= 0:
            del self._exhausted[bucket]
            return
        raise RateLimited(wait, f"GitHub rate limit spent; {what} waits {wait:.0f}s for reset")

    def _note_budget(self, bucket: str, response: httpx.Response) -> None:
        remaining = response.headers.get("x-ratelimit-remaining")
        reset = response.headers.get("x-ratelimit-reset")
        if remaining == "0" and reset and reset.isdigit():
            self._exhausted[bucket] = float(reset)

    # ------------------------------------------------------------------ listings

    async def page(
        self, repo: str, url: str, params: dict[str, str] | None = None, etag: str | None = None
    ) -> Page:
        """One page of a listing; conditional on ``etag`` (a 304 costs no rate limit)."""
        response = await self.request("GET", repo, url, params=params, etag=etag)
        interval = response.headers.get("x-poll-interval")
        poll_interval = float(interval) if interval and interval.isdigit() else None
        if response.status_code == 304:
            return Page([], etag, None, poll_interval, not_modified=True)
        items = body_of(response, f"GET {httpx.URL(url).path}")
        if not isinstance(items, list):
            raise TransientError(f"GitHub answered GET {httpx.URL(url).path} with no list")
        return Page(
            [item for item in items if isinstance(item, dict)],
            response.headers.get("etag"),
            self._next(response),
            poll_interval,
        )

    def _next(self, response: httpx.Response) -> str | None:
        url = response.links.get("next", {}).get("url")
        if not url:
            return None
        # The token goes with the request: follow links to GitHub's own API only.
        if httpx.URL(url).host != self.http.base_url.host:
            raise ChannelError(f"GitHub's next-page link points elsewhere ({url})")
        return str(url)

    async def pages(
        self, repo: str, url: str, params: dict[str, str] | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Every item of a listing, following ``Link: rel="next"``."""
        page = await self.page(repo, url, {**(params or {}), "per_page": str(PER_PAGE)})
        while True:
            for item in page.items:
                yield item
            if page.next_url is None:
                return
            page = await self.page(repo, page.next_url)

    # ------------------------------------------------------------------ users

    async def user(self, login: str, *, repo: str = "") -> dict[str, Any] | None:
        """The account that holds ``login`` now (``GET /users/{login}``), or None when no
        account does. ``repo`` picks the credential (a GitHub App's installation)."""
        path = f"/users/{quote(login, safe='[]')}"
        response = await self.request("GET", repo, path, allow=frozenset({404}))
        if response.status_code == 404:
            return None
        return self._object(response, f"GET {path}")

    # ------------------------------------------------------------------ comments

    async def create_comment(self, repo: str, number: int, body: str) -> dict[str, Any]:
        response = await self.request(
            "POST", repo, f"/repos/{repo}/issues/{number}/comments", json={"body": body}
        )
        return self._object(response, f"POST /repos/{repo}/issues/{number}/comments")

    async def find_comment(self, repo: str, number: int, text: str) -> dict[str, Any] | None:
        """The first comment on issue ``number`` whose body contains ``text``."""
        async for comment in self.pages(repo, f"/repos/{repo}/issues/{number}/comments"):
            if text in str(comment.get("body") or ""):
                return comment
        return None

    # ------------------------------------------------------------------ review comments

    async def review_comment(self, repo: str, comment_id: int) -> dict[str, Any] | None:
        """Review comment ``comment_id`` (``GET /repos/{repo}/pulls/comments/{id}``), or
        None when it is gone."""
        path = f"/repos/{repo}/pulls/comments/{comment_id}"
        response = await self.request("GET", repo, path, allow=frozenset({404}))
        if response.status_code == 404:
            return None
        return self._object(response, f"GET {path}")

    async def reply_to_review_comment(
        self, repo: str, number: int, comment_id: int, body: str
    ) -> dict[str, Any]:
        """A reply in the review thread of top-level review comment ``comment_id`` on pull
        request ``number`` (GitHub takes no reply to a reply)."""
        path = f"/repos/{repo}/pulls/{number}/comments/{comment_id}/replies"
        response = await self.request("POST", repo, path, json={"body": body})
        return self._object(response, f"POST {path}")

    async def find_review_comment(self, repo: str, number: int, text: str) -> dict[str, Any] | None:
        """The first review comment on pull request ``number`` whose body contains ``text``."""
        async for comment in self.pages(repo, f"/repos/{repo}/pulls/{number}/comments"):
            if text in str(comment.get("body") or ""):
                return comment
        return None

    async def react(self, repo: str, kind: str, ident: str, content: str = "eyes") -> None:
        """Add ``content`` (👀 by default) to an issue, a comment or a review comment.
        GitHub answers 200 instead of 201 when the reaction is there already."""
        template = REACTION_PATHS.get(kind)
        if template is None or not ident.isdigit():
            raise ChannelError(f"cannot react to {kind}:{ident}; not a GitHub message reference")
        path = template.format(repo=repo, id=ident)
        await self.request("POST", repo, path, json={"content": content})

    # ------------------------------------------------------------------ pull requests

    async def open_pull_request(
        self, repo: str, *, head: str, base: str, title: str, body: str
    ) -> str:
        """The URL of the open pull request from ``head`` (a branch, or owner:branch for a
        fork): the existing one if there is one, else a new one. Safe to repeat."""
        qualified = head if ":" in head else f"{repo.split('/')[0]}:{head}"
        existing = await self._open_pull_request(repo, qualified)
        if existing is not None:
            return existing
        try:
            response = await self.request(
                "POST",
                repo,
                f"/repos/{repo}/pulls",
                json={"title": title, "head": head, "base": base, "body": body},
            )
        except ChannelError:
            # Opened meanwhile by an earlier attempt (GitHub: 422 "A pull request already
            # exists"): that one is the answer.
            existing = await self._open_pull_request(repo, qualified)
            if existing is not None:
                return existing
            raise
        return str(self._object(response, f"POST /repos/{repo}/pulls").get("html_url"))

    @staticmethod
    def _object(response: httpx.Response, what: str) -> dict[str, Any]:
        found = body_of(response, what)
        if not isinstance(found, dict):
            raise TransientError(f"GitHub's answer to {what} is not an object; will retry")
        return found

    async def _open_pull_request(self, repo: str, head: str) -> str | None:
        page = await self.page(
            repo, f"/repos/{repo}/pulls", {"state": "open", "head": head, "per_page": "1"}
        )
        return str(page.items[0]["html_url"]) if page.items else None
