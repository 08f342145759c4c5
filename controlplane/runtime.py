"""Assembling a replica: database, HTTP, gRPC and background loops, started and stopped in order.

``superagent up`` (everything on one machine, migrating on start) and ``superagent serve``
(one replica of a deployment, refusing an unmigrated database) both end up here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import timedelta

import openai
import uvicorn

from controlplane import listening
from controlplane.access import sessions
from controlplane.api.app import create_app
from controlplane.api.request_head import BoundedHttpToolsProtocol
from controlplane.channels import registry as channel_registry
from controlplane.channels.context import ChannelContext
from controlplane.channels.github.pull_requests import open_pull_request_handler
from controlplane.channels.outbound import acknowledge_handler, reply_handler
from controlplane.db import migrate
from controlplane.db.pool import create_pool
from controlplane.db.urls import asyncpg_dsn, redacted
from controlplane.domain import EffectKind
from controlplane.effects.handlers import Handlers
from controlplane.effects.runner import EffectRunner, runner_id
from controlplane.gateway.delivery import CommandDelivery
from controlplane.gateway.hub import DeviceHub
from controlplane.gateway.local_device import LocalDevice, LocalDeviceRequest
from controlplane.gateway.queue import CommandQueue
from controlplane.gateway.server import EndpointGateway, GatewayService
from controlplane.gateway.tls import gateway_tls
from controlplane.heartbeat import Record, ReplicaHeartbeat
from controlplane.ingest.intake import Intake
from controlplane.leadership import Leadership, WhileLeading
from controlplane.router.router import Router
from controlplane.router.rules_only import RulesOnlyRouter, run_handler
from controlplane.router.service import RouterService, TurnTaker
from controlplane.services import LOOPS_SHARE, DatabaseWatch, Service, run_services
from controlplane.settings import Settings
from controlplane.tickets.consent import ConsentService
from controlplane.watchdog.child import WatchdogChild
from controlplane.web.state import AppState
from controlplane.workers.service import WorkerService
from controlplane.workers.subagent import Subagent

log = logging.getLogger(__name__)


class _Uvicorn(uvicorn.Server):
    # run_until_signalled owns the signals; uvicorn must not install its own handlers.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpService(Service):
    name = "http"

    def __init__(
        self, state: AppState, on_listening: Callable[[int], Awaitable[None]] | None = None
    ) -> None:
        super().__init__()
        self.on_listening = on_listening
        config = uvicorn.Config(
            create_app(state),
            host=state.settings.http.host,
            port=state.settings.http.port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=2,
            lifespan="off",
            # Bounds before any ASGI code runs (bodies are capped in api/body_limit.py): the
            # request head, for httptools as for h11, and each websocket message.
            http=BoundedHttpToolsProtocol,
            h11_max_incomplete_event_size=state.settings.http.max_header_bytes,
            ws_max_size=state.settings.http.ws_max_message_bytes,
        )
        self.server = _Uvicorn(config)

    async def run(self) -> None:
        http = self.server.config
        sock = listening.bind(
            http.host, http.port, what="HTTP", setting="SUPERAGENT_HTTP__PORT or --http-port"
        )
        try:
            await self._serve(sock)
        finally:
            sock.close()

    async def _serve(self, sock: socket.socket) -> None:
        serving = asyncio.create_task(self.server.serve(sockets=[sock]))
        stop = asyncio.create_task(self.stopping.wait())
        if self.on_listening is not None:
            await self._announce(serving)
        await asyncio.wait([serving, stop], return_when=asyncio.FIRST_COMPLETED)
        self.server.should_exit = True
        await serving
        stop.cancel()

    async def _announce(self, serving: asyncio.Task[None]) -> None:
        assert self.on_listening is not None
        # uvicorn says it listens only through a plain attribute: there is no event to await.
        while not self.server.started and not serving.done():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if serving.done():
            return
        try:
            await self.on_listening(self.port)
        except Exception:  # a sign-in link is a convenience; the server serves without it
            log.warning("could not make a sign-in link", exc_info=True)

    @property
    def port(self) -> int:
        servers = getattr(self.server, "servers", [])
        for server in servers:
            for sock in server.sockets:
                port = sock.getsockname()[1]
                assert isinstance(port, int)
                return port
        raise RuntimeError("HTTP server is not listening yet")


@contextlib.asynccontextmanager
async def replica(
    settings: Settings,
    database_url: str,
    *,
    apply_migrations: bool,
    announce: Callable[[str], None] | None = None,
) -> AsyncIterator[list[Service]]:
    """Check (or apply) the schema and build this replica's services."""
    if apply_migrations:
        before, after = await migrate.upgrade(database_url)
        if before != after:
            log.info("database migrated from %s to %s", before or "empty", after)
    replica_id = runner_id()
    dsn = asyncpg_dsn(database_url)
    # Every query of the replica goes through this pool: the hot paths, the HTTP surfaces
    # (sign-ins, the console, /metrics reads each group on a connection of its own).
    pool = await create_pool(dsn, size=20)
    try:
        if not apply_migrations:
            await migrate.check_migrated(pool)
        # The command queue's two halves: the workers' and the router's, and the gateway's.
        inline = settings.grpc.output_inline_bytes
        queue = CommandQueue(
            pool, ttl=timedelta(seconds=settings.grpc.command_ttl_seconds), inline=inline
        )
        delivery = CommandDelivery(pool, inline=inline)
        hub = DeviceHub(dsn, delivery, replica_id)
        gateway = EndpointGateway(
            pool,
            delivery,
            hub,
            settings.grpc,
            gateway_tls(settings),
            server_name=settings.name,
        )
        single = settings.workers.design == "single_session"
        intake = Intake(pool, pass_through=settings.router.pass_through and not single)
        channels = channel_registry.build(ChannelContext(settings, pool, intake, dsn, replica_id))
        state = AppState(
            settings=settings,
            pool=pool,
            replica_id=replica_id,
            intake=intake,
            channels=channels,
        )
        leadership = Leadership(
            pool,
            replica_id,
            lease_seconds=settings.router.lease_seconds,
            renew_seconds=settings.router.renew_seconds,
        )
        handlers = Handlers()
        handlers.register(EffectKind.RUN_COMMAND, run_handler(pool, queue))
        handlers.register(EffectKind.REPLY, reply_handler(pool, channels))
        handlers.register(EffectKind.ACKNOWLEDGE, acknowledge_handler(pool, channels))
        handlers.register(EffectKind.OPEN_PULL_REQUEST, open_pull_request_handler(pool, channels))
        services: list[Service] = [
            DatabaseWatch(dsn, exit_after=settings.database_outage_exit_seconds),
            ReplicaHeartbeat(pool, replica_id, Record.of(settings, channels.sources())),
            EffectRunner(dsn, handlers, settings.effects, owner=replica_id),
            leadership,
            hub,
            GatewayService(settings.grpc, gateway),
            HttpService(state, _link_announcer(state, announce) if announce else None),
        ]
        for adapter in channels:
            services.extend(adapter.services())
            services.extend(WhileLeading(s, leadership) for s in adapter.leader_services())
        router: TurnTaker
        if settings.model_configured:
            client = model_client(settings)
            if single:
                log.warning("workers.design = single_session: the baseline, for comparison")
                subagent = Subagent(pool, queue, client, settings, owner=replica_id)
                router = Router(
                    pool, client, settings.llm.router_model, subagent=subagent, llm=settings.llm
                )
            else:
                router = Router(pool, client, settings.llm.router_model, llm=settings.llm)
                services.append(
                    WorkerService(pool, queue, client, settings, owner=replica_id, dsn=dsn)
                )
        else:
            log.info("no model configured: the router runs in rules-only mode")
            router = RulesOnlyRouter(pool, queue)
        services.append(RouterService(router, leadership, dsn, pool, settings=settings))
        # In every mode: owners' answers to requests for their devices, and expiries.
        services.append(ConsentService(pool, settings))
        try:
            yield services
        finally:
            await channels.close()
        await queue.close()
    finally:
        await pool.close()


def _link_announcer(
    state: AppState, announce: Callable[[str], None]
) -> Callable[[int], Awaitable[None]]:
    """Once HTTP listens: a one-time sign-in link to the console, given to ``announce``."""

    async def on_listening(port: int) -> None:
        token = state.settings.admin_token
        if token is None:
            return
        secret = await sessions.create_link(state.pool, token.get_secret_value())
        announce(f"{state.settings.http.local_url(port)}/console/login?once={secret}")

    return on_listening


def model_client(settings: Settings) -> openai.AsyncOpenAI:
    """The official client for the configured OpenAI-compatible endpoint."""
    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else "unset"
    return openai.AsyncOpenAI(
        base_url=settings.openai_base_url, api_key=key, timeout=settings.llm.timeout_seconds
    )


async def serve(
    settings: Settings,
    database_url: str,
    stop: asyncio.Event,
    *,
    apply_migrations: bool,
    announce: Callable[[str], None] | None = None,
    watchdog_child: bool = False,
    local_device: LocalDeviceRequest | None = None,
) -> None:
    """Run one replica until ``stop``; ``announce`` gets a one-time console sign-in link.

    With ``watchdog_child`` (``superagent up``) the watchdog runs beside it as a supervised
    child process, started after the schema is in place and stopped first; likewise this
    machine's endpointd with ``local_device`` (``superagent up --device DIR``).
    """
    log.info("database: %s", redacted(database_url))
    async with replica(
        settings, database_url, apply_migrations=apply_migrations, announce=announce
    ) as services:
        if watchdog_child:
            backoff_cap = settings.watchdog.restart_backoff_max_seconds
            services.append(WatchdogChild(database_url, backoff_cap=backoff_cap))
        if local_device is not None:
            services.append(
                LocalDevice(
                    settings,
                    asyncpg_dsn(database_url),
                    request=local_device,
                    backoff_cap=settings.watchdog.restart_backoff_max_seconds,
                )
            )
        # The loops get most of the shutdown timeout; the rest is for closing pools, channels
        # and the embedded Postgres before run_until_signalled's deadline cuts it short.
        await run_services(
            services, stop, shutdown_timeout=settings.shutdown_timeout_seconds * LOOPS_SHARE
        )
