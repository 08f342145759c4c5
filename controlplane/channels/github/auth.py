"""Who the agent is on GitHub: a personal access token, or a GitHub App.

A GitHub App signs a short JWT with its private key (RS256: ``iat`` a minute in the past
against clock skew, ``exp`` under GitHub's 10-minute cap, ``iss`` the app id) and exchanges
it for an installation token (``POST /app/installations/{id}/access_tokens``), valid an hour.
Tokens are cached per installation until five minutes before they expire, so one exchange
serves many calls and no call starts with a token about to lapse. Without a configured
installation id, each repository's installation is looked up once
(``GET /repos/{owner}/{repo}/installation``).

Keys and tokens live in memory only: never in logs, error messages or the database.
"""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from controlplane.channels.base import ChannelError
from controlplane.channels.github.errors import body_of, raise_for_status
from controlplane.errors import ConfigError, TransientError

Clock = Callable[[], float]  # seconds since the epoch

JWT_BACKDATE = 60  # GitHub's advice: iat a minute early, in case our clock runs ahead
JWT_LIFETIME = 540  # seconds after now; with the backdating, 10 minutes in all (the cap)
REFRESH_MARGIN = 300.0  # a cached installation token is replaced this long before expiry


@dataclass(frozen=True)
class Credential:
    token: str
    bucket: str  # whose rate limit the token spends: "token" or "installation:<id>"

    def __repr__(self) -> str:  # a credential printed by accident shows no token
        return f"Credential(bucket={self.bucket!r})"


class Auth(ABC):
    @abstractmethod
    async def credential(self, http: httpx.AsyncClient, repo: str) -> Credential:
        """A token that may act on ``repo`` (owner/name)."""

    def forget(self, repo: str) -> bool:
        """GitHub rejected the token for ``repo``: drop what is cached. True when asking
        again may give a different token (worth one more try)."""
        return False


class TokenAuth(Auth):
    """A personal access token (classic or fine-grained): one token for everything."""

    def __init__(self, token: str) -> None:
        self._credential = Credential(token, "token")

    async def credential(self, http: httpx.AsyncClient, repo: str) -> Credential:
        return self._credential


def load_private_key(pem: bytes) -> rsa.RSAPrivateKey:
    """The App's RSA key from PEM; ConfigError (saying nothing of the content) otherwise."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        raise ConfigError(
            "the GitHub App private key is not a readable PEM key: paste the .pem file GitHub "
            "generated (SUPERAGENT_GITHUB__PRIVATE_KEY or SUPERAGENT_GITHUB__PRIVATE_KEY_FILE)"
        ) from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ConfigError("the GitHub App private key must be an RSA key (GitHub's .pem file)")
    return key


def app_jwt(app_id: str, key: rsa.RSAPrivateKey, now: float) -> str:
    """The JWT GitHub expects from an App (RS256), signed by PyJWT.

    Through its JWS layer: ``jwt.encode`` refuses a numeric ``iss``, which GitHub documents
    (the app id) and takes."""
    issuer: int | str = int(app_id) if app_id.isdigit() else app_id  # id, or the client id
    claims = {"iat": int(now) - JWT_BACKDATE, "exp": int(now) + JWT_LIFETIME, "iss": issuer}
    payload = json.dumps(claims, separators=(",", ":")).encode()
    return jwt.PyJWS().encode(payload, key, algorithm="RS256")


def _expiry(value: Any) -> float:
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        raise TransientError("GitHub returned an installation token without expires_at") from None


class AppAuth(Auth):
    """A GitHub App acting through its installations' tokens."""

    def __init__(
        self,
        app_id: str,
        key: rsa.RSAPrivateKey,
        *,
        installation_id: str | None = None,
        clock: Clock = time.time,
    ) -> None:
        self.app_id = app_id
        self._key = key
        self.installation_id = installation_id
        self.clock = clock
        self._installations: dict[str, str] = {}  # repo -> installation id
        self._tokens: dict[str, tuple[str, float]] = {}  # installation id -> (token, expiry)
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"AppAuth(app_id={self.app_id!r})"

    def jwt(self) -> str:
        return app_jwt(self.app_id, self._key, self.clock())

    async def credential(self, http: httpx.AsyncClient, repo: str) -> Credential:
        installation = self.installation_id or self._installations.get(repo)
        if installation is not None and (token := self._fresh(installation)) is not None:
            return Credential(token, f"installation:{installation}")
        # One exchange at a time: many callers arriving together share its result.
        async with self._lock:
            if installation is None:
                installation = self._installations.get(repo) or await self._lookup(http, repo)
                self._installations[repo] = installation
            token = self._fresh(installation)
            if token is None:
                token, expires = await self._exchange(http, installation)
                self._tokens[installation] = (token, expires)
            return Credential(token, f"installation:{installation}")

    def forget(self, repo: str) -> bool:
        installation = self.installation_id or self._installations.pop(repo, None)
        if installation is not None:
            self._tokens.pop(installation, None)
        return True

    def _fresh(self, installation: str) -> str | None:
        cached = self._tokens.get(installation)
        if cached is None or self.clock() >= cached[1] - REFRESH_MARGIN:
            return None
        return cached[0]

    async def _app_request(
        self, http: httpx.AsyncClient, method: str, path: str, *, missing: str = ""
    ) -> Any:
        """An App-level call (authenticated by the JWT); ``missing`` explains a 404."""
        headers = {"Authorization": f"Bearer {self.jwt()}"}
        try:
            response = await http.request(method, path, headers=headers)
        except httpx.TransportError as exc:
            raise TransientError(f"GitHub did not answer {method} {path} ({exc!r})") from None
        if response.status_code == 401:
            raise ChannelError(
                f"GitHub rejected the App's JWT on {method} {path}: check "
                "SUPERAGENT_GITHUB__APP_ID, the private key, and this machine's clock"
            )
        if response.status_code == 404 and missing:
            raise ChannelError(missing)
        raise_for_status(response, f"{method} {path}", self.clock())
        return body_of(response, f"{method} {path}")

    async def _lookup(self, http: httpx.AsyncClient, repo: str) -> str:
        found = await self._app_request(
            http,
            "GET",
            f"/repos/{repo}/installation",
            missing=f"the GitHub App {self.app_id} is not installed on {repo}: install it "
            "there (the App's page, Install App), or set SUPERAGENT_GITHUB__INSTALLATION_ID",
        )
        if not isinstance(found, dict) or "id" not in found:
            raise TransientError(f"GitHub named no installation for {repo}; will retry")
        return str(found["id"])

    async def _exchange(self, http: httpx.AsyncClient, installation: str) -> tuple[str, float]:
        issued = await self._app_request(
            http,
            "POST",
            f"/app/installations/{installation}/access_tokens",
            missing=f"the GitHub App {self.app_id} has no installation {installation}: check "
            "SUPERAGENT_GITHUB__INSTALLATION_ID (or unset it to look it up per repository)",
        )
        if not isinstance(issued, dict) or not issued.get("token"):
            raise TransientError("GitHub issued no installation token; will retry")
        return str(issued["token"]), _expiry(issued.get("expires_at"))
