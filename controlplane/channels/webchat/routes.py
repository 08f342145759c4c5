"""The chat's HTTP surface: the page, its sign-in, the conversation API and the websocket.

* ``GET /chat``: the page (no data in it, so no token needed to load it). With
  ``?token=…`` it signs the browser in (a session cookie) and redirects to drop the token
  from the address bar, so ``superagent up`` can print one link that just works.
* ``POST /chat/session`` ``{"token": …}``: the page's sign-in form, same cookie.
* ``GET /chat/api/threads``: the caller's conversations, most recent first.
* ``GET /chat/api/threads/{thread}/messages``: one conversation's history.
* ``/chat/ws``: the websocket (see :mod:`controlplane.channels.webchat.connection`).

Every endpoint but the page checks :func:`controlplane.channels.webchat.auth.check`.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, WebSocket
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, Field

from controlplane.api.state import AppState, app_state
from controlplane.channels.webchat import auth, connection, history, inbound
from controlplane.channels.webchat.adapter import WebChatAdapter
from controlplane.channels.webchat.hub import ChatClient
from controlplane.errors import InvalidInput, NotFound, Unauthorized

routes = APIRouter()

State = Annotated[AppState, Depends(app_state)]
COOKIE_MAX_AGE = 30 * 24 * 3600


def _adapter(state: AppState) -> WebChatAdapter:
    adapter = state.channels.get(inbound.SOURCE)
    if not isinstance(adapter, WebChatAdapter):
        raise NotFound("the web chat is off here: set SUPERAGENT_WEBCHAT__ENABLED=true")
    return adapter


@functools.cache
def _page() -> str:
    return (resources.files(__package__) / "static" / "chat.html").read_text(encoding="utf-8")


def _sign_in(response: Response, request: Request, token: str) -> None:
    response.set_cookie(
        auth.COOKIE,
        auth.cookie_value(token),
        max_age=COOKIE_MAX_AGE,
        path="/chat",
        httponly=True,  # out of reach of scripts
        samesite="strict",  # never sent by other sites' pages, websockets included
        secure=request.url.scheme == "https",
    )


@routes.get("/chat", include_in_schema=False)
async def chat_page(request: Request, state: State) -> Response:
    _adapter(state)
    token = request.query_params.get("token")
    if token is None:
        return HTMLResponse(_page(), headers={"Cache-Control": "no-store"})
    response = RedirectResponse("/chat", status_code=303)
    admin = state.settings.admin_token
    if admin is not None and auth.token_matches(state.settings, token):
        _sign_in(response, request, admin.get_secret_value())
    return response


class SignIn(BaseModel):
    token: str = Field(max_length=1000, description="The admin token.")


@routes.post("/chat/session", summary="Sign the chat page in with the admin token")
async def chat_session(request: Request, body: SignIn, state: State) -> JSONResponse:
    _adapter(state)
    auth.check_origin(request)
    admin = state.settings.admin_token
    if admin is None:
        return JSONResponse({"signed_in": True, "token_required": False})
    if not auth.token_matches(state.settings, body.token):
        raise Unauthorized("that is not the admin token (SUPERAGENT_ADMIN_TOKEN)")
    response = JSONResponse({"signed_in": True, "token_required": True})
    _sign_in(response, request, admin.get_secret_value())
    return response


@routes.get("/chat/api/threads", summary="The caller's chat conversations")
async def chat_threads(request: Request, state: State, name: str | None = None) -> Any:
    adapter = _adapter(state)
    auth.check(request, state.settings)
    who = inbound.actor(auth.display_name(name))
    return {"actor": who.id, "threads": await history.conversations(adapter.pool, who.id)}


@routes.get("/chat/api/threads/{thread}/messages", summary="One chat conversation's messages")
async def chat_messages(request: Request, thread: str, state: State) -> Any:
    adapter = _adapter(state)
    auth.check(request, state.settings)
    if not await history.exists(adapter.pool, thread):
        raise NotFound(f"no conversation {thread}")
    found = await history.messages(adapter.pool, thread)
    return {"thread": thread, "messages": [message.frame() for message in found]}


@routes.websocket("/chat/ws")
async def chat_socket(websocket: WebSocket) -> None:
    state = websocket.app.state.superagent
    assert isinstance(state, AppState)
    # Accepted first, so that a refusal can say why (a refused handshake is a bare 403).
    await websocket.accept()
    try:
        adapter = _adapter(state)
        auth.check(websocket, state.settings)
        name = auth.display_name(websocket.query_params.get("name"))
    except NotFound as exc:
        await connection.refuse(websocket, connection.CLOSE_OFF, exc.message)
        return
    except Unauthorized as exc:
        await connection.refuse(websocket, connection.CLOSE_UNAUTHORIZED, exc.message)
        return
    except InvalidInput as exc:
        await connection.refuse(websocket, connection.CLOSE_BAD_REQUEST, exc.message)
        return
    await connection.converse(websocket, adapter, ChatClient(inbound.actor(name)))
