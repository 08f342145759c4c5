"""The one settings tree of the control plane.

Every field is described, because ``superagent config`` and the table in
docs/configuration.md are generated from these descriptions. Environment variables use the
``SUPERAGENT_`` prefix, with ``__`` between nested groups
(``SUPERAGENT_EFFECTS__CONCURRENCY``); three well-known variables keep their standard names:
``DATABASE_URL``, ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``.
"""

from __future__ import annotations

import difflib
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import (
    AliasChoices,
    BaseModel,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from controlplane.errors import ConfigError

ENV_PREFIX = "SUPERAGENT_"

# Values that people paste from examples; refused outside development so that a deployment
# never runs with a secret everybody knows.
PLACEHOLDER_SECRETS = frozenset({"changeme", "change-me", "secret", "password", "admin", "xxx"})


def _default_state_dir() -> Path:
    return Path("~/.local/share/superagent").expanduser()


MIN_ADMIN_TOKEN_LENGTH = 32  # production refuses shorter admin tokens


@dataclass(frozen=True)
class Unit:
    """A setting's unit, which its name ends with: every duration is declared ``Seconds``
    (``*_seconds``) and every size ``Bytes`` (``*_bytes``), and
    tests/controlplane/settings/test_units.py holds every field to it."""

    suffix: str


SECONDS = Unit("_seconds")
BYTES = Unit("_bytes")
Seconds = Annotated[float, SECONDS]
WholeSeconds = Annotated[int, SECONDS]
Bytes = Annotated[int, BYTES]


class Environment(StrEnum):
    development = "development"
    production = "production"


class HttpSettings(BaseModel):
    host: str = Field("127.0.0.1", description="Address the HTTP API and console listen on.")
    port: int = Field(8420, ge=0, le=65535, description="HTTP port (0 picks a free port).")

    def local_url(self, port: int | None = None) -> str:
        """How this machine reaches the server (``port``: the one it really listens on):
        a wildcard bind is reached on loopback."""
        host = self.host
        if host in ("", "0.0.0.0", "::"):  # noqa: S104 - a wildcard bind, reached on loopback
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port if port is None else port}"

    allowed_hosts: str = Field(
        "",
        description="Comma-separated host names browsers may use to reach the console and "
        "chat, beside IP addresses and localhost (a guard against DNS rebinding). Empty: "
        "any name when listening beyond loopback, none when on loopback.",
    )
    session_seconds: Seconds = Field(
        12 * 3600.0,
        gt=0,
        description="How long a console or chat sign-in lasts; signing out ends it at once.",
    )
    signin_attempts: int = Field(
        10,
        ge=1,
        description="Wrong admin tokens one peer (an IPv4 address or IPv6 /64) may present "
        "per `signin_window_seconds` before it is refused with 429.",
    )
    signin_window_seconds: Seconds = Field(
        300.0, gt=0, description="The window of `signin_attempts`."
    )
    # Bounds on what one request may make the server hold (docs/operations.md, "Request
    # limits"): enforced before routing, authentication or parsing.
    max_body_bytes: Bytes = Field(
        1 << 20,
        ge=1024,
        description="Largest request body an HTTP endpoint takes unless named below: a bigger "
        "one gets 413 before anything reads it (a declared Content-Length at once, a chunked "
        "body as soon as it passes the limit).",
    )
    github_webhook_max_body_bytes: Bytes = Field(
        25 << 20,
        ge=1024,
        description="Largest body POST /webhooks/github takes (GitHub sends at most 25 MB).",
    )
    slack_webhook_max_body_bytes: Bytes = Field(
        1 << 20,
        ge=1024,
        description="Largest body POST /webhooks/slack takes (events are a few KB; a message "
        "is at most 40,000 characters).",
    )
    lark_webhook_max_body_bytes: Bytes = Field(
        1 << 20,
        ge=1024,
        description="Largest body POST /webhooks/lark takes (events are a few KB; a text "
        "message is at most 150 KB, a third more when encrypted).",
    )
    max_header_bytes: Bytes = Field(
        32 << 10,
        ge=4096,
        le=1 << 20,
        description="Largest request line and headers together: a longer head gets 431 and "
        "the connection is closed.",
    )
    ws_max_message_bytes: Bytes = Field(
        256 << 10,
        ge=4096,
        description="Largest websocket message (chat, console) the server takes: a bigger one "
        "closes the socket with 1009. A chat frame is at most 64 Ki characters.",
    )


class GrpcSettings(BaseModel):
    host: str = Field("127.0.0.1", description="Address the device gateway (gRPC) listens on.")
    port: int = Field(8421, ge=0, le=65535, description="gRPC port (0 picks a free port).")
    tls: Literal["self-signed", "off"] = Field(
        "self-signed",
        description="`self-signed`: the gateway's own CA and certificate (devices pin the "
        "CA). `off`: plaintext, only behind a TLS-terminating proxy (docs/tls.md).",
    )
    tls_hostnames: str = Field(
        "",
        description="Extra comma-separated DNS names or IPs for the gateway certificate.",
    )
    public_url: str | None = Field(
        None,
        description="The URL devices dial, printed by `superagent devices pair` "
        "(default: https://<this host>:<port>).",
    )
    heartbeat_seconds: Seconds = Field(
        15.0, gt=0, description="Application heartbeat interval on device streams."
    )
    max_connection_age_seconds: Seconds = Field(
        1800.0,
        gt=0,
        description="Streams are recycled after about this long (±10 % jitter), spreading "
        "devices across replicas.",
    )
    command_ttl_seconds: Seconds = Field(
        43200.0, gt=0, description="Default time a queued command may wait for its device."
    )
    output_inline_bytes: Bytes = Field(
        8192, ge=0, description="Bytes of a command's output head and tail kept inline."
    )
    max_streams: int = Field(
        10_000,
        ge=1,
        description="Device streams (Connect) this replica holds at once, authenticated or "
        "not yet; past it a new stream is refused with RESOURCE_EXHAUSTED (the daemon retries "
        "with backoff).",
    )
    max_streams_per_peer: int = Field(
        256,
        ge=1,
        description="Device streams this replica holds at once from one peer (an IPv4 "
        "address or IPv6 /64). Raise it when more devices than this share one address (a "
        "NAT) and the gateway sees that address.",
    )
    pairing_failures_per_peer: int = Field(
        10,
        ge=1,
        description="Failed pairing attempts one peer (an IPv4 address or IPv6 /64) may make "
        "in 10 minutes; past it, its codes are refused without being compared.",
    )
    pairing_failures_global: int = Field(
        1000,
        ge=1,
        description="Failed pairing attempts all peers together may make in 10 minutes, a "
        "bound on guessing spread over many addresses; past it, every pairing waits for the "
        "window to end.",
    )


class EffectsSettings(BaseModel):
    concurrency: int = Field(
        32, ge=1, le=1024, description="Effects one runner executes at the same time."
    )
    batch_size: int = Field(
        64, ge=1, le=1000, description="Most effects claimed in one round trip."
    )
    poll_interval_seconds: Seconds = Field(
        0.5,
        gt=0,
        le=1.0,
        description="Seconds between polls when no notification arrives (safety net, ≤ 1 s).",
    )
    lease_seconds: Seconds = Field(
        30.0,
        ge=1.0,
        description="How long a claimed effect stays invisible to other runners; renewed "
        "while it executes, so only a dead runner lets it lapse.",
    )
    max_attempts: int = Field(
        20, ge=1, description="Failed attempts after which an effect is parked as dead."
    )
    backoff_base_seconds: Seconds = Field(
        1.0, gt=0, description="The first retry delay; it doubles per attempt."
    )
    backoff_max_seconds: Seconds = Field(300.0, gt=0, description="Upper bound of the retry delay.")


class GithubSettings(BaseModel):
    webhook_secret: SecretStr | None = Field(
        None,
        description="The GitHub webhook's secret; unset, POST /webhooks/github answers 404.",
    )
    agent_login: str | None = Field(
        None,
        description="The agent's GitHub login (e.g. my-app[bot]): assigning it an issue or "
        "requesting its review addresses it.",
    )
    token: SecretStr | None = Field(
        None,
        description="A personal access token (classic or fine-grained) the agent acts with. "
        "Use this or a GitHub App (app_id + private_key).",
    )
    app_id: str | None = Field(None, description="GitHub App id, for App authentication.")
    private_key: SecretStr | None = Field(
        None,
        description="The GitHub App's private key (PEM text), to sign its JWTs (RS256).",
    )
    private_key_file: Path | None = Field(
        None, description="Or: a file holding the GitHub App's private key (PEM)."
    )
    installation_id: str | None = Field(
        None,
        description="The App installation to act as (unset: looked up per repository).",
    )
    api_url: str = Field(
        "https://api.github.com",
        description="GitHub's REST API (GitHub Enterprise: https://HOST/api/v3).",
    )
    poll_repos: str = Field(
        "",
        description="Comma-separated owner/repo list to poll instead of receiving webhooks "
        "(for deployments with no public ingress).",
    )
    poll_seconds: Seconds = Field(
        60.0,
        ge=1.0,
        description="Seconds between polls (GitHub's X-Poll-Interval wins when longer).",
    )

    @property
    def repos(self) -> list[str]:
        """``poll_repos`` as a list of owner/repo names."""
        return [name.strip() for name in self.poll_repos.split(",") if name.strip()]

    @property
    def uses_app(self) -> bool:
        return self.app_id is not None

    @property
    def has_credentials(self) -> bool:
        return self.token is not None or self.app_id is not None

    @model_validator(mode="after")
    def _one_coherent_identity(self) -> GithubSettings:
        if self.token is not None and self.app_id is not None:
            raise ValueError(
                "github: set either token (a personal access token) or app_id with a private "
                "key (a GitHub App), not both"
            )
        if self.private_key is not None and self.private_key_file is not None:
            raise ValueError("github: set private_key or private_key_file, not both")
        has_key = self.private_key is not None or self.private_key_file is not None
        if self.app_id is not None and not has_key:
            raise ValueError("github: app_id needs the App's private_key or private_key_file")
        if has_key and self.app_id is None:
            raise ValueError("github: a private key needs the App's app_id")
        if self.installation_id is not None and self.app_id is None:
            raise ValueError("github: installation_id needs app_id (GitHub App authentication)")
        for name in self.repos:
            owner, _, repo = name.partition("/")
            if not owner or not repo or "/" in repo or any(c.isspace() for c in name):
                raise ValueError(f"github: poll_repos entry {name!r} is not owner/repo")
        if self.repos and not self.has_credentials:
            raise ValueError(
                "github: poll_repos needs credentials: set token, or app_id and private_key"
            )
        return self


class SlackSettings(BaseModel):
    bot_token: SecretStr | None = Field(
        None, description="The Slack app's bot token (xoxb-...); unset, Slack is off."
    )
    app_token: SecretStr | None = Field(
        None,
        description="An app-level token (xapp-..., connections:write) to use Socket Mode, "
        "which needs no public ingress.",
    )
    signing_secret: SecretStr | None = Field(
        None,
        description="The app's signing secret, for the Events API at POST /webhooks/slack.",
    )
    api_url: str = Field("https://slack.com/api", description="Slack's Web API base URL.")
    timeout_seconds: Seconds = Field(
        10.0, gt=0, description="Seconds before one Slack Web API call gives up."
    )

    @model_validator(mode="after")
    def _tokens_in_their_places(self) -> SlackSettings:
        # Swapping the two tokens is the commonest setup mistake; say so at startup rather
        # than with an opaque `not_allowed_token_type` from Slack later.
        bot = self.bot_token.get_secret_value() if self.bot_token else None
        app = self.app_token.get_secret_value() if self.app_token else None
        if bot is not None and not bot.startswith("xoxb-"):
            raise ValueError(
                "slack.bot_token must be the Bot User OAuth Token (xoxb-...), from the app's "
                "OAuth & Permissions page"
            )
        if app is not None and not app.startswith("xapp-"):
            raise ValueError(
                "slack.app_token must be an app-level token (xapp-...) with connections:write, "
                "from the app's Basic Information page"
            )
        return self


class MatrixSettings(BaseModel):
    homeserver: str | None = Field(
        None, description="The bot's homeserver URL (https://matrix.example.org); unset: off."
    )
    user_id: str | None = Field(None, description="The bot's Matrix id (@agent:example.org).")
    access_token: SecretStr | None = Field(None, description="The bot's access token.")
    password: SecretStr | None = Field(
        None, description="Or: the bot's password, to log in on start."
    )
    device_id: str = Field(
        "SUPERAGENT",
        min_length=1,
        max_length=100,
        description="The bot's device id for password login; kept stable so that retried "
        "sends are deduplicated by the homeserver.",
    )
    sync_timeout_seconds: Seconds = Field(
        30.0, gt=0, le=300, description="Seconds one /sync long poll waits for new events."
    )
    timeout_seconds: Seconds = Field(
        30.0, gt=0, description="Seconds before one other Matrix API call gives up."
    )

    @model_validator(mode="after")
    def _coherent(self) -> MatrixSettings:
        if self.homeserver is None:
            if self.user_id or self.access_token or self.password:
                raise ValueError("matrix: set homeserver too (the bot's homeserver URL)")
            return self
        if not self.homeserver.startswith(("https://", "http://")):
            raise ValueError(f"matrix: homeserver {self.homeserver!r} is not an http(s) URL")
        localpart, colon, server = (self.user_id or "").partition(":")
        if not localpart.startswith("@") or len(localpart) < 2 or not colon or not server:
            raise ValueError(
                "matrix: user_id must be the bot's full Matrix id, like @agent:example.org"
            )
        if self.access_token is None and self.password is None:
            raise ValueError("matrix: set access_token, or password to log in on start")
        return self


class LarkSettings(BaseModel):
    app_id: str | None = Field(None, description="Feishu/Lark app id (cli_...); unset: off.")
    app_secret: SecretStr | None = Field(None, description="Feishu/Lark app secret.")
    verification_token: SecretStr | None = Field(
        None, description="The event subscription's verification token."
    )
    encrypt_key: SecretStr | None = Field(
        None,
        description="The event subscription's encrypt key (events arrive AES-encrypted and "
        "signed when set).",
    )
    domain: str = Field(
        "https://open.feishu.cn",
        description="Open platform base URL: https://open.feishu.cn (Feishu) or "
        "https://open.larksuite.com (Lark).",
    )
    long_connection: bool = Field(
        False,
        description="Receive events over the long connection (no public ingress) instead "
        "of POST /webhooks/lark.",
    )
    ack_emoji: str = Field(
        "OnIt",
        min_length=1,
        max_length=50,
        description="The reaction (a Lark emoji_type) that marks an accepted request as seen.",
    )
    timeout_seconds: Seconds = Field(
        10.0, gt=0, description="Seconds before one Lark API call gives up."
    )

    @model_validator(mode="after")
    def _coherent(self) -> LarkSettings:
        if (self.app_id is None) != (self.app_secret is None):
            raise ValueError("lark: set app_id and app_secret together (the app's credentials)")
        receives = (self.verification_token, self.encrypt_key, self.long_connection or None)
        if self.app_id is None and any(value is not None for value in receives):
            raise ValueError(
                "lark: verification_token, encrypt_key and long_connection need the app's "
                "app_id and app_secret"
            )
        if not self.domain.startswith(("https://", "http://")):
            raise ValueError(f"lark: domain {self.domain!r} is not an http(s) URL")
        return self


class WebChatSettings(BaseModel):
    enabled: bool = Field(
        True,
        description="The chat page (/chat), its websocket and `superagent say`; off, they "
        "answer 404.",
    )


class LlmPrices(BaseModel):
    """What a model's tokens cost, so that every result can state its cost."""

    input_usd_per_mtok: float = Field(
        0.0, ge=0, description="US dollars per million prompt tokens not read from cache."
    )
    cached_usd_per_mtok: float = Field(
        0.0, ge=0, description="US dollars per million prompt tokens read from cache."
    )
    output_usd_per_mtok: float = Field(
        0.0, ge=0, description="US dollars per million completion tokens."
    )


class LlmSettings(BaseModel):
    router_model: str = Field("gpt-4o-mini", description="Model of the long-lived router session.")
    worker_model: str = Field("gpt-4o", description="Model of the per-ticket worker sessions.")
    prices: dict[str, LlmPrices] = Field(
        default_factory=dict,
        description='Prices by model name, as JSON (`{"my-model": {"input_usd_per_mtok": 1, '
        '"cached_usd_per_mtok": 0.1, "output_usd_per_mtok": 4}}`), over the built-in '
        "prices of well-known models (docs/llm.md). Every call is priced by its own model; an "
        "unknown model costs $0.",
    )
    timeout_seconds: Seconds = Field(
        300.0,
        gt=0,
        description="Seconds a model call may produce nothing before it gives up: until its "
        "first token when streaming (a local model reads a long prompt for a minute or more "
        "before it writes), until its whole answer otherwise.",
    )
    idle_timeout_seconds: Seconds = Field(
        60.0,
        gt=0,
        description="Seconds a streaming answer may fall silent between two tokens before the "
        "call gives up (and is abandoned, which cancels it on servers that stop on a closed "
        "connection). A slow model that keeps writing is alive.",
    )
    stream: bool = Field(
        True,
        description="Stream answers, so that a slow model that is writing is told apart from "
        "a dead one. Turn off for a server that cannot stream with tools.",
    )
    router_max_tokens: int = Field(
        1024, ge=16, description="Output cap of one router answer, in tokens."
    )
    worker_max_tokens: int = Field(
        4096, ge=16, description="Output cap of one worker answer, in tokens."
    )
    watchdog_max_tokens: int = Field(
        512, ge=16, description="Output cap of one watchdog judgement, in tokens."
    )
    summary_max_tokens: int = Field(
        2048, ge=16, description="Output cap of one compaction summary, in tokens."
    )
    attempts: int = Field(
        4,
        ge=1,
        description="Tries of one model call that fails transiently (429, 5xx, timeout, a "
        "body that is not JSON) before the turn or round counts it as failed.",
    )
    retry_base_seconds: Seconds = Field(
        1.0, gt=0, description="First wait between tries of a model call; it doubles, jittered."
    )
    retry_cap_seconds: Seconds = Field(
        30.0, gt=0, description="Longest wait between tries, `Retry-After` included."
    )
    max_text_bytes: Bytes = Field(
        16 * 1024,
        ge=256,
        description="A model's text answer longer than this is cut; the whole of it is "
        "spilled to a blob whose id is given inline.",
    )
    router_context_tokens: int = Field(
        128_000,
        ge=4096,
        description="The router model's context window, in tokens. Unset: what the server "
        "serves (llama.cpp, vLLM), else the model's published window, else this default.",
    )
    worker_context_tokens: int = Field(
        128_000,
        ge=4096,
        description="The worker model's context window, in tokens. Unset: as the router's.",
    )
    compact_share: float = Field(
        0.75,
        gt=0.1,
        lt=1.0,
        description="A session is compacted before a call would fill more than this share "
        "of its model's window: old tool outputs are cut first, then older turns are "
        "summarised by the model.",
    )


def _renewal_fits(section: str, renew: float, lease: float) -> None:
    if renew * 2 > lease:
        raise ValueError(
            f"{section}.renew_seconds must be at most half of {section}.lease_seconds, or the "
            "holder loses its lease to a single slow renewal"
        )


class WorkerSettings(BaseModel):
    design: Literal["two_tier", "single_session"] = Field(
        "two_tier",
        description="`two_tier`: a router plus one worker session per ticket. "
        "`single_session`: the baseline, one session that runs tickets through a subagent "
        "tool (for comparison only).",
    )
    max_workers: int = Field(
        3,
        ge=1,
        description="Workers running at once across all replicas; one more slot is kept "
        "for workers woken by a human message.",
    )
    lease_seconds: Seconds = Field(
        30.0, gt=0, description="A worker's lease; another replica resumes it once expired."
    )
    renew_seconds: Seconds = Field(10.0, gt=0, description="How often leases are renewed.")
    foreground_seconds: Seconds = Field(
        5.0,
        gt=0,
        description="How long `shell` waits for a command before it becomes a background "
        "job whose completion arrives later as an event.",
    )
    max_turns: int = Field(
        80, ge=1, description="Model calls per assignment before the worker is stopped."
    )
    token_budget: int = Field(
        3_000_000, ge=1000, description="Tokens per ticket before the worker is stopped."
    )
    repeat_limit: int = Field(
        3,
        ge=2,
        description="The same tool call with the same arguments this many times in a row "
        "stops the worker.",
    )
    device_wait_seconds: Seconds = Field(
        12 * 3600.0,
        gt=0,
        description="How long a ticket waits for its device to come back before people are "
        "asked whether to reroute or drop it.",
    )
    device_notice_seconds: Seconds = Field(
        60.0,
        ge=0,
        description="How long a ticket waits for its device before its thread is told "
        "(a link that drops for a moment, a laptop that sleeps briefly, is nobody's news).",
    )
    device_approval_seconds: Seconds = Field(
        30 * 60.0,
        gt=0,
        description="How long a request to use someone else's device waits for its owner's "
        "answer in chat (`approve apr_…` / `deny apr_…`); no answer by then counts as a deny.",
    )
    failed_rounds_limit: int = Field(
        3,
        ge=1,
        description="Rounds of a ticket that fail in a row (the model unreachable or "
        "malformed, an internal error) before it ends blocked, with the error class said on "
        "its thread. Between them the round is retried with backoff.",
    )
    retry_base_seconds: Seconds = Field(
        10.0,
        gt=0,
        description="Wait before retrying a failed round; it doubles each time, jittered, "
        "up to five minutes.",
    )
    hold_untrusted: Literal["public", "always", "off"] = Field(
        "public",
        description="Hold a worker's push, pull request or credential use that comes right "
        "after it read only input without authority (not allowlisted people, bots, CI) until "
        "the requester confirms. `public`: when some of that input was said in public or "
        "where it is not known to be private (a private GitHub repository is known); "
        "`always`; `off`.",
    )
    ci_fix_rounds_limit: int = Field(
        3,
        ge=0,
        description="Rounds a failed CI result on a ticket's open pull request (a check run, "
        "check suite or workflow run that failed, timed out or was cancelled) may start by "
        "itself while no person speaks; the next failure ends the ticket blocked, naming the "
        "check. A result that passed starts no round; a person's event starts the count over.",
    )
    bot_rounds_limit: int = Field(
        3,
        ge=0,
        description="Rounds bot events (not CI) may start in a row on a ticket whose pull "
        "request is open, with no person's event in between; past it, bot events are kept "
        "for the worker but wake it no more (hold `bot loop`, said once on the thread) until "
        "a person writes.",
    )

    harness_max_turns: int = Field(
        60,
        ge=1,
        description="Agent turns per harness run (a coding-agent CLI on the device), passed "
        "as the harness's own flag where it has one (the device's policy may cap it lower) "
        "and enforced from its event stream where it has none.",
    )
    harness_timeout_seconds: WholeSeconds = Field(
        3600,
        ge=60,
        description="Wall-clock cap of one harness run; the device's policy maximum wins if "
        "lower. Past it the run is stopped and the ticket ends blocked, saying so.",
    )
    harness_fix_rounds: int = Field(
        1,
        ge=0,
        description="When the repository's tests (`.superagent/config`, [checks] test) fail "
        "after a harness run, how many times the harness is sent back with the failure "
        "before the ticket ends blocked with it.",
    )

    @model_validator(mode="after")
    def _renew_well_within_the_lease(self) -> WorkerSettings:
        _renewal_fits("workers", self.renew_seconds, self.lease_seconds)
        return self


class WatchdogSettings(BaseModel):
    interval_seconds: Seconds = Field(
        30.0, gt=0, description="How often `superagent watchdog` runs its checks."
    )
    replica_silence_seconds: Seconds = Field(
        60.0, gt=0, description="A replica whose heartbeat is older than this is reported."
    )
    stall_seconds: Seconds = Field(
        20 * 60.0,
        gt=0,
        description="A running worker with no progress this long is nudged; twice as long, "
        "requeued on another replica; three times, stopped.",
    )
    error_streak: int = Field(
        5, ge=2, description="Failed model calls in a row before the admin channel is alerted."
    )
    pause_after_errors: int = Field(
        0,
        ge=0,
        description="Failed model calls in a row after which the agent is paused (0: never).",
    )
    drift_seconds: Seconds = Field(
        30 * 60.0,
        gt=0,
        description="With a model, how often a long-running worker is checked against its "
        "ticket's goal.",
    )
    admin_thread: str | None = Field(
        None,
        description="Where alerts go and admins ask the watchdog: SOURCE:THREAD, e.g. "
        "`web:admin` or `slack:C0123ABC` (unset: alerts are only recorded and logged).",
    )
    embedded: bool = Field(
        True,
        description="`superagent up` runs the watchdog as a child process, restarted when it "
        "dies. Off: run `superagent watchdog` yourself (`serve` never starts one).",
    )
    restart_backoff_max_seconds: Seconds = Field(
        60.0,
        gt=0,
        description="Longest wait (before jitter) before `up` restarts a watchdog child that "
        "keeps dying; the wait doubles from 1 s and resets after a minute of uptime.",
    )


class RouterSettings(BaseModel):
    lease_seconds: Seconds = Field(
        15.0,
        gt=0,
        description="The router leader's lease: another replica takes over this long after "
        "the leader stops renewing it.",
    )
    renew_seconds: Seconds = Field(
        5.0,
        gt=0,
        description="How often the leader renews its lease, and others try to take it.",
    )
    pass_through: bool = Field(
        True,
        description="Events on threads a ticket handles go straight to its worker. Off "
        "(for comparison only): they go through the router, which forwards them.",
    )
    quarantine_after: int = Field(
        3,
        ge=1,
        description="Failed turns over an event (a malformed or refused model answer, a "
        "turn that ends without deciding it, an internal error; an unreachable model does "
        "not count) before it is set aside as undecidable, the admin told and an explicit "
        "request's thread told in one line. `superagent triggers retry ID` puts it back.",
    )
    retry_cap_seconds: Seconds = Field(
        30.0,
        gt=0,
        description="Longest wait (before jitter) between router turns that failed; it doubles "
        "from 1 s.",
    )
    model_notice_seconds: Seconds = Field(
        180.0,
        gt=0,
        description="How long the router's model may be unreachable before each thread "
        "waiting for a reply is told, once, that its message is queued.",
    )

    @model_validator(mode="after")
    def _renew_well_within_the_lease(self) -> RouterSettings:
        _renewal_fits("router", self.renew_seconds, self.lease_seconds)
        return self


class Settings(BaseSettings):
    """Everything the control plane reads from its environment."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="ignore",
        populate_by_name=True,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # A renamed setting's old variable is read below the new one (RenamedVariables);
        # each secret may come from a file named by <VARIABLE>_FILE (SecretFiles).
        return (
            init_settings,
            env_settings,
            RenamedVariables(settings_cls),
            SecretFiles(settings_cls),
            dotenv_settings,
            file_secret_settings,
        )

    environment: Environment = Field(
        Environment.development,
        description="`development` allows placeholder secrets; `production` refuses them.",
    )
    state_dir: Path = Field(
        default_factory=_default_state_dir,
        description="Directory for local state: the embedded Postgres data, TLS material, logs.",
    )
    database_url: str | None = Field(
        None,
        validation_alias=AliasChoices("DATABASE_URL", "SUPERAGENT_DATABASE_URL"),
        description="Postgres to use (`postgresql://user:pass@host/db`). Unset: an embedded "
        "Postgres runs from the state directory.",
    )
    openai_base_url: str | None = Field(
        None,
        validation_alias=AliasChoices("OPENAI_BASE_URL", "SUPERAGENT_OPENAI_BASE_URL"),
        description="Any OpenAI-compatible endpoint (OpenAI, DeepSeek, vLLM, Ollama). Unset "
        "with no key: rules-only mode.",
    )
    openai_api_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("OPENAI_API_KEY", "SUPERAGENT_OPENAI_API_KEY"),
        description="API key for the model endpoint. Never logged.",
    )
    admin_token: SecretStr | None = Field(
        None,
        description="Token for the console and admin API. Required in production.",
    )
    name: str = Field(
        "Super-agent", description="Display name of this deployment, shown to paired devices."
    )
    log_level: str = Field("INFO", description="Python log level name.")
    log_format: Literal["plain", "json"] = Field(
        "plain",
        description="`plain` text lines, or `json`: one JSON object per line (time, level, "
        "logger, message, trace_id) for log shippers.",
    )

    @field_validator("log_format", mode="before")
    @classmethod
    def _log_format_never_stops_the_process(cls, value: Any) -> Any:
        # A wrong log format is no reason to refuse to run: logging says so once and keeps
        # plain lines (controlplane.logs.apply_format), and so does the setting.
        text = str(value).strip().lower()
        return text if text in ("plain", "json") else "plain"

    shutdown_timeout_seconds: Seconds = Field(
        5.0,
        gt=0,
        description="Seconds from SIGTERM/SIGINT until the process has exited: its loops get "
        "three quarters of it to finish, then whatever still hangs is cut short.",
    )
    database_outage_exit_seconds: Seconds = Field(
        0.0,
        ge=0,
        description="A replica whose database stays unreachable this long exits (non-zero), "
        "for a supervisor to restart it. 0: it never does; it keeps serving /healthz and "
        "retrying, and resumes within a second of the database's return.",
    )
    http: HttpSettings = Field(default_factory=HttpSettings, description="HTTP API and console.")
    grpc: GrpcSettings = Field(default_factory=GrpcSettings, description="Device gateway.")
    effects: EffectsSettings = Field(
        default_factory=EffectsSettings, description="The outbox runner."
    )
    llm: LlmSettings = Field(default_factory=LlmSettings, description="Language models.")
    github: GithubSettings = Field(default_factory=GithubSettings, description="GitHub.")
    slack: SlackSettings = Field(default_factory=SlackSettings, description="Slack.")
    matrix: MatrixSettings = Field(default_factory=MatrixSettings, description="Matrix.")
    lark: LarkSettings = Field(default_factory=LarkSettings, description="Feishu/Lark.")
    webchat: WebChatSettings = Field(
        default_factory=WebChatSettings, description="The built-in web chat."
    )
    router: RouterSettings = Field(
        default_factory=RouterSettings, description="The router and its leader election."
    )
    workers: WorkerSettings = Field(
        default_factory=WorkerSettings, description="Worker sessions, one per ticket."
    )
    watchdog: WatchdogSettings = Field(
        default_factory=WatchdogSettings, description="The watchdog process."
    )

    @model_validator(mode="after")
    def _refuse_placeholder_secrets(self) -> Settings:
        if self.environment is Environment.development:
            return self
        if self.admin_token is None or not self.admin_token.get_secret_value().strip():
            raise ValueError("SUPERAGENT_ADMIN_TOKEN is required when environment=production")
        for name in ("admin_token", "openai_api_key"):
            value: SecretStr | None = getattr(self, name)
            if value is not None and value.get_secret_value().lower() in PLACEHOLDER_SECRETS:
                raise ValueError(f"{name} is a placeholder value; set a real secret for production")
        if len(self.admin_token.get_secret_value()) < MIN_ADMIN_TOKEN_LENGTH:
            raise ValueError(
                f"SUPERAGENT_ADMIN_TOKEN must be at least {MIN_ADMIN_TOKEN_LENGTH} characters "
                "in production (`openssl rand -hex 32` makes one)"
            )
        return self

    @property
    def model_configured(self) -> bool:
        return self.openai_base_url is not None or self.openai_api_key is not None


def env_name(path: tuple[str, ...], field: Any) -> str:
    """The environment variable that sets the field at ``path``."""
    aliases = getattr(field, "validation_alias", None)
    if isinstance(aliases, AliasChoices):
        first = aliases.choices[0]
        assert isinstance(first, str)
        return first
    return ENV_PREFIX + "__".join(part.upper() for part in path)


@functools.cache
def _fields() -> tuple[tuple[tuple[str, ...], Any], ...]:
    """Every leaf setting with its path, in declaration order (the model never changes:
    walked once per process, though every ``Settings()`` and help asks)."""

    def walk(model: type[BaseModel], prefix: tuple[str, ...]) -> list[tuple[tuple[str, ...], Any]]:
        found: list[tuple[tuple[str, ...], Any]] = []
        for name, field in model.model_fields.items():
            path = (*prefix, name)
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                found.extend(walk(annotation, path))
            else:
                found.append((path, field))
        return found

    return tuple(walk(Settings, ()))


def _names(path: tuple[str, ...], field: Any) -> list[str]:
    """Every variable name that sets the field (the first is the one the docs give)."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices]
    return [env_name(path, field)]


def describe() -> list[tuple[str, str, str]]:
    """Rows of (environment variable, default, description) for every leaf setting."""
    rows: list[tuple[str, str, str]] = []
    for path, field in _fields():
        if field.default_factory is not None:
            default = "~/.local/share/superagent" if path == ("state_dir",) else "(computed)"
        elif field.default is None:
            default = "unset"
        else:
            default = str(
                field.default.value if isinstance(field.default, StrEnum) else field.default
            )
        rows.append((env_name(path, field), default, field.description or ""))
    return rows


def markdown_table() -> str:
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for env, default, description in describe():
        lines.append(f"| `{env}` | `{default}` | {description} |")
    return "\n".join(lines) + "\n"


# SUPERAGENT_* names that are not settings but belong to the project's other tools: the
# compose file's image and published ports, the real-model test tier, the benchmarks, the
# CLI's context.
NOT_SETTINGS = frozenset(
    {
        "SUPERAGENT_IMAGE",
        "SUPERAGENT_HTTP_PUBLISH",
        "SUPERAGENT_HTTP_PUBLISH_2",
        "SUPERAGENT_GRPC_PUBLISH",
        "SUPERAGENT_GRPC_PUBLISH_2",
        "SUPERAGENT_REAL_MODEL",
        "SUPERAGENT_REAL_MODEL_CACHE",
        "SUPERAGENT_BENCH_PYTHONPATH",
        "SUPERAGENT_CONTEXT",  # the CLI's choice of deployment (controlplane.cli.contexts)
    }
)
# Settings that moved, and where to.
MOVED = {"SUPERAGENT_WORKERS__PRICES__": "SUPERAGENT_LLM__PRICES (prices by model, as JSON)"}


class Renamed(NamedTuple):
    """Where a renamed setting's variable went: ``new``, in seconds, where the old one
    counted ``unit`` (``per_unit`` seconds each)."""

    new: str
    unit: str = "seconds"
    per_unit: float = 1.0


# Settings renamed to name their unit (0.x): the old variable is still read, with a
# warning naming the new one, unless the new one is set too; removed in the next release.
RENAMED = {
    "SUPERAGENT_SHUTDOWN_TIMEOUT": Renamed("SUPERAGENT_SHUTDOWN_TIMEOUT_SECONDS"),
    "SUPERAGENT_HTTP__SESSION_HOURS": Renamed("SUPERAGENT_HTTP__SESSION_SECONDS", "hours", 3600),
    "SUPERAGENT_EFFECTS__POLL_INTERVAL": Renamed("SUPERAGENT_EFFECTS__POLL_INTERVAL_SECONDS"),
    "SUPERAGENT_EFFECTS__BACKOFF_BASE": Renamed("SUPERAGENT_EFFECTS__BACKOFF_BASE_SECONDS"),
    "SUPERAGENT_EFFECTS__BACKOFF_MAX": Renamed("SUPERAGENT_EFFECTS__BACKOFF_MAX_SECONDS"),
    "SUPERAGENT_LLM__TIMEOUT": Renamed("SUPERAGENT_LLM__TIMEOUT_SECONDS"),
    "SUPERAGENT_LLM__IDLE_TIMEOUT": Renamed("SUPERAGENT_LLM__IDLE_TIMEOUT_SECONDS"),
    "SUPERAGENT_LLM__RETRY_CAP": Renamed("SUPERAGENT_LLM__RETRY_CAP_SECONDS"),
    "SUPERAGENT_SLACK__TIMEOUT": Renamed("SUPERAGENT_SLACK__TIMEOUT_SECONDS"),
    "SUPERAGENT_MATRIX__SYNC_TIMEOUT": Renamed("SUPERAGENT_MATRIX__SYNC_TIMEOUT_SECONDS"),
    "SUPERAGENT_MATRIX__TIMEOUT": Renamed("SUPERAGENT_MATRIX__TIMEOUT_SECONDS"),
    "SUPERAGENT_LARK__TIMEOUT": Renamed("SUPERAGENT_LARK__TIMEOUT_SECONDS"),
    "SUPERAGENT_WATCHDOG__STALL_MINUTES": Renamed(
        "SUPERAGENT_WATCHDOG__STALL_SECONDS", "minutes", 60
    ),
    "SUPERAGENT_WATCHDOG__DRIFT_MINUTES": Renamed(
        "SUPERAGENT_WATCHDOG__DRIFT_SECONDS", "minutes", 60
    ),
}


def _renamed_seconds(old: str, text: str) -> float | None:
    """The old variable's value in the new setting's seconds (None: not a number)."""
    try:
        return float(text) * RENAMED[old].per_unit
    except ValueError:
        return None


def _renamed_line(old: str, environ: Mapping[str, str]) -> str:
    renamed = RENAMED[old]
    if renamed.new in environ:
        return f"{old} is deprecated and ignored: {renamed.new} is set"
    if renamed.per_unit == 1:
        return f"{old} is deprecated: use {renamed.new} (its value is used until then)"
    seconds = _renamed_seconds(old, environ[old])
    if seconds is None:
        return f"{old} is deprecated: use {renamed.new} (in seconds)"
    read = f"{environ[old]} {renamed.unit} is read as {seconds:g} seconds until then"
    return f"{old} is deprecated: use {renamed.new} (in seconds; {read})"


class RenamedVariables(PydanticBaseSettingsSource):
    """The old variable of each renamed setting (:data:`RENAMED`) whose new one is not set,
    converted to the new unit; below the environment, so that the new variable wins."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # (unused: __call__ reads everything at once)

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        paths = {names[0]: path for path, names in leaves()}
        for old, renamed in RENAMED.items():
            if old not in os.environ or renamed.new in os.environ:
                continue
            seconds = _renamed_seconds(old, os.environ[old])
            if seconds is None:
                raise ConfigError(
                    f"{old} (deprecated: use {renamed.new}, in seconds) is not a number of "
                    f"{renamed.unit}: {os.environ[old]!r}"
                )
            path = paths[renamed.new]
            here = values
            for part in path[:-1]:
                here = here.setdefault(part, {})
            here[path[-1]] = seconds
        return values


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A line for each ``SUPERAGENT_*`` variable in ``environ`` that no setting reads (a
    typo is otherwise ignored in silence), naming the closest setting."""
    known = {name for _, names in leaves() for name in names}
    known.update(name + "_FILE" for _, names in secret_leaves() for name in names)
    lines = []
    for name in sorted(environ):
        if not name.startswith("SUPERAGENT_") or name in known or name in NOT_SETTINGS:
            continue
        if name in RENAMED:
            lines.append(_renamed_line(name, environ))
            continue
        moved = next((to for old, to in MOVED.items() if name.startswith(old)), None)
        if moved is not None:
            lines.append(f"{name} is no longer a setting: use {moved}")
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        hint = f" (did you mean {close[0]}?)" if close else ""
        lines.append(f"{name} is not a setting and is ignored{hint}")
    return lines


# Plain strings that carry a credential all the same (a password in the URL).
CREDENTIAL_STRINGS = frozenset({("database_url",)})


def secret_leaves() -> list[tuple[tuple[str, ...], list[str]]]:
    """Each secret setting (and each string that carries a credential): its path, and
    every variable name that sets it."""
    return [
        (path, _names(path, field))
        for path, field in _fields()
        if SecretStr in getattr(field.annotation, "__args__", ())
        or field.annotation is SecretStr
        or path in CREDENTIAL_STRINGS
    ]


class SecretFiles(PydanticBaseSettingsSource):
    """``<VARIABLE>_FILE=/path`` for every secret: the file's content is the value (one
    trailing newline dropped), the way container platforms hand secrets over (Docker and
    Kubernetes secrets are files). Setting both the variable and its ``_FILE`` is an error,
    as is a file that cannot be read: said in one line, naming the variable."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # (unused: __call__ reads everything at once)

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        settings = {names[0] for _, names in leaves()}
        for path, names in secret_leaves():
            for name in names:
                file_name = os.environ.get(name + "_FILE")
                if not file_name or name + "_FILE" in settings:
                    continue  # (GitHub's private_key_file is a setting of its own: a path)
                if any(os.environ.get(n) for n in names):
                    raise ConfigError(f"set {name} or {name}_FILE, not both")
                try:
                    text = Path(file_name).expanduser().read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as exc:
                    why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
                    raise ConfigError(f"cannot read {name}_FILE ({file_name}): {why}") from None
                here = values
                for part in path[:-1]:
                    here = here.setdefault(part, {})
                here[path[-1]] = text.removesuffix("\n")
                break
        return values


def leaves() -> list[tuple[tuple[str, ...], list[str]]]:
    """Every leaf setting: its path, and the variable names that set it (the first is the
    one the docs give)."""
    return [(path, _names(path, field)) for path, field in _fields()]


def source_of(names: list[str], environ: Mapping[str, str]) -> str:
    """Where a setting's value came from: the variable that set it, its ``_FILE``, or the
    default."""
    for name in names:
        if environ.get(name):
            return name
    for name in names:
        if environ.get(name + "_FILE"):
            return f"{name}_FILE"
    for old, renamed in RENAMED.items():
        if renamed.new in names and environ.get(old):
            return old
    return "default"
