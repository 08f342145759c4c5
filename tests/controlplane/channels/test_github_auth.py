"""GitHub credentials: App JWTs, installation tokens (one exchange, refreshed before expiry),
personal access tokens, and errors that say what to fix without showing a secret."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from pydantic import SecretStr, ValidationError

from controlplane.channels.base import ChannelError
from controlplane.channels.github.adapter import make_auth
from controlplane.channels.github.auth import AppAuth, TokenAuth, app_jwt, load_private_key
from controlplane.channels.github.client import GithubClient
from controlplane.errors import ConfigError
from controlplane.settings import GithubSettings
from tests.fakes.github_server import FakeClock, FakeGitHub
from tests.support.github_fixtures import (  # noqa: F401 - fixtures
    REPO,
    clock_fixture,
    flaky_issue_fixture,
    github_fixture,
)

pytestmark = pytest.mark.usefixtures("flaky_issue")


def _app(github: FakeGitHub, clock: FakeClock, installation: str | None = "77") -> AppAuth:
    key = load_private_key(github.private_key_pem.encode())
    return AppAuth(github.app_id, key, installation_id=installation, clock=clock)


@pytest.fixture
async def app_client(github: FakeGitHub, clock: FakeClock) -> AsyncIterator[GithubClient]:
    client = GithubClient(github.url, _app(github, clock), clock=clock)
    yield client
    await client.close()


def _decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def test_the_app_jwt_is_rs256_with_the_claims_github_wants(github: FakeGitHub) -> None:
    key = load_private_key(github.private_key_pem.encode())
    token = app_jwt("4242", key, now=1_700_000_000.7)
    header, claims, signature = token.split(".")
    assert json.loads(_decode(header)) == {"alg": "RS256", "typ": "JWT"}
    assert json.loads(_decode(claims)) == {
        "iat": 1_700_000_000 - 60,  # a minute early, against clock skew
        "exp": 1_700_000_000 + 540,  # ten minutes after iat: GitHub's cap
        "iss": 4242,
    }
    github.public_key.verify(
        _decode(signature), f"{header}.{claims}".encode(), padding.PKCS1v15(), hashes.SHA256()
    )


async def test_one_exchange_serves_many_calls_and_is_renewed_before_expiry(
    github: FakeGitHub, clock: FakeClock, app_client: GithubClient
) -> None:
    await asyncio.gather(*(app_client.create_comment(REPO, 1, f"hi {n}") for n in range(5)))
    assert github.token_exchanges() == 1
    writes = github.calls("POST", "/issues/1/comments")
    assert [r.status for r in writes] == [201] * 5
    assert {r.credential for r in writes} == {"installation:77"}

    clock.advance(54 * 60)  # six minutes left: still used
    await app_client.create_comment(REPO, 1, "later")
    assert github.token_exchanges() == 1
    clock.advance(2 * 60)  # four minutes left: replaced before it can lapse mid-call
    await app_client.create_comment(REPO, 1, "later still")
    assert github.token_exchanges() == 2
    assert all(r.status == 201 for r in github.calls("POST", "/issues/1/comments"))
    # The App's JWT went only to the App endpoints, the token only to the repository.
    assert {r.credential for r in github.calls("POST", "/access_tokens")} == {"jwt"}


async def test_the_installation_is_looked_up_once_per_repository(
    github: FakeGitHub, clock: FakeClock
) -> None:
    github.add_repo("other/lib", installation_id="88")
    github.open_issue("other/lib", "Question")
    client = GithubClient(github.url, _app(github, clock, installation=None), clock=clock)
    try:
        for _ in range(3):
            await client.create_comment(REPO, 1, "a")
            await client.create_comment("other/lib", 1, "b")
    finally:
        await client.close()
    lookups = [r.path for r in github.calls("GET", "/installation")]
    assert sorted(lookups) == ["/repos/acme/app/installation", "/repos/other/lib/installation"]
    exchanges = [r.path for r in github.calls("POST", "/access_tokens") if r.status == 201]
    assert sorted(exchanges) == [
        "/app/installations/77/access_tokens",
        "/app/installations/88/access_tokens",
    ]


async def test_a_revoked_installation_token_is_replaced_once(
    github: FakeGitHub, app_client: GithubClient
) -> None:
    await app_client.create_comment(REPO, 1, "before")
    github.revoke_tokens()
    await app_client.create_comment(REPO, 1, "after")
    assert github.token_exchanges() == 2
    assert [r.status for r in github.calls("POST", "/issues/1/comments")] == [201, 401, 201]


async def test_an_app_not_installed_on_the_repository_says_so(
    github: FakeGitHub, clock: FakeClock
) -> None:
    client = GithubClient(github.url, _app(github, clock, installation=None), clock=clock)
    try:
        with pytest.raises(ChannelError, match="not installed on nobody/repo"):
            await client.create_comment("nobody/repo", 1, "hi")
    finally:
        await client.close()


async def test_a_jwt_from_the_wrong_key_is_refused_with_what_to_check(
    github: FakeGitHub, clock: FakeClock
) -> None:
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    client = GithubClient(github.url, AppAuth(github.app_id, stranger, clock=clock), clock=clock)
    try:
        with pytest.raises(ChannelError, match="APP_ID, the private key") as raised:
            await client.create_comment(REPO, 1, "hi")
    finally:
        await client.close()
    assert "-----BEGIN" not in str(raised.value)
    assert github.calls("POST", "/comments") == []


async def test_a_personal_access_token_needs_no_exchange(
    github: FakeGitHub, clock: FakeClock
) -> None:
    client = GithubClient(github.url, TokenAuth(github.pat), clock=clock)
    try:
        posted = await client.create_comment(REPO, 1, "with a PAT")
    finally:
        await client.close()
    assert posted["user"]["login"] == github.pat_user["login"]
    assert github.calls("POST", "/access_tokens") == []
    assert [r.credential for r in github.requests] == ["pat"]
    github.assert_never_saw(github.pat)  # in the Authorization header only


async def test_a_wrong_token_is_a_channel_error_that_shows_no_secret(github: FakeGitHub) -> None:
    wrong = "ghp_" + "x" * 36
    client = GithubClient(github.url, TokenAuth(wrong))
    try:
        with pytest.raises(ChannelError, match="SUPERAGENT_GITHUB__TOKEN") as raised:
            await client.create_comment(REPO, 1, "hi")
    finally:
        await client.close()
    assert wrong not in str(raised.value)
    assert "Bad credentials" in str(raised.value)


def test_settings_accept_one_coherent_identity(tmp_path: Path, github: FakeGitHub) -> None:
    with pytest.raises(ValidationError, match="not both"):
        GithubSettings(token=SecretStr("ghp_x"), app_id="1", private_key=SecretStr("k"))
    with pytest.raises(ValidationError, match="needs the App's private_key"):
        GithubSettings(app_id="1")
    with pytest.raises(ValidationError, match="needs credentials"):
        GithubSettings(poll_repos="acme/app")
    with pytest.raises(ValidationError, match="not owner/repo"):
        GithubSettings(token=SecretStr("ghp_x"), poll_repos="acme/app, just-a-name")
    assert GithubSettings(token=SecretStr("t"), poll_repos=" acme/app ,b/c,").repos == [
        "acme/app",
        "b/c",
    ]

    # A PEM pasted into one environment variable, newlines escaped, still loads.
    escaped = github.private_key_pem.strip().replace("\n", "\\n")
    assert isinstance(
        make_auth(GithubSettings(app_id="4242", private_key=SecretStr(escaped))), AppAuth
    )
    key_file = tmp_path / "app.pem"
    key_file.write_text(github.private_key_pem)
    assert isinstance(make_auth(GithubSettings(app_id="4242", private_key_file=key_file)), AppAuth)
    with pytest.raises(ConfigError, match="cannot read"):
        make_auth(GithubSettings(app_id="4242", private_key_file=tmp_path / "missing.pem"))
    garbage = "-----BEGIN PRIVATE KEY-----\nnot-a-key-but-secret\n-----END PRIVATE KEY-----"
    with pytest.raises(ConfigError, match="not a readable PEM key") as raised:
        make_auth(GithubSettings(app_id="4242", private_key=SecretStr(garbage)))
    assert "not-a-key-but-secret" not in str(raised.value)
