"""The GitHub adapter: replies as issue/PR comments, 👀 on accepted requests, polling.

A thread is one issue or PR, ``owner/repo#number``: everything a reply needs. Each reply
carries a hidden marker, ``<!-- superagent:{reply_id} -->``; any but the first try first
looks for a comment with its marker and returns that one instead of posting twice.

A reply to a review comment (``reply_to`` ``pull_request_review_comment:<id>``) goes into
that comment's review thread, answering its top-level comment (GitHub takes no reply to a
reply); if the comment is gone, the reply becomes a comment on the pull request instead.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import ClassVar

import asyncpg

from controlplane.channels.base import (
    Acknowledgement,
    ChannelAdapter,
    ChannelError,
    OutboundMessage,
)
from controlplane.channels.context import ChannelContext
from controlplane.channels.github.auth import AppAuth, Auth, Clock, TokenAuth, load_private_key
from controlplane.channels.github.client import GithubClient
from controlplane.channels.github.events import SOURCE
from controlplane.channels.github.receiver import GithubPoller
from controlplane.errors import ConfigError
from controlplane.ingest.intake import Intake
from controlplane.services import Service
from controlplane.settings import GithubSettings

log = logging.getLogger(__name__)

_THREAD = re.compile(r"(?P<repo>[^/#\s]+/[^/#\s]+)#(?P<number>\d+)")
REVIEW_COMMENT = "pull_request_review_comment"  # a message reference's kind (events.py)


def parse_thread(external_id: str) -> tuple[str, int]:
    """``owner/repo#7`` as (``owner/repo``, 7)."""
    match = _THREAD.fullmatch(external_id)
    if match is None:
        raise ChannelError(f"{external_id!r} is not a GitHub thread (owner/repo#number)")
    return match["repo"], int(match["number"])


def marker(reply_id: str) -> str:
    """The hidden mark that makes a reply findable (and so never posted twice)."""
    return f"<!-- superagent:{reply_id} -->"


class GithubAdapter(ChannelAdapter):
    source: ClassVar[str] = SOURCE

    def __init__(
        self, client: GithubClient, intake: Intake, pool: asyncpg.Pool, settings: GithubSettings
    ) -> None:
        self.client = client
        self.intake = intake
        self.pool = pool
        self.settings = settings

    async def send(self, message: OutboundMessage) -> str:
        repo, number = parse_thread(message.thread_external_id)
        kind, _, ident = (message.reply_to or "").partition(":")
        if kind == REVIEW_COMMENT and ident.isdigit():
            answered = await self._reply_in_review(repo, number, int(ident), message)
            if answered is not None:
                return answered
        return await self._comment(repo, number, message)

    async def _comment(self, repo: str, number: int, message: OutboundMessage) -> str:
        mark = marker(message.reply_id)
        if not message.first_try:
            earlier = await self.client.find_comment(repo, number, mark)
            if earlier is not None:
                return f"issue_comment:{earlier['id']}"
        posted = await self.client.create_comment(repo, number, f"{message.text}\n\n{mark}")
        return f"issue_comment:{posted['id']}"

    async def _reply_in_review(
        self, repo: str, number: int, comment_id: int, message: OutboundMessage
    ) -> str | None:
        """The reply in the review thread; None if the comment is gone (say it on the PR)."""
        mark = marker(message.reply_id)
        if not message.first_try:
            earlier = await self.client.find_review_comment(repo, number, mark)
            if earlier is not None:
                return f"{REVIEW_COMMENT}:{earlier['id']}"
        comment = await self.client.review_comment(repo, comment_id)
        if comment is None:
            return None
        root = comment.get("in_reply_to_id") or comment_id
        posted = await self.client.reply_to_review_comment(
            repo, number, int(root), f"{message.text}\n\n{mark}"
        )
        return f"{REVIEW_COMMENT}:{posted['id']}"

    async def acknowledge(self, ack: Acknowledgement) -> None:
        repo, _number = parse_thread(ack.thread_external_id)
        kind, _, ident = ack.message_ref.partition(":")
        await self.client.react(repo, kind, ident, "eyes")

    def leader_services(self) -> list[Callable[[], Service]]:
        repos = self.settings.repos
        if not repos:
            return []

        def poller() -> Service:
            return GithubPoller(
                self.client,
                self.intake,
                self.pool,
                repos,
                interval=self.settings.poll_seconds,
                agent_login=self.settings.agent_login,
            )

        return [poller]

    async def close(self) -> None:
        await self.client.close()


def make_auth(settings: GithubSettings, *, clock: Clock = time.time) -> Auth:
    """The configured identity: a personal access token, or a GitHub App."""
    if settings.token is not None:
        return TokenAuth(settings.token.get_secret_value())
    if settings.app_id is None:
        raise ConfigError(
            "GitHub has no credentials: set SUPERAGENT_GITHUB__TOKEN, or "
            "SUPERAGENT_GITHUB__APP_ID and SUPERAGENT_GITHUB__PRIVATE_KEY(_FILE)"
        )
    if settings.private_key is not None:
        pem = settings.private_key.get_secret_value()
        # A PEM pasted into one environment variable often arrives with literal "\n"s.
        if "\n" not in pem.strip():
            pem = pem.replace("\\n", "\n")
        data = pem.encode()
    elif settings.private_key_file is not None:
        try:
            data = settings.private_key_file.expanduser().read_bytes()
        except OSError as exc:
            raise ConfigError(
                f"cannot read the GitHub App private key file {settings.private_key_file}: "
                f"{exc.strerror}"
            ) from None
    else:
        raise ConfigError("the GitHub App needs SUPERAGENT_GITHUB__PRIVATE_KEY(_FILE)")
    return AppAuth(
        settings.app_id,
        load_private_key(data),
        installation_id=settings.installation_id,
        clock=clock,
    )


def build(ctx: ChannelContext) -> GithubAdapter | None:
    settings = ctx.settings.github
    if not settings.has_credentials:
        if settings.webhook_secret is not None:
            log.warning(
                "GitHub webhooks are received, but replies cannot be sent: set "
                "SUPERAGENT_GITHUB__TOKEN or a GitHub App (SUPERAGENT_GITHUB__APP_ID...)"
            )
        return None
    client = GithubClient(settings.api_url, make_auth(settings))
    return GithubAdapter(client, ctx.intake, ctx.pool, settings)
