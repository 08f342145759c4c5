"""The one place that turns domain errors into HTTP responses."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from controlplane import logs
from controlplane.db import outage
from controlplane.errors import SuperagentError

log = logging.getLogger(__name__)


def install(app: FastAPI) -> None:
    @app.exception_handler(SuperagentError)
    async def domain_error(request: Request, exc: SuperagentError) -> JSONResponse:
        retry_after = getattr(exc, "retry_after", None)
        return JSONResponse(
            status_code=exc.http_status,
            content={"error": {"code": exc.code, "message": exc.message}},
            headers={"Retry-After": str(retry_after)} if retry_after is not None else None,
        )

    async def database_unreachable(request: Request, exc: Exception) -> JSONResponse:
        # A request that needed the database during an outage: the caller may retry (a
        # webhook sender redelivers on 503), and the outage is logged once, not per request.
        if not await outage.absorbed(exc, f"{request.method} {request.url.path}"):
            return await unexpected(request, exc)
        return JSONResponse(
            status_code=503,
            content={
                "error": {
                    "code": "database_unavailable",
                    "message": "the database is unreachable; retry shortly",
                }
            },
            headers={"Retry-After": "5", "X-Request-Id": logs.current_trace_id() or ""},
        )

    # Registered by class: these are handled inside the app, where Starlette does not
    # re-raise them to the server (which would log a second traceback).
    for kind in outage.CONNECTION_ERRORS:
        app.add_exception_handler(kind, database_unreachable)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The details go to the log (with the trace); the caller gets no internals.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(
            status_code=500,
            content={"error": {"code": "internal", "message": "internal error; see server log"}},
            # Starlette answers a 500 outside every middleware: the trace id is set here.
            headers={"X-Request-Id": logs.current_trace_id() or ""},
        )
