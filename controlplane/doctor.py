"""What ``superagent doctor`` checks: can this configuration run, and what to fix if not.

Each check returns a :class:`Check`: passed or not, what was found, and for a failure the
fix. Checks only read: they create no certificate, migrate nothing, and send nothing to a
channel. Secrets are never in a check's text, only whether they are set.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from pydantic import ValidationError

from controlplane.access import admin_token
from controlplane.access.admin_token import loopback_host as _loopback_host
from controlplane.channels.github.adapter import make_auth
from controlplane.channels.github.auth import AppAuth
from controlplane.db import migrate
from controlplane.db import pool as db_pool
from controlplane.db.database import Database, open_database
from controlplane.db.embedded import EmbeddedPostgres
from controlplane.db.urls import asyncpg_dsn, redacted
from controlplane.errors import ConfigError
from controlplane.gateway.local_device import device_home
from controlplane.settings import MIN_ADMIN_TOKEN_LENGTH, Settings, unknown_variables
from superagent_shared.gateway_tls import certificate_sha256, format_fingerprint

TIMEOUT = 5.0  # seconds for each remote check (database, model, GitHub)
OPENAI_DEFAULT_URL = "https://api.openai.com/v1"  # the openai client's default
_RENEW_BEFORE = dt.timedelta(days=30)  # as controlplane.gateway.tls renews


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str | None = None


def passed(name: str, detail: str) -> Check:
    return Check(name, True, detail)


def failed(name: str, detail: str, fix: str) -> Check:
    return Check(name, False, detail, fix)


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


# --------------------------------------------------------------------------- this machine's device


def check_device_sandbox(settings: Settings) -> Check | None:
    """The last `endpointd sandbox check` of this machine's own device (`superagent up
    --device`), read from its state dir as `endpointd status` reads it; None when this
    machine has no such device. Other devices are checked on their own machines."""
    from endpointd.checkresult import describe
    from endpointd.guard.policy import load_policy

    home = device_home(settings)
    if not home.paired:
        return None
    name = "device sandbox"
    current = load_policy(home.config, state_directory=home.state).hash().hex()
    line, report = describe(home.state, current)
    run = (
        f"ENDPOINTD_CONFIG_DIR={home.config} ENDPOINTD_STATE_DIR={home.state}"
        f" ENDPOINTD_DATA_DIR={home.data} endpointd sandbox check"
    )
    if "error" in report:
        return failed(name, line, f"run `{run}`")
    if not report["ran"]:
        # Not run is not a failure of this configuration; the line says how to run it.
        return passed(name, f"{line.split(' (', 1)[0]}: {run}")
    if report["passed"]:
        return passed(name, line)
    return failed(name, line, f"run `{run}` and apply the fix it prints for each class")


# --------------------------------------------------------------------------- configuration


def check_configuration() -> tuple[Check, Settings | None]:
    """Load the settings; the check, and the settings when they load."""
    name = "configuration"
    try:
        settings = Settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
            for err in exc.errors()
        )
        return failed(
            name,
            f"invalid: {problems}",
            "correct the variables named above (README, Configuration; `superagent config "
            "--markdown` lists them all)",
        ), None
    except ConfigError as exc:  # a secret's _FILE that cannot be read, or both set
        return failed(name, exc.message, "correct the variable named above"), None
    token = "admin token set" if settings.admin_token is not None else "no admin token"
    detail = f"{settings.environment.value}, {token}"
    if settings.admin_token is None and not _loopback_host(settings.http.host):
        # `up` and `serve` refuse to start so: say it before anyone tries.
        return failed(
            name,
            f"{detail}, but HTTP listens on {settings.http.host}: the server refuses to start",
            "set SUPERAGENT_ADMIN_TOKEN (32+ random characters: `openssl rand -hex 32`) "
            "before listening beyond loopback, or set SUPERAGENT_HTTP__HOST=127.0.0.1",
        ), settings
    unknown = unknown_variables(os.environ)
    if unknown:
        return failed(
            name,
            f"{detail}, but " + "; ".join(unknown),
            "rename or unset those variables (`superagent config --markdown` lists them all)",
        ), settings
    return passed(name, detail), settings


def check_admin_token(settings: Settings) -> Check:
    """Every HTTP surface needs the admin token: is the one in use strong and private?"""
    name = "admin token"
    if settings.admin_token is not None:
        length = len(settings.admin_token.get_secret_value())
        if length < MIN_ADMIN_TOKEN_LENGTH:
            return failed(
                name,
                f"SUPERAGENT_ADMIN_TOKEN has {length} characters; production refuses fewer "
                f"than {MIN_ADMIN_TOKEN_LENGTH}",
                "make one with `openssl rand -hex 32`",
            )
        return passed(name, f"configured ({length} characters)")
    path = admin_token.token_path(settings)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return passed(name, f"not configured: the first start generates one in {path} (0600)")
    except OSError as exc:
        return failed(name, f"{path}: {_first_line(exc)}", "check the state directory")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        return failed(
            name,
            f"{path} is readable by other users ({stat.filemode(mode)})",
            f"delete {path}: the next start generates a new token",
        )
    return passed(name, f"generated, in {path} (0600, this user only)")


def check_http_exposure(settings: Settings) -> Check:
    """The DNS-rebinding guard, and who can reach the HTTP surfaces at all."""
    name = "http"
    hosts = settings.http.allowed_hosts.strip()
    where = settings.http.host
    if _loopback_host(where):
        named = f"; by name also as {hosts}" if hosts else ""
        return passed(name, f"listens on {where}, reached by IP address or localhost{named}")
    if not hosts:
        return passed(
            name,
            f"listens on {where}: every surface needs the token; any Host name is accepted "
            "(set SUPERAGENT_HTTP__ALLOWED_HOSTS to pin the names it is served as)",
        )
    return passed(name, f"listens on {where}, served as {hosts}")


def check_worker_holds(settings: Settings) -> Check:
    """Does a worker wait for people before acting outside the device on input without
    authority (a stranger's comment, CI output)?"""
    name = "worker holds"
    mode = settings.workers.hold_untrusted
    if mode == "off":
        return failed(
            name,
            "SUPERAGENT_WORKERS__HOLD_UNTRUSTED is off: a stranger's comment on a public issue "
            "can lead a worker to push, open a pull request or use credentials unconfirmed",
            "set it to `public` (the default) or `always`",
        )
    where = "after any" if mode == "always" else "after public (or not known private)"
    return passed(
        name,
        f"pushes, pull requests and credential uses wait {where} input "
        "without authority until the requester confirms",
    )


# --------------------------------------------------------------------------- database

# What a database that is away, or refuses us, raises (not a bug of the check).
_DATABASE_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)


@contextlib.asynccontextmanager
async def _connected(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """One connection for a check (as the replicas' are), closed afterwards."""
    conn = await db_pool.connect(dsn)
    try:
        yield conn
    finally:
        await conn.close()


async def check_database(url: str, where: str | None = None) -> Check:
    """Reachable, and at this release's schema; ``where`` names it (default: the URL)."""
    name = "database"
    where = where or redacted(url)
    try:
        dsn = asyncpg_dsn(url)
    except ConfigError as exc:
        return failed(name, exc.message, "set DATABASE_URL=postgresql://user:password@host/db")
    try:
        async with asyncio.timeout(TIMEOUT), _connected(dsn) as conn:
            current = await migrate.current_revision(conn)
    except TimeoutError:
        return failed(
            name,
            f"{where} did not answer within {TIMEOUT:.0f}s",
            "check that Postgres runs and that this machine reaches it (DATABASE_URL)",
        )
    except _DATABASE_ERRORS as exc:
        return failed(
            name,
            f"{where} unavailable ({_first_line(exc)})",
            "check DATABASE_URL (host, port, user, password, database) and that Postgres runs",
        )
    head = migrate.head_revision()
    if current == head:
        return passed(name, f"{where}, schema current ({head})")
    found = "empty (no schema)" if current is None else f"schema at {current}"
    return failed(
        name,
        f"{where}: {found}, this release needs {head}",
        "run `superagent migrate` (if the database is newer than this release, upgrade "
        "superagent instead)",
    )


# --------------------------------------------------------------------------- gateway TLS


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def check_gateway_tls(settings: Settings, now: dt.datetime | None = None) -> Check:
    """The gateway's CA and certificate in the state directory, without creating them."""
    name = "gateway certificate"
    if settings.grpc.tls == "off":
        return passed(name, "TLS off: a TLS-terminating proxy must serve the gateway (docs/tls.md)")
    now = now or dt.datetime.now(dt.UTC)
    directory = settings.state_dir / "tls"
    ca_path, ca_key, cert_path = (
        directory / "ca.pem",
        directory / "ca.key",
        directory / "server.pem",
    )
    if not ca_path.exists() and not ca_key.exists():
        return passed(name, f"not created yet: the first start creates it in {directory}")
    if not (ca_path.exists() and ca_key.exists()):
        missing = "ca.key" if ca_path.exists() else "ca.pem"
        return failed(
            name,
            f"{directory / missing} is missing: the next start would make a new CA, and "
            "every paired device would have to pair again",
            f"restore {missing} from a backup of {directory}",
        )
    loose = [
        p.name
        for p in (ca_key, directory / "server.key")
        if p.exists() and p.stat().st_mode & 0o077
    ]
    if loose:
        return failed(
            name,
            f"{', '.join(loose)} in {directory} can be read by other users",
            f"chmod 600 {' '.join(str(directory / n) for n in loose)}",
        )
    renew = "move it aside and restart: a new one is issued by the same CA (devices keep working)"
    try:
        ca = _load(ca_path)
    except ValueError:
        return failed(
            name, f"{ca_path} is not a readable certificate", "restore ca.pem from a backup"
        )
    if ca.not_valid_after_utc <= now:
        return failed(
            name,
            f"the gateway's CA expired on {ca.not_valid_after_utc:%Y-%m-%d}",
            f"move {directory} aside and restart (a new CA), then pair every device again",
        )
    if not cert_path.exists():
        return passed(name, "the CA is in place; the next start issues the server certificate")
    try:
        leaf = _load(cert_path)
    except ValueError:
        return failed(name, f"{cert_path} is not a readable certificate", renew)
    try:
        leaf.verify_directly_issued_by(ca)
    except (ValueError, InvalidSignature, TypeError):  # another issuer, signature, key type
        return failed(name, f"{cert_path} was not issued by the CA in {ca_path.name}", renew)
    expires = leaf.not_valid_after_utc
    if expires <= now:
        return failed(
            name,
            f"{cert_path} expired on {expires:%Y-%m-%d}",
            "restart the control plane: it renews the certificate on start, from the same "
            "CA (devices keep working)",
        )
    days = (expires - now).days
    detail = (
        f"valid until {expires:%Y-%m-%d} ({days} days), fingerprint "
        f"{format_fingerprint(certificate_sha256(cert_path.read_bytes()))}"
    )
    if expires - now < _RENEW_BEFORE:
        detail += "; renewed at the next start, so restart before then"
    return passed(name, detail)


# --------------------------------------------------------------------------- channels


def _github_credentials(settings: Settings) -> Check | None:
    """A failure in the GitHub settings themselves (before asking GitHub), or None."""
    github = settings.github
    if not github.has_credentials:
        return failed(
            "github",
            "the webhook secret is set but nothing to answer with",
            "set SUPERAGENT_GITHUB__TOKEN, or SUPERAGENT_GITHUB__APP_ID and "
            "SUPERAGENT_GITHUB__PRIVATE_KEY(_FILE)",
        )
    if github.webhook_secret is None and not github.repos:
        return failed(
            "github",
            "credentials set, but no way to hear from GitHub",
            "set SUPERAGENT_GITHUB__WEBHOOK_SECRET (webhooks) or SUPERAGENT_GITHUB__POLL_REPOS "
            "(polling, no public ingress needed)",
        )
    return None


async def check_github(settings: Settings, http: httpx.AsyncClient) -> Check:
    """The credentials, and GitHub's opinion of them (``/rate_limit`` or ``/app``)."""
    github = settings.github
    problem = _github_credentials(settings)
    if problem is not None:
        return problem
    try:
        auth = make_auth(github)
    except ConfigError as exc:
        return failed("github", exc.message, "fix the GitHub App's private key setting")
    if isinstance(auth, AppAuth):
        path, token, who = "/app", auth.jwt(), f"the GitHub App {github.app_id}"
    else:
        path, token = "/rate_limit", (await auth.credential(http, "")).token
        who = "the token"
    inbound = "webhooks" if github.webhook_secret is not None else "polling"
    url = github.api_url.rstrip("/") + path
    try:
        response = await http.get(
            url,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/vnd.github+json",
                "User-Agent": "superagent-doctor",
            },
        )
    except httpx.HTTPError as exc:
        return failed(
            "github",
            f"{github.api_url} did not answer ({type(exc).__name__})",
            "check SUPERAGENT_GITHUB__API_URL and this machine's access to it",
        )
    if response.status_code == 401:
        fix = (
            "check SUPERAGENT_GITHUB__APP_ID, the private key, and this machine's clock"
            if isinstance(auth, AppAuth)
            else "create a new token and set SUPERAGENT_GITHUB__TOKEN"
        )
        return failed("github", f"GitHub refuses {who} (401)", fix)
    # /rate_limit answers 404 on GitHub Enterprise with rate limiting off, after the token
    # was accepted.
    if response.is_success or (path == "/rate_limit" and response.status_code == 404):
        left = response.headers.get("x-ratelimit-remaining")
        limit = response.headers.get("x-ratelimit-limit")
        quota = f", {left} of {limit} requests left this hour" if left and limit else ""
        return passed("github", f"GitHub accepts {who}{quota}; events by {inbound}")
    return failed(
        "github",
        f"GitHub answered {response.status_code} to GET {path}",
        "check SUPERAGENT_GITHUB__API_URL (GitHub Enterprise: https://HOST/api/v3)",
    )


def check_slack(settings: Settings) -> Check:
    slack = settings.slack
    if slack.app_token is None and slack.signing_secret is None:
        return failed(
            "slack",
            "bot token set, but no way to hear from Slack",
            "set SUPERAGENT_SLACK__APP_TOKEN (Socket Mode) or SUPERAGENT_SLACK__SIGNING_SECRET "
            "(Events API at /webhooks/slack)",
        )
    inbound = "Socket Mode" if slack.app_token is not None else "Events API at /webhooks/slack"
    return passed("slack", f"bot token set; events by {inbound}")


def check_matrix(settings: Settings) -> Check:
    matrix = settings.matrix
    login = "access token set" if matrix.access_token is not None else "password set (logs in)"
    return passed("matrix", f"{matrix.user_id} on {matrix.homeserver}, {login}")


def check_lark(settings: Settings) -> Check:
    lark = settings.lark
    if lark.verification_token is None and not lark.long_connection:
        return failed(
            "lark",
            "app id and secret set, but no way to hear from Feishu/Lark",
            "set SUPERAGENT_LARK__LONG_CONNECTION=true, or SUPERAGENT_LARK__VERIFICATION_TOKEN "
            "(and ENCRYPT_KEY) for POST /webhooks/lark",
        )
    inbound = "the long connection" if lark.long_connection else "POST /webhooks/lark"
    return passed("lark", f"app {lark.app_id} on {lark.domain}; events by {inbound}")


def check_webchat(settings: Settings) -> Check:
    if not settings.webchat.enabled:
        return passed("web chat", "off (SUPERAGENT_WEBCHAT__ENABLED=false)")
    return passed("web chat", "on at /chat, for holders of the admin token")


async def check_channels(settings: Settings, http: httpx.AsyncClient) -> list[Check]:
    """One check per configured channel, as ``controlplane.channels.registry`` builds them."""
    checks = []
    github = settings.github
    if github.has_credentials or github.webhook_secret is not None:
        checks.append(await check_github(settings, http))
    if settings.slack.bot_token is not None:
        checks.append(check_slack(settings))
    if settings.matrix.homeserver is not None:
        checks.append(check_matrix(settings))
    if settings.lark.app_id is not None:
        checks.append(check_lark(settings))
    checks.append(check_webchat(settings))
    return checks


# --------------------------------------------------------------------------- model


def _shown(url: str) -> str:
    """``url`` without credentials or query, fit to print."""
    parsed = httpx.URL(url)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}{parsed.path}".rstrip("/")


async def check_model(settings: Settings, http: httpx.AsyncClient) -> Check:
    """``GET /models`` on the configured endpoint, which should list the router's and the
    workers' models."""
    name = "model"
    if not settings.model_configured:
        return passed(
            name,
            "none configured: rules-only mode (slash commands and the fast path work); set "
            "OPENAI_BASE_URL and OPENAI_API_KEY for the model router",
        )
    base = (settings.openai_base_url or OPENAI_DEFAULT_URL).rstrip("/")
    shown = _shown(base)
    headers = {}
    if settings.openai_api_key is not None:
        headers["Authorization"] = f"Bearer {settings.openai_api_key.get_secret_value()}"
    try:
        response = await http.get(f"{base}/models", headers=headers)
    except httpx.HTTPError as exc:
        return failed(
            name,
            f"nothing answers at {shown} ({type(exc).__name__})",
            "check OPENAI_BASE_URL and that the model server runs and is reachable from here",
        )
    if response.status_code in (401, 403):
        key = "the key" if settings.openai_api_key is not None else "no key (none is set)"
        return failed(
            name, f"{shown} refuses {key} ({response.status_code})", "set a valid OPENAI_API_KEY"
        )
    if response.status_code == 404:
        return failed(
            name,
            f"{shown}/models not found (404)",
            "OPENAI_BASE_URL must be the API's root, usually ending in /v1",
        )
    if not response.is_success:
        return failed(
            name,
            f"{shown} answered {response.status_code}",
            "check the model server's logs, or try again",
        )
    try:
        listed = {str(m["id"]) for m in response.json()["data"]}
    except (ValueError, KeyError, TypeError):
        return failed(
            name,
            f"{shown}/models is not an OpenAI-compatible model list",
            "point OPENAI_BASE_URL at an OpenAI-compatible API",
        )
    wanted = {settings.llm.router_model, settings.llm.worker_model}
    missing = sorted(wanted - listed)
    if missing:
        return failed(
            name,
            f"{shown} does not serve {', '.join(missing)}",
            "set SUPERAGENT_LLM__ROUTER_MODEL / SUPERAGENT_LLM__WORKER_MODEL to models it "
            f"serves: {', '.join(sorted(listed)[:10]) or 'none listed'}",
        )
    return passed(name, f"{shown} serves {', '.join(sorted(wanted))}")


async def check_identities(url: str) -> Check:
    """Policy entries and account links a migration could not turn into immutable ids:
    inert (they match nobody), but someone meant them to grant authority."""
    name = "identities"
    dsn = asyncpg_dsn(url)
    try:
        async with asyncio.timeout(TIMEOUT), _connected(dsn) as conn:
            body = await conn.fetchval(
                "SELECT body FROM policy_versions WHERE name = 'ingest' "
                "ORDER BY version DESC LIMIT 1"
            )
            accounts = await conn.fetchval(
                "SELECT count(*) FROM accounts WHERE handle LIKE 'unresolved:%'"
            )
    except (TimeoutError, *_DATABASE_ERRORS) as exc:
        return failed(name, f"not read: {_first_line(exc)}", "check the database first")
    if isinstance(body, str):  # a JSON document stored as a JSON string
        body = json.loads(body)
    entries = list(body.get("unresolved") or []) if isinstance(body, dict) else []
    if not entries and not accounts:
        return passed(name, "allowlists and account links name immutable ids only")
    found = [f"{len(entries)} policy entries"] if entries else []
    found += [f"{accounts} account links"] if accounts else []
    return failed(
        name,
        f"{' and '.join(found)} could not be turned into ids and match nobody",
        "give them again by id or by a resolvable handle: `superagent admission edit`, "
        "`superagent users link` (docs/ingest.md, Who is who)",
    )


async def check_reachable(settings: Settings, database: Database | None) -> list[Check]:
    """The checks that reach out, run at once: the database (unless there is none to
    reach), the channels and the model."""
    async with httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False) as http:
        channels = asyncio.create_task(check_channels(settings, http))
        model = asyncio.create_task(check_model(settings, http))
        reached = []
        if database is not None:
            where = None
            if database.embedded is not None:
                where = f"embedded Postgres in {database.embedded.data_dir}"
            reached.append(await check_database(database.url, where))
            if reached[-1].ok:
                reached.append(await check_identities(database.url))
        return [*reached, *await channels, await model]


def diagnose() -> list[Check]:
    """Every check, in the order people read them."""
    configuration, settings = check_configuration()
    if settings is None:
        return [configuration]
    checks = [
        configuration,
        check_admin_token(settings),
        check_http_exposure(settings),
        check_worker_holds(settings),
        check_gateway_tls(settings),
    ]
    if (device := check_device_sandbox(settings)) is not None:
        checks.append(device)
    embedded = EmbeddedPostgres(settings.state_dir).data_dir
    if settings.database_url is None and not embedded.exists():
        # Starting it would create it: a check must not change what it checks.
        checks.append(
            passed(
                "database", f"embedded, not created yet: the first start creates it in {embedded}"
            )
        )
        checks.extend(asyncio.run(check_reachable(settings, None)))
        return checks
    with contextlib.ExitStack() as stack:
        database: Database | None = None
        try:
            database = stack.enter_context(open_database(settings))
        except (ConfigError, OSError) as exc:
            detail = exc.message if isinstance(exc, ConfigError) else _first_line(exc)
            checks.append(
                failed(
                    "database",
                    detail,
                    "check the state directory's permissions and free disk space, or set "
                    "DATABASE_URL to a Postgres of your own",
                )
            )
        checks.extend(asyncio.run(check_reachable(settings, database)))
    return checks
