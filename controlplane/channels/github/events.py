"""GitHub webhooks: verified deliveries become Triggers on the issue's or PR's thread.

* The signature (``X-Hub-Signature-256``: HMAC-SHA256 of the raw body with the webhook
  secret) is checked in constant time before anything is parsed.
* Dedupe: a comment, a review comment and an issue's or PR's opening have a stable
  external id of their own (``issue_comment:<id>``, ``pull_request_review_comment:<id>``,
  ``opened:owner/repo#7``), shared with polling (:mod:`.receiver`), so a redelivery, or the
  same comment seen by both webhook and poller, is one trigger. Other events dedupe on
  ``X-GitHub-Delivery``.
* ``ack_ref`` names what gets the 👀 when the event is an explicit request: the comment,
  the review comment, or the issue/PR itself (``issue:<number>``).
* The actor is the account's numeric id; its login is only its name (logins are renamed,
  and a freed one can be registered by someone else). A user without an id is refused.
* The agent's own comments, issues and PRs (``agent_login``) are not triggers.
* One issue or PR is one thread (``owner/repo#number``). Review comments and reviews land
  on their PR's thread; CI results (``check_run``, ``check_suite``, ``workflow_run``) land
  on the thread of each PR they ran for.
* GitHub's verdict comes first in the text, in a fixed form (``CI failure: tests (url)``,
  ``pull_request.closed (merged): title``; :mod:`controlplane.tickets.pr_events`), before
  any name people chose: whether CI failed and whether a PR was merged are read there.
* Everything else (pushes, installations, pings...) is ignored deliberately, with the reason
  in the answer and a log line.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Any

from controlplane import identities
from controlplane.channels.base import Ignored
from controlplane.errors import InvalidInput
from controlplane.ingest.admission import Actor
from controlplane.ingest.intake import IncomingTrigger, ThreadRef
from controlplane.tickets import pr_events

log = logging.getLogger(__name__)

SOURCE = "github"
MAX_BODY = 25 << 20  # GitHub caps webhook payloads at 25 MB


def signature_valid(secret: bytes, body: bytes, header: str | None) -> bool:
    """``X-Hub-Signature-256`` against the raw body, compared in constant time."""
    if not header or not header.startswith("sha256="):
        return False
    return hmac.compare_digest(sign(secret, body).encode(), header.encode())


def sign(secret: bytes, body: bytes) -> str:
    """What GitHub puts in ``X-Hub-Signature-256`` (for tests and benchmarks)."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def _actor(user: Any) -> Actor:
    """The account's numeric id is who it is; its login, which can be renamed and then
    registered again by someone else, is only its name. No id, no actor."""
    if not isinstance(user, dict) or "login" not in user:
        raise InvalidInput("the payload names no user")
    ident = user.get("id")
    if isinstance(ident, bool) or not identities.is_id(SOURCE, str(ident)):
        raise InvalidInput("the payload's user has no numeric id")
    return Actor(
        id=str(ident),
        name=str(user["login"]),
        is_bot=user.get("type") == "Bot" or str(user["login"]).endswith("[bot]"),
    )


def _thread(repo: str, number: Any, title: Any = None, url: Any = None) -> ThreadRef:
    return ThreadRef(
        f"{repo}#{number}",
        title=str(title) if title else None,
        url=str(url) if url else None,
    )


def by_agent(user: Any, agent: str | None) -> bool:
    return agent is not None and isinstance(user, dict) and user.get("login") == agent


def _assigned_to(payload: dict[str, Any], agent: str | None) -> bool:
    if agent is None:
        return False
    people = [payload.get("assignee"), payload.get("requested_reviewer")]
    return any(isinstance(p, dict) and p.get("login") == agent for p in people)


def to_triggers(
    event: str,
    delivery: str,
    payload: Any,
    body: bytes,
    *,
    agent_login: str | None = None,
) -> list[IncomingTrigger] | Ignored:
    """The Triggers a delivery makes, or why it makes none. InvalidInput if malformed."""
    if not isinstance(payload, dict):
        raise InvalidInput("the payload is not a JSON object")
    action = str(payload.get("action", ""))
    repository = payload.get("repository")
    if not isinstance(repository, dict) or "full_name" not in repository:
        return Ignored(f"{event} is not about a repository")
    repo = str(repository["full_name"])
    name = f"{event}.{action}" if action else event
    # Said in public unless the repository says it is private; unknown stays unknown.
    private = repository.get("private")
    public = (not private) if isinstance(private, bool) else None

    def one(
        thread: ThreadRef,
        actor: Any,
        text: str,
        *,
        direct: bool = False,
        key: str | None = None,
        ack: str | None = None,
    ) -> IncomingTrigger:
        return IncomingTrigger(
            source=SOURCE,
            external_id=key or delivery,
            thread=thread,
            actor=_actor(actor),
            kind=name,
            text=text,
            direct=direct,
            payload=body,
            ack_ref=ack,
            public=public,
        )

    if event == "issue_comment" and action == "created":
        issue, comment = payload["issue"], payload["comment"]
        if by_agent(comment["user"], agent_login):
            return Ignored("the agent's own comment")
        thread = _thread(repo, issue["number"], issue.get("title"), issue.get("html_url"))
        ref = f"issue_comment:{comment['id']}" if comment.get("id") else None
        return [one(thread, comment["user"], str(comment.get("body") or ""), key=ref, ack=ref)]
    if event in ("issues", "pull_request") and action in (
        "opened",
        "reopened",
        "assigned",
        "review_requested",
        "closed",
        "synchronize",
        "ready_for_review",
    ):
        item = payload["issue" if event == "issues" else "pull_request"]
        if by_agent(payload["sender"], agent_login):
            return Ignored(f"{name} by the agent itself")
        number = item["number"]
        thread = _thread(repo, number, item.get("title"), item.get("html_url"))
        if action in ("opened", "reopened"):
            text = f"{item.get('title') or ''}\n\n{item.get('body') or ''}".strip()
        elif event == "pull_request" and action == "closed":
            # Merged or not decides how the ticket ends: GitHub's field, written first.
            text = pr_events.closed_text(item.get("merged") is True, str(item.get("title") or ""))
        else:
            text = f"{name}: {item.get('title') or ''}"
        requests = ("opened", "reopened", "assigned", "review_requested")
        return [
            one(
                thread,
                payload["sender"],
                text,
                direct=_assigned_to(payload, agent_login),
                # Opened once per number: a stable id; the others may repeat, per delivery.
                key=f"opened:{repo}#{number}" if action == "opened" else None,
                ack=f"issue:{number}" if action in requests else None,
            )
        ]
    if event == "pull_request_review_comment" and action == "created":
        pr, comment = payload["pull_request"], payload["comment"]
        if by_agent(comment["user"], agent_login):
            return Ignored("the agent's own review comment")
        thread = _thread(repo, pr["number"], pr.get("title"), pr.get("html_url"))
        where = f"{comment.get('path', '')}:{comment.get('line') or comment.get('position') or ''}"
        ref = f"pull_request_review_comment:{comment['id']}" if comment.get("id") else None
        text = f"on {where}: {comment.get('body') or ''}"
        return [one(thread, comment["user"], text, key=ref, ack=ref)]
    if event == "pull_request_review" and action == "submitted":
        pr, review = payload["pull_request"], payload["review"]
        if by_agent(review["user"], agent_login):
            return Ignored("the agent's own review")
        thread = _thread(repo, pr["number"], pr.get("title"), pr.get("html_url"))
        text = f"review {review.get('state', '')}: {review.get('body') or ''}".strip()
        return [one(thread, review["user"], text)]
    if event in ("check_run", "check_suite", "workflow_run") and action == "completed":
        run = payload[event]
        prs = run.get("pull_requests") or []
        if not prs:
            return Ignored(f"{name} ran for no pull request")
        label = run.get("name") or (run.get("app") or {}).get("name") or event
        # GitHub's verdict first (pr_events): whether it failed is read from there.
        verdict = str(run.get("conclusion") or run.get("status") or "unknown")
        text = pr_events.ci_text(verdict, str(label), run.get("html_url") or None)
        return [
            IncomingTrigger(
                source=SOURCE,
                # One delivery, one trigger per PR: each on its own thread.
                external_id=f"{delivery}:{pr['number']}" if len(prs) > 1 else delivery,
                thread=_thread(repo, pr["number"]),
                actor=_actor(payload["sender"]),
                kind=name,
                text=text,
                payload=body,
                public=public,
            )
            for pr in prs
        ]
    return Ignored(f"{name} is not an event the agent acts on")
