"""The chat's HTTP surface: the page, its sign-in, the conversation API and the websocket.

* ``GET /chat``: the page, for a signed-in browser (others get the sign-in form).
* ``POST /chat/session`` ``{"token": …}``: the page's own sign-in form: a session, the
  same site-wide cookie as the console's.
* ``GET /chat/api/threads``: the caller's conversations, most recent first.
* ``GET /chat/api/threads/{thread}/messages``: one conversation's history.
* ``/chat/ws``: the websocket (see :mod:`controlplane.channels.webchat.connection`).

Every endpoint but the sign-in needs the admin token or a session (the middleware of
:mod:`controlplane.access.middleware`) and checks :func:`controlplane.access.chat.check`.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, WebSocket
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field

from controlplane.access import authentication, sessions, signin
from controlplane.access import chat as chat_access
from controlplane.channels.webchat import connection, events, history
from controlplane.channels.webchat.adapter import WebChatAdapter
from controlplane.channels.webchat.hub import ChatClient
from controlplane.errors import InvalidInput, NotFound, Unauthorized
from controlplane.web import headers, static_files
from controlplane.web.state import AppState, app_state

router = APIRouter()

State = Annotated[AppState, Depends(app_state)]


def _adapter(state: AppState) -> WebChatAdapter:
    adapter = state.channels.get(events.SOURCE)
    if not isinstance(adapter, WebChatAdapter):
        raise NotFound("the web chat is off here: set SUPERAGENT_WEBCHAT__ENABLED=true")
    return adapter


_STATIC = frozenset({"chat.js", "chat.css"})


@router.get("/chat", include_in_schema=False)
async def chat_page(request: Request, state: State) -> Response:
    _adapter(state)
    chat_access.check(request, state.settings)
    page = static_files.read(__package__, "chat.html")
    return HTMLResponse(page, headers=headers.PAGE_HEADERS)


@router.get("/chat/static/{name}", include_in_schema=False)
async def chat_static(name: str) -> Response:
    return static_files.serve(__package__, name, _STATIC, "chat")


class SignIn(BaseModel):
    token: str = Field(max_length=1000, description="The admin token.")


@router.post("/chat/session", summary="Sign the chat page in with the admin token")
async def chat_session(request: Request, body: SignIn, state: State) -> JSONResponse:
    _adapter(state)
    chat_access.check_origin(request)
    secret = await signin.with_token(state.settings, state.pool, request, body.token)
    if secret is None:
        raise Unauthorized("that is not the admin token (SUPERAGENT_ADMIN_TOKEN)")
    response = JSONResponse({"signed_in": True})
    sessions.set_cookie(response, request, secret, authentication.session_ttl(state.settings))
    return response


@router.get("/chat/api/threads", summary="The caller's chat conversations")
async def chat_threads(request: Request, state: State, name: str | None = None) -> Any:
    adapter = _adapter(state)
    chat_access.check(request, state.settings)
    who = events.actor(chat_access.display_name(name))
    return {"actor": who.id, "threads": await history.conversations(adapter.pool, who.id)}


@router.get("/chat/api/threads/{thread}/messages", summary="One chat conversation's messages")
async def chat_messages(request: Request, thread: str, state: State) -> Any:
    adapter = _adapter(state)
    chat_access.check(request, state.settings)
    if not await history.exists(adapter.pool, thread):
        raise NotFound(f"no conversation {thread}")
    found = await history.messages(adapter.pool, thread)
    return {"thread": thread, "messages": [message.frame() for message in found]}


@router.websocket("/chat/ws")
async def chat_socket(websocket: WebSocket) -> None:
    state = websocket.app.state.superagent
    assert isinstance(state, AppState)
    # Accepted first, so that a refusal can say why (a refused handshake is a bare 403).
    await websocket.accept()
    try:
        adapter = _adapter(state)
        chat_access.check(websocket, state.settings)
        name = chat_access.display_name(websocket.query_params.get("name"))
    except NotFound as exc:
        await connection.refuse(websocket, connection.CLOSE_OFF, exc.message)
        return
    except Unauthorized as exc:
        await connection.refuse(websocket, connection.CLOSE_UNAUTHORIZED, exc.message)
        return
    except InvalidInput as exc:
        await connection.refuse(websocket, connection.CLOSE_BAD_REQUEST, exc.message)
        return
    await connection.converse(websocket, adapter, ChatClient(events.actor(name)))
