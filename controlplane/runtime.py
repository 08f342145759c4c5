"""Assembling a replica: database, HTTP, gRPC and background loops, started and stopped in order.

``superagent up`` (everything on one machine, migrating on start) and ``superagent serve``
(one replica of a deployment, refusing an unmigrated database) both end up here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import openai
import uvicorn

from controlplane.api.app import create_app
from controlplane.api.state import AppState
from controlplane.channels import registry as channel_registry
from controlplane.channels.context import ChannelContext
from controlplane.channels.github.pull_requests import (
    OPEN_PULL_REQUEST_EFFECT,
    open_pull_request_handler,
)
from controlplane.channels.outbound import (
    ACK_EFFECT,
    REPLY_EFFECT,
    acknowledge_handler,
    reply_handler,
)
from controlplane.db import migrate
from controlplane.db.engine import create_engine, session_factory
from controlplane.db.pool import create_pool
from controlplane.db.urls import asyncpg_dsn, redacted
from controlplane.effects.handlers import Handlers
from controlplane.effects.runner import EffectRunner, runner_id
from controlplane.gateway.hub import DeviceHub
from controlplane.gateway.queue import CommandQueue
from controlplane.gateway.server import EndpointGateway, GatewayService
from controlplane.gateway.tls import gateway_tls
from controlplane.heartbeat import ReplicaHeartbeat
from controlplane.ingest.intake import Intake
from controlplane.leadership import Leadership, WhileLeading
from controlplane.router.router import Router, RouterService, TurnTaker
from controlplane.router.rules_only import RUN_EFFECT, RulesOnlyRouter, run_handler
from controlplane.services import Service, run_services
from controlplane.settings import Settings
from controlplane.workers.service import WorkerService
from controlplane.workers.subagent import Subagent

log = logging.getLogger(__name__)


class _Uvicorn(uvicorn.Server):
    # The supervisor owns signals; uvicorn must not install its own handlers.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpService(Service):
    name = "http"

    def __init__(self, state: AppState) -> None:
        super().__init__()
        config = uvicorn.Config(
            create_app(state),
            host=state.settings.http.host,
            port=state.settings.http.port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=2,
            lifespan="off",
        )
        self.server = _Uvicorn(config)

    async def run(self) -> None:
        serving = asyncio.create_task(self.server.serve())
        stop = asyncio.create_task(self.stopping.wait())
        await asyncio.wait([serving, stop], return_when=asyncio.FIRST_COMPLETED)
        self.server.should_exit = True
        await serving
        stop.cancel()

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
    settings: Settings, database_url: str, *, apply_migrations: bool
) -> AsyncIterator[list[Service]]:
    """Check (or apply) the schema and build this replica's services."""
    engine = create_engine(database_url)
    try:
        if apply_migrations:
            before, after = await migrate.upgrade(engine)
            if before != after:
                log.info("database migrated from %s to %s", before or "empty", after)
        else:
            await migrate.check_migrated(engine)
        replica_id = runner_id()
        dsn = asyncpg_dsn(database_url)
        pool = await create_pool(dsn, size=10)
        try:
            queue = CommandQueue(
                pool,
                ttl=timedelta(seconds=settings.grpc.command_ttl_seconds),
                inline=settings.grpc.output_inline_bytes,
            )
            hub = DeviceHub(dsn, queue, replica_id)
            gateway = EndpointGateway(
                session_factory(engine),
                queue,
                hub,
                settings.grpc,
                gateway_tls(settings),
                server_name=settings.name,
            )
            single = settings.workers.design == "single_session"
            intake = Intake(pool, pass_through=settings.router.pass_through and not single)
            channels = channel_registry.build(
                ChannelContext(settings, pool, intake, dsn, replica_id)
            )
            state = AppState(
                settings=settings,
                engine=engine,
                replica_id=replica_id,
                intake=intake,
                pool=pool,
                channels=channels,
            )
            leadership = Leadership(
                pool,
                replica_id,
                lease_seconds=settings.router.lease_seconds,
                renew_seconds=settings.router.renew_seconds,
            )
            handlers = Handlers()
            handlers.register(RUN_EFFECT, run_handler(pool, queue))
            handlers.register(REPLY_EFFECT, reply_handler(pool, channels))
            handlers.register(ACK_EFFECT, acknowledge_handler(pool, channels))
            handlers.register(OPEN_PULL_REQUEST_EFFECT, open_pull_request_handler(pool, channels))
            services: list[Service] = [
                ReplicaHeartbeat(pool, replica_id),
                EffectRunner(dsn, handlers, settings.effects, owner=replica_id),
                leadership,
                hub,
                GatewayService(settings.grpc, gateway),
                HttpService(state),
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
                    router = Router(pool, client, settings.llm.router_model, subagent=subagent)
                else:
                    router = Router(pool, client, settings.llm.router_model)
                    services.append(
                        WorkerService(pool, queue, client, settings, owner=replica_id, dsn=dsn)
                    )
            else:
                log.info("no model configured: the router runs in rules-only mode")
                router = RulesOnlyRouter(pool, queue)
            services.append(RouterService(router, leadership, dsn, pool))
            try:
                yield services
            finally:
                await channels.close()
            await queue.close()
        finally:
            await pool.close()
    finally:
        await engine.dispose()


def model_client(settings: Settings) -> openai.AsyncOpenAI:
    """The official client for the configured OpenAI-compatible endpoint."""
    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else "unset"
    return openai.AsyncOpenAI(
        base_url=settings.openai_base_url, api_key=key, timeout=settings.llm.timeout
    )


async def serve(
    settings: Settings, database_url: str, stop: asyncio.Event, *, apply_migrations: bool
) -> None:
    log.info("database: %s", redacted(database_url))
    async with replica(settings, database_url, apply_migrations=apply_migrations) as services:
        await run_services(services, stop, shutdown_timeout=settings.shutdown_timeout)
