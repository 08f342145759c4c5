"""The console's HTTP surface (docs/console.md): pages, their JSON, sign-in, live updates.

* Pages (``/console``, ``/console/tickets``, ``/console/tickets/{id}``, ``/console/devices``,
  ``/console/triggers``, ``/console/costs``, ``/console/versions``, ``/console/chat``): HTML
  shells from :mod:`controlplane.console.pages`; a browser that may not see them is sent to
  ``/console/login``.
* ``GET/POST /console/login``, ``POST /console/logout``: the admin-token form and its cookie.
* ``/console/api/…``: the data, as JSON (the actions too: pair and revoke a device; stop,
  retry and reroute a ticket); a ticket's worker timeline, and each of its messages whole.
* ``/console/ws?topics=…``: "something changed" frames (:mod:`controlplane.console.hub`).
* ``/console/static/…``: the script and the style sheet.

Every endpoint but the sign-in page and the static files needs the admin token or a session
(:mod:`controlplane.access.middleware`, in front of every route); each also checks
:func:`controlplane.access.console.check`, so a route is never open by accident.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Annotated, Any, TypeVar
from urllib.parse import parse_qs, quote

import asyncpg
from fastapi import APIRouter, Depends, Query, Request, WebSocket
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel, Field

from controlplane import deployment
from controlplane import pause as pausing
from controlplane.access import authentication, sessions, signin
from controlplane.access import console as access
from controlplane.admin import ops
from controlplane.channels.webchat.connection import refuse
from controlplane.console import (
    actions,
    costs,
    devices,
    feed,
    hub,
    overview,
    pages,
    tickets,
)
from controlplane.console import versions as documents
from controlplane.errors import InvalidInput, TransientError, Unauthorized
from controlplane.gateway.queue import CommandQueue
from controlplane.services import is_transient
from controlplane.web import headers, static_files
from controlplane.web.state import AppState, app_state

T = TypeVar("T")

routes = APIRouter()

State = Annotated[AppState, Depends(app_state)]

CLOSE_UNAUTHORIZED = 1008  # as the chat's socket: no or wrong token, a foreign origin
CLOSE_BAD_REQUEST = 4400  # unknown topics
CLOSE_TOO_SLOW = 1013  # fell behind, or the hub failed: the page reconnects
OUTPUT_LIMIT = 1 << 20  # bytes of a command's output per request
LOGIN_BODY_LIMIT = 4096
_STATIC = frozenset({"console.js", "console.css"})


async def admin(request: Request, state: State) -> AppState:
    access.check(request, state.settings)
    return state


Admin = Annotated[AppState, Depends(admin)]


def _by(request: Request, browser: str = actions.BY) -> str:
    """Who acts, for the record: the API token's name (``admin`` for the admin token), or
    the console, for a browser signed in with the admin token."""
    who = authentication.principal(request)
    return browser if who.via == "session" else who.name


Everything = Annotated[bool, Query(alias="all", description="Closed tickets too.")]


async def _read(call: Awaitable[T]) -> T:
    """The database's answer; a database that is away is a 503 saying so, not a 500."""
    try:
        return await call
    except Exception as exc:
        if is_transient(exc):
            raise TransientError("the database is not answering just now; see /readyz") from exc
        raise


def _plain(content: str | bytes) -> Response:
    # text/plain and nosniff: a recorded text that looks like HTML is shown, never run.
    return Response(
        content,
        media_type="text/plain; charset=utf-8",
        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"},
    )


def _html(content: str, status_code: int = 200) -> HTMLResponse:
    return HTMLResponse(content, status_code=status_code, headers=headers.PAGE_HEADERS)


def _page(request: Request, state: AppState, content: str) -> Response:
    """``content`` for a browser that may see it, else the way to sign in."""
    if access.allowed(request, state.settings):
        return _html(content)
    target = quote(access.next_page(str(request.url.path) + _query(request)), safe="/")
    return RedirectResponse(f"{access.LOGIN}?next={target}", status_code=303)


def _query(request: Request) -> str:
    return f"?{request.url.query}" if request.url.query else ""


# -- pages ---------------------------------------------------------------------------------


@routes.get("/console", include_in_schema=False)
async def overview_page(request: Request, state: State) -> Response:
    return _page(request, state, pages.overview())


@routes.get("/console/tickets", include_in_schema=False)
async def tickets_page(request: Request, state: State, everything: Everything = False) -> Response:
    return _page(request, state, pages.tickets(everything))


@routes.get("/console/tickets/{ticket_id}", include_in_schema=False)
async def ticket_page(request: Request, state: State, ticket_id: str) -> Response:
    return _page(request, state, pages.ticket(ticket_id))


@routes.get("/console/devices", include_in_schema=False)
async def devices_page(request: Request, state: State) -> Response:
    return _page(request, state, pages.devices())


@routes.get("/console/triggers", include_in_schema=False)
async def triggers_page(
    request: Request,
    state: State,
    verdict: str | None = None,
    route: str | None = None,
    source: str | None = None,
) -> Response:
    return _page(request, state, pages.triggers(verdict, route, source))


@routes.get("/console/costs", include_in_schema=False)
async def costs_page(request: Request, state: State) -> Response:
    return _page(request, state, pages.costs())


@routes.get("/console/versions", include_in_schema=False)
async def versions_page(request: Request, state: State) -> Response:
    return _page(request, state, pages.versions())


@routes.get("/console/chat", include_in_schema=False)
async def chat_page(request: Request, state: State) -> Response:
    return _page(request, state, pages.chat(state.settings.webchat.enabled))


@routes.get("/console/static/{name}", include_in_schema=False)
async def static(name: str) -> Response:
    return static_files.serve("controlplane.console", name, _STATIC, "console")


# -- signing in ----------------------------------------------------------------------------


@routes.get("/console/login", include_in_schema=False)
async def login_page(
    request: Request, state: State, next: str | None = None, once: str | None = None
) -> Response:
    """The sign-in form; with ``once``, a one-time link printed by ``superagent up``."""
    target = access.next_page(next)
    if once is None:
        return _html(pages.login(next_page=target, error=None))
    access.check_origin(request)
    admin = state.settings.admin_token
    secret = None
    if admin is not None:
        secret = await _read(
            sessions.redeem_link(
                state.pool,
                once,
                admin.get_secret_value(),
                authentication.peer(request),
                authentication.session_ttl(state.settings),
            )
        )
    if secret is None:
        error = (
            "That sign-in link was used already or has expired. Sign in with the admin "
            "token, or restart `superagent up` for a new link."
        )
        return _html(pages.login(next_page=target, error=error), 401)
    # Redirect to drop the link's secret from the address bar and the history.
    response = RedirectResponse(target, status_code=303)
    access.sign_in(response, request, secret, state.settings)
    return response


@routes.post("/console/login", include_in_schema=False)
async def login(request: Request, state: State) -> Response:
    """The sign-in form (form-encoded ``token`` and ``next``): the cookie, or why not."""
    access.check_origin(request)
    body = await request.body()
    if len(body) > LOGIN_BODY_LIMIT:
        raise InvalidInput("the sign-in form is too large")
    fields = parse_qs(body.decode(errors="replace"))
    token = fields.get("token", [""])[0]
    target = access.next_page(fields.get("next", [""])[0])
    secret = await signin.with_token(state.settings, state.pool, request, token)
    if secret is None:
        error = "That is not the admin token (SUPERAGENT_ADMIN_TOKEN)."
        return _html(pages.login(next_page=target, error=error), 401)
    response = RedirectResponse(target, status_code=303)
    access.sign_in(response, request, secret, state.settings)
    return response


@routes.post("/console/logout", include_in_schema=False)
async def logout(request: Request, state: State) -> Response:
    """Sign out: the session ends on the server, not only in this browser."""
    access.check_origin(request)
    secret = request.cookies.get(sessions.COOKIE)
    if secret:
        await _read(sessions.end(state.pool, secret))
    response = RedirectResponse(access.LOGIN, status_code=303)
    access.sign_out(response)
    return response


# -- data ----------------------------------------------------------------------------------


@routes.get("/console/api/whoami", tags=["console"], summary="Who this token or session is")
async def whoami(request: Request, state: Admin) -> dict[str, Any]:
    who = authentication.principal(request)
    return {"name": who.name, "via": who.via}


@routes.get(
    "/console/api/status",
    tags=["console"],
    summary="The deployment as `superagent status` shows it: replicas, router, tickets, ...",
)
async def status_data(state: Admin) -> dict[str, Any]:
    found = await _read(deployment.read(state.pool))
    return dict(deployment.as_json(found))


class PauseRequest(BaseModel):
    reason: str = Field("", max_length=2000, description="Shown by `superagent status`.")


@routes.post(
    "/console/api/pause",
    tags=["console"],
    summary="Pause the agent: events are recorded and wait (the first pause's record is kept)",
)
async def pause_agent(
    request: Request, state: Admin, body: PauseRequest | None = None
) -> dict[str, Any]:
    reason = body.reason if body else ""
    paused = await _read(pausing.pause(state.pool, _by(request), reason))
    return {"paused": True, "since": paused.at, "by": paused.by, "reason": paused.reason}


@routes.post("/console/api/resume", tags=["console"], summary="Resume after a pause")
async def resume_agent(state: Admin) -> dict[str, Any]:
    ended = await _read(pausing.resume(state.pool))
    if ended is None:
        return {"resumed": False}
    return {"resumed": True, "paused_at": ended.at, "paused_by": ended.by}


@routes.post(
    "/console/api/ops/{name}",
    tags=["console"],
    summary="An admin operation (what a superagent command does), run as the caller",
)
async def run_operation(
    request: Request, state: Admin, name: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``{"result": …}``: the operation's answer, as the command would render it. Its
    parameters are the body (an unknown one is refused); who acts is the token's holder."""
    caller = ops.Caller(state.pool, state.settings, _by(request))
    return {"result": await _read(ops.perform(name, body or {}, caller))}


@routes.get("/console/api/overview", tags=["console"], summary="What needs attention; status")
async def overview_data(state: Admin) -> dict[str, Any]:
    return await _read(overview.overview(state.settings, state.pool, state.channels.sources()))


@routes.get("/console/api/tickets", tags=["console"], summary="Tickets, newest first")
async def tickets_data(state: Admin, everything: Everything = False) -> dict[str, Any]:
    return await _read(tickets.listing(state.pool, everything=everything))


@routes.get(
    "/console/api/tickets/{ticket_id}",
    tags=["console"],
    summary="One ticket: threads, rounds, reports, commands with their output",
)
async def ticket_data(state: Admin, ticket_id: str) -> dict[str, Any]:
    return await _read(tickets.detail(state.pool, ticket_id))


@routes.get(
    "/console/api/tickets/{ticket_id}/timeline",
    tags=["console"],
    summary="One ticket's worker, round by round: messages, tool calls and results, capped",
)
async def ticket_timeline(state: Admin, ticket_id: str) -> dict[str, Any]:
    return await _read(tickets.timeline(state.pool, ticket_id))


@routes.get(
    "/console/api/tickets/{ticket_id}/messages/{message_id}",
    tags=["console"],
    summary="One message of a ticket's worker, whole (a timeline entry's recall id)",
)
async def ticket_message(state: Admin, ticket_id: str, message_id: str) -> Response:
    return _plain(await _read(tickets.message(state.pool, ticket_id, message_id)))


class RetryRequest(BaseModel):
    note: str = Field("", max_length=4000, description="What changed, for the worker to read.")


class RerouteRequest(BaseModel):
    device: str = Field(max_length=1000, description="A paired device's name or id.")


@routes.post(
    "/console/api/tickets/{ticket_id}/stop",
    tags=["console"],
    summary="Stop a ticket for good: mandate revoked, device work cancelled",
)
async def stop_ticket(request: Request, state: Admin, ticket_id: str) -> dict[str, Any]:
    return await _read(actions.stop(state.pool, ticket_id, by=_by(request)))


@routes.post(
    "/console/api/tickets/{ticket_id}/retry",
    tags=["console"],
    summary="Wake the worker of a ticket that waits for people",
)
async def retry_ticket(
    request: Request, state: Admin, ticket_id: str, body: RetryRequest | None = None
) -> dict[str, Any]:
    note = body.note if body else ""
    return await _read(actions.retry(state.pool, ticket_id, note, by=_by(request)))


@routes.post(
    "/console/api/tickets/{ticket_id}/reroute",
    tags=["console"],
    summary="Move a ticket to another paired device",
)
async def reroute_ticket(
    request: Request, state: Admin, ticket_id: str, body: RerouteRequest
) -> dict[str, Any]:
    return await _read(
        actions.reroute(state.settings, state.pool, ticket_id, body.device, by=_by(request))
    )


@routes.get(
    "/console/api/commands/{command_id}/output",
    tags=["console"],
    summary="A command's stored output, as bytes",
)
async def command_output(
    state: Admin,
    command_id: str,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=OUTPUT_LIMIT)] = OUTPUT_LIMIT,
) -> Response:
    return _plain(await _read(CommandQueue(state.pool).output(command_id, offset, limit)))


@routes.get("/console/api/devices", tags=["console"], summary="Devices, revoked ones last")
async def devices_data(state: Admin) -> dict[str, Any]:
    return await _read(devices.listing(state.pool))


class PairRequest(BaseModel):
    name: str = Field(max_length=1000, description="The new device's name, e.g. alice-laptop.")
    owner: str | None = Field(
        None,
        max_length=200,
        description="Who it belongs to: a person, or an account SOURCE:ID (default: the "
        "admin, web:admin). Only its owner may direct work to it.",
    )
    shared: str | None = Field(
        None,
        max_length=200,
        description="A team device: the group (SOURCE:GROUP) whose members may use it.",
    )


@routes.post(
    "/console/api/devices/pair",
    tags=["console"],
    summary="A one-time pairing code, and the endpointd command that uses it",
)
async def pair_device(request: Request, state: Admin, body: PairRequest) -> dict[str, Any]:
    owner = (body.owner or "").strip() or None
    shared = (body.shared or "").strip() or None
    by = _by(request, browser=devices.CREATED_BY)
    return await _read(
        devices.pair(state.settings, state.pool, name=body.name, owner=owner, shared=shared, by=by)
    )


@routes.post(
    "/console/api/devices/{device}/revoke",
    tags=["console"],
    summary="Revoke a device: its stream closes, it cannot reconnect",
)
async def revoke_device(state: Admin, device: str) -> dict[str, Any]:
    return await _read(devices.revoke(state.pool, device))


@routes.get("/console/api/triggers", tags=["console"], summary="Incoming events and verdicts")
async def triggers_data(
    state: Admin, verdict: str | None = None, route: str | None = None, source: str | None = None
) -> dict[str, Any]:
    return await _read(feed.feed(state.pool, verdict=verdict, route=route, source=source))


@routes.get("/console/api/costs", tags=["console"], summary="Tokens, cache hits and cost")
async def costs_data(state: Admin) -> dict[str, Any]:
    return await _read(costs.costs(state.pool))


@routes.get("/console/api/versions", tags=["console"], summary="Prompt and policy versions")
async def versions_data(state: Admin) -> dict[str, Any]:
    return await _read(documents.versions(state.pool))


# -- live updates --------------------------------------------------------------------------


def _hub(websocket: WebSocket, pool: asyncpg.Pool) -> hub.ConsoleHub:
    found = getattr(websocket.app.state, "console_hub", None)
    if not isinstance(found, hub.ConsoleHub):
        found = hub.ConsoleHub(pool)
        websocket.app.state.console_hub = found
    return found


@routes.websocket("/console/ws")
async def console_socket(websocket: WebSocket) -> None:
    state = websocket.app.state.superagent
    assert isinstance(state, AppState)
    # Accepted first, so that a refusal can say why (a refused handshake is a bare 403).
    await websocket.accept()
    try:
        access.check(websocket, state.settings)
        topics = hub.parse_topics(websocket.query_params.get("topics"))
        pool = state.pool
    except Unauthorized as exc:
        await refuse(websocket, CLOSE_UNAUTHORIZED, exc.message)
        return
    except InvalidInput as exc:
        await refuse(websocket, CLOSE_BAD_REQUEST, exc.message)
        return
    console_hub = _hub(websocket, pool)
    watcher = hub.Watcher(topics)
    console_hub.join(watcher)
    watcher.push({"type": "ready", "topics": sorted(topics)})
    writer = asyncio.create_task(_write(websocket, watcher))
    reader = asyncio.create_task(_drain(websocket))
    dropped = asyncio.create_task(watcher.dropped.wait())
    tasks = (writer, reader, dropped)
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if dropped in done:
            with contextlib.suppress(Exception):
                await websocket.close(CLOSE_TOO_SLOW, "reconnect")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await console_hub.leave(watcher)


async def _write(websocket: WebSocket, watcher: hub.Watcher) -> None:
    while True:
        await websocket.send_json(await watcher.frames.get())


async def _drain(websocket: WebSocket) -> None:
    """Pages send nothing; reading is how a closed socket is noticed."""
    while (await websocket.receive())["type"] != "websocket.disconnect":
        pass
