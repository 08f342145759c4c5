"""The one place that turns domain errors into HTTP responses."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from controlplane import logs
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
