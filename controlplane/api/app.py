"""The FastAPI application: health and readiness probes, OpenAPI, the console."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, RedirectResponse

from controlplane import __version__, metrics
from controlplane.access.middleware import RequireAccess
from controlplane.api import console, errors
from controlplane.api.body_limit import BodyLimit
from controlplane.channels import registry as channel_registry
from controlplane.console import pages
from controlplane.web.state import AppState, app_state

State = Annotated[AppState, Depends(app_state)]


def create_app(state: AppState) -> FastAPI:
    app = FastAPI(
        title="Super-agent control plane",
        version=__version__,
        description="HTTP API of the Super-agent control plane.",
    )
    app.state.superagent = state
    errors.install(app)
    # The middlewares, outermost last: trace ids (metrics.install), then the body cap (a
    # body over its route's cap gets 413 unread, before anyone authenticates or parses
    # it), then the access rule: every route, those below and any added later, needs the
    # admin token or a session unless RequireAccess lists it as public (docs/security.md).
    # Inside the trace middleware, a 413 or a refusal names its request too.
    app.add_middleware(
        RequireAccess,
        state=state,
        login_page=lambda target: pages.login(next_page=target, error=None),
    )
    app.add_middleware(BodyLimit, settings=state.settings.http)
    metrics.install(app)

    @app.get("/healthz", tags=["health"], summary="Liveness: the process is serving")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    @app.get("/readyz", tags=["health"], summary="Readiness: the database answers")
    async def readyz(state: State) -> JSONResponse:
        try:
            async with asyncio.timeout(2):
                await state.pool.fetchval("SELECT 1")
        except Exception as exc:
            return JSONResponse(
                status_code=503,
                content={"status": "unavailable", "database": type(exc).__name__},
            )
        return JSONResponse({"status": "ready", "replica": state.replica_id})

    for routes in channel_registry.ROUTES:
        app.include_router(routes, tags=["channels"])

    app.include_router(console.routes)

    @app.get("/", include_in_schema=False)
    async def index() -> RedirectResponse:
        return RedirectResponse("/console", status_code=303)

    return app
