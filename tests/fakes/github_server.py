"""A fake GitHub REST API over real HTTP, for tests (owned by the test suite, not the product).

``FakeGitHub`` runs a real HTTP server on ``127.0.0.1`` (ephemeral port, uvicorn in a
background thread), so the product's own HTTP client talks to it exactly as to
``https://api.github.com``: point ``SUPERAGENT_GITHUB__API_URL`` at ``fake.url``.

What it checks, like GitHub:

* Every call is authenticated. A GitHub App's JWT (``Bearer <jwt>``, on ``/app/...`` and
  ``GET /repos/{o}/{r}/installation``) is verified with the App's public key: RS256, ``iss``
  the app id, ``iat`` not in the future, ``exp`` in the future and at most 10 minutes from
  ``iat``. Installation tokens (issued by ``POST /app/installations/{id}/access_tokens``,
  with ``expires_at`` an hour on) work until they expire, on their installation's
  repositories only. A personal access token (``fake.pat``) works everywhere. Anything else
  is a 401 ``Bad credentials``.
* Payload shapes are GitHub's (issues, PRs, comments, review comments, reactions,
  installation tokens, error bodies with ``message`` and ``documentation_url``).
* Listings filter and sort (``since``, ``sort``, ``direction``, ``state``, ``head``),
  paginate (``per_page``, ``page``, ``Link`` with ``rel="next"``), carry an ``ETag`` and
  answer ``If-None-Match`` with a 304 that costs no rate limit.
* ``X-RateLimit-Limit/Remaining/Used/Reset/Resource`` on every authenticated answer, per
  credential (the PAT, or each installation); an exhausted budget is a 403.

Scripting the world: :meth:`add_repo`, :meth:`user` (an account: its id stays with it),
:meth:`rename_user` (the old login may then be registered again, with a new id),
:meth:`open_issue` (``pull=True`` for a PR), :meth:`comment`, :meth:`review_comment`,
:meth:`edit_comment`; ``GET /users/{login}`` answers with the account holding that login.
A review comment is answered in its thread (``POST .../pulls/{n}/comments/{id}/replies``,
top-level comments only, as GitHub), and read back (``GET .../pulls/comments/{id}``,
``GET .../pulls/{n}/comments``; :meth:`review_comments`).
Knobs: :attr:`poll_interval` (sent as ``X-Poll-Interval``), :meth:`limit_rate` (403 with
``X-RateLimit-Remaining: 0`` or 429 with ``Retry-After``), :meth:`fail` (5xx for the next
requests). Time comes from ``clock`` (a :class:`FakeClock` shared with the code under test
makes expiry and resets deterministic).

Inspecting: :attr:`requests` (every request: method, path, query, headers, body, status,
credential), :meth:`calls`, :meth:`token_exchanges`, :meth:`comments`, :meth:`reactions`,
:meth:`pulls`, :meth:`rate_remaining`, :meth:`assert_never_saw` (a secret in no request
line or body).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.loopback import LoopbackFake, LoopbackServer

__all__ = ["FakeClock", "FakeGitHub", "GitHubRequest", "fake_github"]

DOCS = "https://docs.github.com/rest"
REACTIONS = frozenset({"+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes"})
RATE_LIMIT = 5000
_METHODS = ["GET", "POST", "PATCH", "PUT", "DELETE"]


class FakeClock:
    """A settable clock (seconds since the epoch), to share with the code under test."""

    def __init__(self, start: float | None = None) -> None:
        self.now = float(int(time.time() if start is None else start))
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


@dataclass(frozen=True)
class GitHubRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    status: int
    credential: str | None  # "jwt", "pat", "installation:<id>", or None when rejected

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class _Reject(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


@dataclass
class _Repo:
    full_name: str
    id: int
    installation_id: str
    issues: dict[int, dict[str, Any]] = field(default_factory=dict)
    pulls: dict[int, dict[str, Any]] = field(default_factory=dict)


@dataclass
class _Failure:
    status: int
    path: str | None
    times: int
    after: int


@dataclass
class _Budget:
    remaining: int = RATE_LIMIT
    reset: float = 0.0


def _b64url_decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


class FakeGitHub(LoopbackFake):
    """See the module docstring. Thread-safe: the test and the server thread share it."""

    def __init__(
        self,
        *,
        app_id: str = "4242",
        app_slug: str = "superagent-test",
        installation_id: str = "77",
        clock: Callable[[], float] = time.time,
        host: str = "127.0.0.1",
    ) -> None:
        self.app_id = app_id
        self.app_slug = app_slug
        self.installation_id = installation_id
        self.clock = clock
        self.host = host
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.private_key_pem = self._key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        self.public_key = self._key.public_key()
        self.pat = "ghp_" + secrets.token_hex(18)
        self.poll_interval: int | None = None
        self._lock = threading.RLock()
        # Accounts by lowercased login: an account keeps its id when renamed, and a login
        # set free by a rename can be registered again, by someone else, with a new id.
        self._accounts: dict[str, dict[str, Any]] = {}
        self._account_ids = itertools.count(90_000_000)
        self.pat_user = self.user("octo-agent")
        self.app_user = self.user(f"{app_slug}[bot]", bot=True)
        self._ids = itertools.count(1000)
        self._repos: dict[str, _Repo] = {}
        self._tokens: dict[str, tuple[str, float]] = {}  # token -> (installation, expiry)
        self._comments: dict[int, dict[str, Any]] = {}  # issue comments by id
        self._comment_home: dict[int, tuple[str, int]] = {}
        self._review_comments: dict[int, dict[str, Any]] = {}
        self._review_home: dict[int, tuple[str, int]] = {}
        self._reactions: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self._budgets: dict[str, _Budget] = {}
        self._limited: tuple[float, int] | None = None  # (until, status)
        self._failures: list[_Failure] = []
        self._requests: list[GitHubRequest] = []
        self._app = Starlette(routes=[Route("/{path:path}", self._dispatch, methods=_METHODS)])
        self._http = LoopbackServer(self._app, name="FakeGitHub", host=host)

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """The API base URL (what ``api.github.com`` is to the real thing)."""
        return self._http.url

    # ------------------------------------------------------------------ the world

    def _user(self, login: str, *, bot: bool) -> dict[str, Any]:
        ident = int(hashlib.sha256(login.encode()).hexdigest()[:7], 16)
        return {
            "login": login,
            "id": ident,
            "node_id": f"U_{ident}",
            "avatar_url": f"https://avatars.githubusercontent.com/u/{ident}",
            "html_url": f"https://github.com/{login}",
            "type": "Bot" if bot else "User",
            "site_admin": False,
        }

    def user(self, login: str, *, bot: bool = False) -> dict[str, Any]:
        """The account with this login, registered on first use (its id stays with it)."""
        with self._lock:
            account = self._accounts.get(login.lower())
            if account is None:
                account = self._user(login, bot=bot)
                if any(a["id"] == account["id"] for a in self._accounts.values()):
                    # The login was someone else's before a rename: a new account, a new id.
                    ident = next(self._account_ids)
                    account = {**account, "id": ident, "node_id": f"U_{ident}"}
                self._accounts[login.lower()] = account
            return dict(account)

    def rename_user(self, login: str, new_login: str) -> dict[str, Any]:
        """GitHub's rename: same account and id, a new login; the old login is free again."""
        with self._lock:
            account = self._accounts.pop(login.lower())
            account.update(login=new_login, html_url=f"https://github.com/{new_login}")
            self._accounts[new_login.lower()] = account
            return dict(account)

    def add_repo(self, full_name: str, *, installation_id: str | None = None) -> None:
        """A repository, on the App's installation (or another one)."""
        with self._lock:
            self._repos[full_name] = _Repo(
                full_name, next(self._ids), installation_id or self.installation_id
            )

    def _now(self) -> str:
        return datetime.fromtimestamp(self.clock(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def _repo(self, full_name: str) -> _Repo:
        repo = self._repos.get(full_name)
        if repo is None:
            raise KeyError(f"no repository {full_name}; add_repo() it first")
        return repo

    def open_issue(
        self,
        repo: str,
        title: str,
        body: str = "",
        *,
        user: dict[str, Any] | None = None,
        pull: bool = False,
        assignees: tuple[dict[str, Any], ...] = (),
        head: str | None = None,
        base: str = "main",
    ) -> dict[str, Any]:
        """A new issue (or PR with ``pull=True``); returns its issue object."""
        with self._lock:
            return self._open(
                repo, title, body, user or self.user("alice"), pull, assignees, head, base
            )

    def _open(
        self,
        full_name: str,
        title: str,
        body: str,
        user: dict[str, Any],
        pull: bool,
        assignees: tuple[dict[str, Any], ...],
        head: str | None,
        base: str,
    ) -> dict[str, Any]:
        repo = self._repo(full_name)
        number = len(repo.issues) + 1
        now = self._now()
        api = f"{self.url}/repos/{full_name}"
        kind = "pull" if pull else "issues"
        issue: dict[str, Any] = {
            "id": next(self._ids),
            "node_id": f"I_{number}",
            "url": f"{api}/issues/{number}",
            "repository_url": api,
            "comments_url": f"{api}/issues/{number}/comments",
            "html_url": f"https://github.com/{full_name}/{kind}/{number}",
            "number": number,
            "state": "open",
            "title": title,
            "body": body,
            "user": user,
            "labels": [],
            "assignee": assignees[0] if assignees else None,
            "assignees": list(assignees),
            "locked": False,
            "comments": 0,
            "created_at": now,
            "updated_at": now,
            "closed_at": None,
            "author_association": "MEMBER",
        }
        if pull:
            owner = full_name.split("/")[0]
            ref = head or f"branch-{number}"
            issue["pull_request"] = {
                "url": f"{api}/pulls/{number}",
                "html_url": issue["html_url"],
                "diff_url": f"{issue['html_url']}.diff",
                "patch_url": f"{issue['html_url']}.patch",
                "merged_at": None,
            }
            repo.pulls[number] = {
                "id": next(self._ids),
                "node_id": f"PR_{number}",
                "url": f"{api}/pulls/{number}",
                "html_url": issue["html_url"],
                "issue_url": issue["url"],
                "number": number,
                "state": "open",
                "locked": False,
                "title": title,
                "body": body,
                "user": user,
                "draft": False,
                "merged": False,
                "created_at": now,
                "updated_at": now,
                "head": {
                    "label": ref if ":" in ref else f"{owner}:{ref}",
                    "ref": ref.split(":")[-1],
                    "sha": hashlib.sha1(ref.encode()).hexdigest(),  # noqa: S324 - a fake sha
                    "repo": {"full_name": full_name},
                },
                "base": {
                    "label": f"{owner}:{base}",
                    "ref": base,
                    "sha": hashlib.sha1(base.encode()).hexdigest(),  # noqa: S324
                    "repo": {"full_name": full_name},
                },
            }
        repo.issues[number] = issue
        return dict(issue)

    def comment(
        self, repo: str, number: int, body: str, *, user: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A new comment on issue or PR ``number``; returns it."""
        with self._lock:
            return self._comment(repo, number, body, user or self.user("alice"))

    def _comment(
        self, full_name: str, number: int, body: str, user: dict[str, Any]
    ) -> dict[str, Any]:
        issue = self._repo(full_name).issues.get(number)
        if issue is None:
            raise _Reject(404, "Not Found")
        ident = next(self._ids)
        now = self._now()
        comment = {
            "id": ident,
            "node_id": f"IC_{ident}",
            "url": f"{self.url}/repos/{full_name}/issues/comments/{ident}",
            "html_url": f"{issue['html_url']}#issuecomment-{ident}",
            "issue_url": issue["url"],
            "body": body,
            "user": user,
            "created_at": now,
            "updated_at": now,
            "author_association": "MEMBER",
        }
        self._comments[ident] = comment
        self._comment_home[ident] = (full_name, number)
        issue["comments"] += 1
        issue["updated_at"] = now
        return dict(comment)

    def edit_comment(self, comment_id: int, body: str) -> None:
        with self._lock:
            comment = self._comments[comment_id]
            comment["body"] = body
            comment["updated_at"] = self._now()

    def review_comment(
        self,
        repo: str,
        number: int,
        body: str,
        *,
        user: dict[str, Any] | None = None,
        path: str = "README.md",
        line: int = 1,
        in_reply_to: int | None = None,
    ) -> dict[str, Any]:
        """A new review comment on PR ``number`` (``in_reply_to``: a reply in the review
        thread of that comment); returns it."""
        with self._lock:
            pr = self._repo(repo).pulls[number]
            ident = next(self._ids)
            now = self._now()
            comment: dict[str, Any] = {
                "id": ident,
                "node_id": f"PRRC_{ident}",
                "pull_request_review_id": next(self._ids),
                "url": f"{self.url}/repos/{repo}/pulls/comments/{ident}",
                "diff_hunk": "@@ -1,1 +1,1 @@",
                "path": path,
                "position": line,
                "original_position": line,
                "line": line,
                "side": "RIGHT",
                "commit_id": pr["head"]["sha"],
                "body": body,
                "user": user or self.user("alice"),
                "created_at": now,
                "updated_at": now,
                "html_url": f"{pr['html_url']}#discussion_r{ident}",
                "pull_request_url": pr["url"],
                "author_association": "MEMBER",
            }
            if in_reply_to is not None:
                comment["in_reply_to_id"] = in_reply_to
            self._review_comments[ident] = comment
            self._review_home[ident] = (repo, number)
            pr["updated_at"] = now
            return dict(comment)

    # ------------------------------------------------------------------ knobs

    def limit_rate(self, seconds: float, *, status: int = 403) -> None:
        """Every authenticated call is rate limited for ``seconds`` (by the clock): 403 with
        ``X-RateLimit-Remaining: 0`` and the reset time, or 429 with ``Retry-After``."""
        with self._lock:
            self._limited = (self.clock() + seconds, status)

    def fail(
        self, status: int = 502, *, times: int = 1, path: str | None = None, after: int = 0
    ) -> None:
        """The next ``times`` requests whose path contains ``path`` (any, if None) answer
        ``status``, once ``after`` such requests have been answered normally."""
        with self._lock:
            self._failures.append(_Failure(status, path, times, after))

    def revoke_tokens(self) -> None:
        """Every installation token stops working at once (as when an App is reinstalled)."""
        with self._lock:
            self._tokens.clear()

    # ------------------------------------------------------------------ inspection

    @property
    def requests(self) -> list[GitHubRequest]:
        with self._lock:
            return list(self._requests)

    def calls(self, method: str, path: str = "") -> list[GitHubRequest]:
        """Requests with ``method`` whose path contains ``path``."""
        return [r for r in self.requests if r.method == method and path in r.path]

    def token_exchanges(self) -> int:
        return sum(1 for r in self.calls("POST", "/access_tokens") if r.status == 201)

    def rate_remaining(self, credential: str) -> int:
        """What is left of a credential's hourly budget ("pat", "installation:<id>")."""
        with self._lock:
            return self._budget(credential).remaining

    def comments(self, repo: str, number: int) -> list[dict[str, Any]]:
        with self._lock:
            return [
                dict(c)
                for i, c in self._comments.items()
                if self._comment_home[i] == (repo, number)
            ]

    def reactions(self, kind: str, ident: int) -> list[dict[str, Any]]:
        """Reactions on ``("issue", number)`` in any repo, ``("issue_comment", id)`` or
        ``("pull_request_review_comment", id)``."""
        with self._lock:
            return [dict(r) for r in self._reactions.get((kind, ident), [])]

    def review_comments(self, repo: str, number: int) -> list[dict[str, Any]]:
        """The review comments on PR ``number``, replies included, oldest first."""
        with self._lock:
            return [
                dict(c)
                for i, c in self._review_comments.items()
                if self._review_home[i] == (repo, number)
            ]

    def pulls(self, repo: str) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(p) for p in self._repo(repo).pulls.values()]

    def assert_never_saw(self, secret: str) -> None:
        for r in self.requests:
            seen = f"{r.method} {r.path} {urlencode(r.query)} ".encode() + r.body
            assert secret.encode() not in seen, f"{secret[:4]}… appeared in {r.method} {r.path}"

    # ------------------------------------------------------------------ HTTP

    async def _dispatch(self, request: Request) -> Response:
        body = await request.body()
        path = request.url.path
        query = dict(request.query_params)
        credential: str | None = None
        try:
            with self._lock:
                credential = self._authenticate(request, path)
                response = self._handle(request.method, path, query, body, credential, request)
        except _Reject as rejected:
            response = JSONResponse(
                {"message": rejected.message, "documentation_url": DOCS},
                status_code=rejected.status,
                headers=rejected.headers,
            )
            if rejected.status == 401:
                credential = None
        with self._lock:
            self._requests.append(
                GitHubRequest(
                    request.method,
                    path,
                    query,
                    {k.lower(): v for k, v in request.headers.items()},
                    body,
                    response.status_code,
                    credential,
                )
            )
        return response

    def _authenticate(self, request: Request, path: str) -> str:
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() not in ("bearer", "token") or not value:
            raise _Reject(401, "Requires authentication")
        app_level = path.startswith("/app") or re.fullmatch(
            r"/repos/[^/]+/[^/]+/installation", path
        )
        if value.count(".") == 2:
            if not app_level:
                raise _Reject(401, "Bad credentials")
            self._verify_jwt(value)
            return "jwt"
        if app_level:
            raise _Reject(401, "A JSON web token could not be decoded")
        if value == self.pat:
            return "pat"
        issued = self._tokens.get(value)
        if issued is None or self.clock() >= issued[1]:
            raise _Reject(401, "Bad credentials")
        return f"installation:{issued[0]}"

    def _verify_jwt(self, token: str) -> None:
        header_b64, claims_b64, signature_b64 = token.split(".")
        try:
            header = json.loads(_b64url_decode(header_b64))
            claims = json.loads(_b64url_decode(claims_b64))
            signature = _b64url_decode(signature_b64)
        except ValueError:
            raise _Reject(401, "A JSON web token could not be decoded") from None
        if header.get("alg") != "RS256":
            raise _Reject(401, "'alg' must be RS256")
        try:
            self.public_key.verify(
                signature,
                f"{header_b64}.{claims_b64}".encode(),
                padding.PKCS1v15(),
                hashes.SHA256(),
            )
        except InvalidSignature:
            raise _Reject(401, "A JSON web token could not be decoded") from None
        now = self.clock()
        iat, exp = claims.get("iat"), claims.get("exp")
        if not isinstance(iat, int) or not isinstance(exp, int):
            raise _Reject(401, "'Issued at' and 'Expiration time' claims must be integers")
        if str(claims.get("iss")) != self.app_id:
            raise _Reject(401, "Integration not found (the 'iss' claim is not this app)")
        if iat > now + 1:
            raise _Reject(401, "'Issued at' claim ('iat') must be in the past")
        if exp <= now:
            raise _Reject(401, "'Expiration time' claim ('exp') is in the past")
        if exp - iat > 600 or exp > now + 600:
            raise _Reject(401, "'Expiration time' claim ('exp') is too far in the future")

    def _budget(self, credential: str) -> _Budget:
        now = self.clock()
        budget = self._budgets.setdefault(credential, _Budget(reset=now + 3600))
        if now >= budget.reset:
            budget.remaining, budget.reset = RATE_LIMIT, now + 3600
        return budget

    def _gate(self, credential: str) -> None:
        """Refuse the call when the rate limit is (made) exhausted, as GitHub does."""
        now = self.clock()
        if self._limited is not None and now >= self._limited[0]:
            self._limited = None
        if self._limited is not None:
            until, status = self._limited
            if status == 429:
                retry = {"Retry-After": str(max(int(until - now + 0.999), 1))}
                raise _Reject(429, "You have exceeded a secondary rate limit.", retry)
            reset = int(until) + (0 if until == int(until) else 1)
            raise _Reject(403, f"API rate limit exceeded for {credential}.", self._exhausted(reset))
        budget = self._budget(credential)
        if budget.remaining <= 0:
            raise _Reject(
                403, f"API rate limit exceeded for {credential}.", self._exhausted(budget.reset)
            )

    @staticmethod
    def _exhausted(reset: float) -> dict[str, str]:
        return {
            "X-RateLimit-Limit": str(RATE_LIMIT),
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Used": str(RATE_LIMIT),
            "X-RateLimit-Reset": str(int(reset)),
            "X-RateLimit-Resource": "core",
        }

    def _rate_headers(self, credential: str, *, spend: bool) -> dict[str, str]:
        budget = self._budget(credential)
        if spend:
            budget.remaining -= 1
        return {
            "X-RateLimit-Limit": str(RATE_LIMIT),
            "X-RateLimit-Remaining": str(budget.remaining),
            "X-RateLimit-Used": str(RATE_LIMIT - budget.remaining),
            "X-RateLimit-Reset": str(int(budget.reset)),
            "X-RateLimit-Resource": "core",
        }

    def _handle(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        body: bytes,
        credential: str,
        request: Request,
    ) -> Response:
        for failure in self._failures:
            if failure.path is not None and failure.path not in path:
                continue
            if failure.after > 0:
                failure.after -= 1
                break
            failure.times -= 1
            if failure.times <= 0:
                self._failures.remove(failure)
            raise _Reject(failure.status, "Server Error")
        try:
            payload = json.loads(body) if body else {}
        except ValueError:
            raise _Reject(400, "Problems parsing JSON") from None
        if credential == "jwt":
            return self._app_call(method, path)
        if method == "GET" and (login := re.fullmatch(r"/users/([^/]+)", path)):
            self._gate(credential)
            spent = self._rate_headers(credential, spend=True)
            account = self._accounts.get(login[1].lower())
            if account is None:
                raise _Reject(404, "Not Found", spent)
            return JSONResponse(self._public_profile(account), headers=spent)
        match = re.fullmatch(r"/repos/([^/]+/[^/]+)(/.*)?", path)
        if match is None:
            raise _Reject(404, "Not Found")
        full_name, rest = match[1], match[2] or ""
        repo = self._repos.get(full_name)
        if repo is None or (
            credential.startswith("installation:")
            and credential.split(":", 1)[1] != repo.installation_id
        ):
            raise _Reject(404, "Not Found")
        self._gate(credential)
        actor = self.pat_user if credential == "pat" else self.app_user
        status, result = self._repo_call(method, repo, rest, query, payload, actor)
        headers: dict[str, str] = {}
        if method == "GET" and isinstance(result, list):
            result, links = self._paginate(result, query, request)
            if links:
                headers["Link"] = links
        content = json.dumps(result).encode()
        if method == "GET":
            etag = 'W/"' + hashlib.sha256(content).hexdigest()[:40] + '"'
            headers["ETag"] = etag
            if self.poll_interval is not None:
                headers["X-Poll-Interval"] = str(self.poll_interval)
            if request.headers.get("if-none-match") == etag:
                # GitHub: a 304 to a conditional request does not count against the limit.
                headers.update(self._rate_headers(credential, spend=False))
                return Response(status_code=304, headers=headers)
        headers.update(self._rate_headers(credential, spend=True))
        return Response(content, status_code=status, headers=headers, media_type="application/json")

    def _paginate(
        self, items: list[Any], query: dict[str, str], request: Request
    ) -> tuple[list[Any], str]:
        per_page = min(max(int(query.get("per_page", "30")), 1), 100)
        page = max(int(query.get("page", "1")), 1)
        last = max((len(items) + per_page - 1) // per_page, 1)
        chosen = items[(page - 1) * per_page : page * per_page]
        links = []
        base = f"{self.url}{request.url.path}"

        def link(n: int, rel: str) -> str:
            return f'<{base}?{urlencode({**query, "page": str(n)})}>; rel="{rel}"'

        if page < last:
            links += [link(page + 1, "next"), link(last, "last")]
        if page > 1:
            links += [link(1, "first"), link(page - 1, "prev")]
        return chosen, ", ".join(links)

    def _public_profile(self, account: dict[str, Any]) -> dict[str, Any]:
        """``GET /users/{login}``: the account and its public profile fields."""
        return {
            **account,
            "url": f"{self.url}/users/{account['login']}",
            "name": None,
            "company": None,
            "public_repos": 0,
            "followers": 0,
            "created_at": "2020-01-01T00:00:00Z",
        }

    def _app_call(self, method: str, path: str) -> Response:
        if method == "POST" and (
            m := re.fullmatch(r"/app/installations/([^/]+)/access_tokens", path)
        ):
            installation = m[1]
            if installation not in {r.installation_id for r in self._repos.values()} | {
                self.installation_id
            }:
                raise _Reject(404, "Not Found")
            token = "ghs_" + secrets.token_hex(18)
            expires = self.clock() + 3600
            self._tokens[token] = (installation, expires)
            stamp = datetime.fromtimestamp(expires, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            return JSONResponse(
                {
                    "token": token,
                    "expires_at": stamp,
                    "permissions": {"issues": "write", "pull_requests": "write"},
                    "repository_selection": "all",
                },
                status_code=201,
            )
        if method == "GET" and (m := re.fullmatch(r"/repos/([^/]+/[^/]+)/installation", path)):
            repo = self._repos.get(m[1])
            if repo is None:
                raise _Reject(404, "Not Found")
            return JSONResponse(
                {
                    "id": int(repo.installation_id),
                    "app_id": int(self.app_id),
                    "app_slug": self.app_slug,
                    "account": {"login": m[1].split("/")[0]},
                }
            )
        raise _Reject(404, "Not Found")

    def _repo_call(
        self,
        method: str,
        repo: _Repo,
        rest: str,
        query: dict[str, str],
        payload: Any,
        actor: dict[str, Any],
    ) -> tuple[int, Any]:
        name = repo.full_name
        if method == "GET" and rest == "/issues/comments":
            found = [c for i, c in self._comments.items() if self._comment_home[i][0] == name]
            return 200, self._listing(found, query, default_sort="created", default_dir="asc")
        if method == "GET" and rest == "/pulls/comments":
            found = [c for i, c in self._review_comments.items() if self._review_home[i][0] == name]
            return 200, self._listing(found, query, default_sort="created", default_dir="asc")
        if method == "GET" and rest == "/issues":
            state = query.get("state", "open")
            found = [i for i in repo.issues.values() if state == "all" or i["state"] == state]
            return 200, self._listing(found, query, default_sort="created", default_dir="desc")
        if method == "GET" and rest == "/pulls":
            state = query.get("state", "open")
            found = [
                p
                for p in repo.pulls.values()
                if (state == "all" or p["state"] == state)
                and query.get("head") in (None, p["head"]["label"])
                and query.get("base") in (None, p["base"]["ref"])
            ]
            return 200, self._listing(found, query, default_sort="created", default_dir="desc")
        if m := re.fullmatch(r"/issues/(\d+)/comments", rest):
            number = int(m[1])
            if number not in repo.issues:
                raise _Reject(404, "Not Found")
            if method == "GET":
                found = [
                    c for i, c in self._comments.items() if self._comment_home[i] == (name, number)
                ]
                return 200, self._listing(found, query, default_sort="created", default_dir="asc")
            if method == "POST":
                text = payload.get("body") if isinstance(payload, dict) else None
                if not isinstance(text, str) or not text:
                    raise _Reject(422, 'Invalid request.\n\n"body" wasn\'t supplied.')
                return 201, self._comment(name, number, text, actor)
        if method == "POST" and rest == "/pulls":
            return self._create_pull(repo, payload, actor)
        if method == "POST" and (
            m := re.fullmatch(r"/(issues|issues/comments|pulls/comments)/(\d+)/reactions", rest)
        ):
            kind = {"issues": "issue", "issues/comments": "issue_comment"}.get(
                m[1], "pull_request_review_comment"
            )
            ident = int(m[2])
            exists = {
                "issue": lambda: ident in repo.issues,
                "issue_comment": lambda: self._comment_home.get(ident, ("", 0))[0] == name,
                "pull_request_review_comment": lambda: (
                    self._review_home.get(ident, ("", 0))[0] == name
                ),
            }[kind]()
            if not exists:
                raise _Reject(404, "Not Found")
            content = payload.get("content") if isinstance(payload, dict) else None
            if content not in REACTIONS:
                raise _Reject(422, "Validation Failed: content is not included in the list")
            key = (kind, ident)
            for reaction in self._reactions.get(key, []):
                if reaction["content"] == content and reaction["user"]["login"] == actor["login"]:
                    return 200, reaction
            reaction = {
                "id": next(self._ids),
                "node_id": f"REA_{ident}",
                "user": actor,
                "content": content,
                "created_at": self._now(),
            }
            self._reactions.setdefault(key, []).append(reaction)
            return 201, reaction
        if method == "GET" and (m := re.fullmatch(r"/pulls/comments/(\d+)", rest)):
            ident = int(m[1])
            if self._review_home.get(ident, ("", 0))[0] != name:
                raise _Reject(404, "Not Found")
            return 200, dict(self._review_comments[ident])
        if method == "GET" and (m := re.fullmatch(r"/pulls/(\d+)/comments", rest)):
            if int(m[1]) not in repo.pulls:
                raise _Reject(404, "Not Found")
            found = [
                c
                for i, c in self._review_comments.items()
                if self._review_home[i] == (name, int(m[1]))
            ]
            return 200, self._listing(found, query, default_sort="created", default_dir="asc")
        if method == "POST" and (m := re.fullmatch(r"/pulls/(\d+)/comments/(\d+)/replies", rest)):
            return self._reply_in_review(name, int(m[1]), int(m[2]), payload, actor)
        if method == "GET" and (m := re.fullmatch(r"/(issues|pulls)/(\d+)", rest)):
            table = repo.issues if m[1] == "issues" else repo.pulls
            item = table.get(int(m[2]))
            if item is None:
                raise _Reject(404, "Not Found")
            return 200, item
        raise _Reject(404, "Not Found")

    def _reply_in_review(
        self, repo: str, number: int, ident: int, payload: Any, actor: dict[str, Any]
    ) -> tuple[int, Any]:
        """``POST /pulls/{number}/comments/{id}/replies``: as GitHub, only to a top-level
        review comment of that pull request."""
        if self._review_home.get(ident) != (repo, number):
            raise _Reject(404, "Not Found")
        text = payload.get("body") if isinstance(payload, dict) else None
        if not isinstance(text, str) or not text:
            raise _Reject(422, 'Invalid request.\n\n"body" wasn\'t supplied.')
        parent = self._review_comments[ident]
        if parent.get("in_reply_to_id") is not None:
            raise _Reject(422, "Validation Failed: in_reply_to is a reply, not a thread")
        return 201, self.review_comment(
            repo,
            number,
            text,
            user=actor,
            path=str(parent["path"]),
            line=int(parent["line"]),
            in_reply_to=ident,
        )

    def _listing(
        self,
        items: list[dict[str, Any]],
        query: dict[str, str],
        *,
        default_sort: str,
        default_dir: str,
    ) -> list[dict[str, Any]]:
        since = query.get("since")
        if since:
            try:
                moment = datetime.fromisoformat(since)
            except ValueError:
                raise _Reject(422, f"Invalid value for 'since': {since}") from None
            items = [i for i in items if datetime.fromisoformat(i["updated_at"]) >= moment]
        sort = query.get("sort", default_sort)
        if sort not in ("created", "updated"):
            raise _Reject(422, f"Invalid value for 'sort': {sort}")
        direction = query.get("direction", default_dir)
        ordered = sorted(
            items, key=lambda i: (i[f"{sort}_at"], i["id"]), reverse=direction == "desc"
        )
        return [dict(i) for i in ordered]

    def _create_pull(self, repo: _Repo, payload: Any, actor: dict[str, Any]) -> tuple[int, Any]:
        if not isinstance(payload, dict):
            raise _Reject(400, "Problems parsing JSON")
        missing = [k for k in ("title", "head", "base") if not payload.get(k)]
        if missing:
            raise _Reject(422, f"Validation Failed: {', '.join(missing)} missing")
        owner = repo.full_name.split("/")[0]
        head = str(payload["head"])
        label = head if ":" in head else f"{owner}:{head}"
        for pull in repo.pulls.values():
            if (
                pull["state"] == "open"
                and pull["head"]["label"] == label
                and pull["base"]["ref"] == payload["base"]
            ):
                raise _Reject(422, f"Validation Failed: A pull request already exists for {label}.")
        issue = self._open(
            repo.full_name,
            str(payload["title"]),
            str(payload.get("body") or ""),
            actor,
            True,
            (),
            head,
            str(payload["base"]),
        )
        return 201, dict(repo.pulls[issue["number"]])


@pytest.fixture
def fake_github() -> Iterator[FakeGitHub]:
    """A started ``FakeGitHub`` (real clock), stopped after the test."""
    with FakeGitHub() as server:
        yield server
