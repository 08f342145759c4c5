"""A verified Lark event (schema 2.0) → an IncomingTrigger, or the reason it is none.

Only ``im.message.receive_v1`` makes Triggers. Its thread is the message's reply chain in
its chat (``chat_id:root message id``), so a reply can be posted from the thread's external
id alone. A message addresses the agent (``direct``) in a one-to-one chat, or in a group
when its mentions include the bot. Messages sent by apps (the bot itself) are ignored.

Everything here is pure: who the bot is and the sender's display name are looked up by the
adapter and passed in.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from controlplane.channels.base import Ignored
from controlplane.channels.lark.client import BotInfo
from controlplane.errors import InvalidInput
from controlplane.ingest.admission import Actor
from controlplane.ingest.intake import IncomingTrigger, ThreadRef

SOURCE = "lark"
MESSAGE_EVENT = "im.message.receive_v1"
KIND = "message"
_PLACEHOLDER = re.compile(r"@_user_\d+|@_all")
_TITLE_CHARS = 100


@dataclass(frozen=True)
class Mention:
    key: str  # the placeholder in the text, e.g. "@_user_1"
    open_id: str
    name: str


@dataclass(frozen=True)
class Message:
    event_id: str
    message_id: str
    root_id: str  # the reply chain's first message; this message's own id when it starts one
    chat_id: str
    chat_type: str  # "p2p" or "group"
    message_type: str
    content: Any
    sender_open_id: str
    mentions: tuple[Mention, ...]
    raw: dict[str, Any]

    @property
    def thread_external_id(self) -> str:
        return f"{self.chat_id}:{self.root_id}"

    @property
    def needs_bot(self) -> bool:
        """Whether telling if it addresses the agent needs the bot's identity."""
        return self.chat_type != "p2p" and bool(self.mentions)


def parse(payload: dict[str, Any]) -> Message | Ignored:
    """The message in a verified event; InvalidInput if it is not shaped like one."""
    header = _object(payload.get("header"), "header")
    event_type = str(header.get("event_type") or "")
    if event_type != MESSAGE_EVENT:
        return Ignored(f"{event_type or 'an untyped event'} is not an event the agent acts on")
    event_id = _text(header.get("event_id"), "header.event_id")
    event = _object(payload.get("event"), "event")
    sender = _object(event.get("sender"), "event.sender")
    if sender.get("sender_type") != "user":
        return Ignored(f"sent by {sender.get('sender_type') or 'no user'} (the bot, or an app)")
    sender_id = _object(sender.get("sender_id"), "event.sender.sender_id")
    message = _object(event.get("message"), "event.message")
    message_id = _text(message.get("message_id"), "event.message.message_id")
    raw_content = message.get("content")
    try:
        content = json.loads(raw_content) if isinstance(raw_content, str) else None
    except (ValueError, RecursionError):  # ValueError: JSONDecodeError, or a huge number
        raise InvalidInput("event.message.content is not JSON") from None
    mentions = []
    listed = message.get("mentions")
    for item in listed if isinstance(listed, list) else []:
        if isinstance(item, dict) and item.get("key"):
            ids = item["id"] if isinstance(item.get("id"), dict) else {}
            mentions.append(
                Mention(
                    key=str(item["key"]),
                    open_id=str(ids.get("open_id") or ""),
                    name=str(item.get("name") or ""),
                )
            )
    # The token is the verification token: it must not be stored with the payload.
    kept = {**payload, "header": {k: v for k, v in header.items() if k != "token"}}
    return Message(
        event_id=event_id,
        message_id=message_id,
        root_id=str(message.get("root_id") or message_id),
        chat_id=_text(message.get("chat_id"), "event.message.chat_id"),
        chat_type=str(message.get("chat_type") or ""),
        message_type=str(message.get("message_type") or ""),
        content=content,
        sender_open_id=_text(sender_id.get("open_id"), "event.sender.sender_id.open_id"),
        mentions=tuple(mentions),
        raw=kept,
    )


def addresses_bot(message: Message, bot: BotInfo | None) -> bool:
    if message.chat_type == "p2p":
        return True
    if bot is None:
        return False
    return any(
        mention.open_id == bot.open_id
        or (not mention.open_id and bool(bot.name) and mention.name == bot.name)
        for mention in message.mentions
    )


def text_of(message: Message) -> str:
    """The message as plain text, mentions written as ``@Name``."""
    names = {mention.key: mention.name for mention in message.mentions if mention.name}
    content = message.content if isinstance(message.content, dict) else {}
    if message.message_type == "text":
        text = str(content.get("text") or "")
    elif message.message_type == "post":
        text = _post_text(content)
    else:
        text = f"[{message.message_type or 'message'}]"

    def named(match: re.Match[str]) -> str:
        key = match.group(0)
        if key == "@_all":
            return "@all"
        return f"@{names[key]}" if key in names else key

    return _PLACEHOLDER.sub(named, text).replace("\x00", "")


def to_trigger(message: Message, *, direct: bool, sender_name: str | None) -> IncomingTrigger:
    text = text_of(message)
    title = None
    if message.root_id == message.message_id:  # this message starts the thread
        title = (text.strip().splitlines() or [""])[0][:_TITLE_CHARS] or None
    return IncomingTrigger(
        source=SOURCE,
        external_id=message.event_id,
        thread=ThreadRef(message.thread_external_id, title=title),
        actor=Actor(
            id=message.sender_open_id,
            name=sender_name or message.sender_open_id,
            is_bot=False,  # apps' messages were ignored in parse()
            groups=(message.chat_id,),
        ),
        kind=KIND,
        text=text,
        direct=direct,
        payload=_payload(message.raw),
        ack_ref=message.message_id,
    )


def _payload(raw: dict[str, Any]) -> bytes:
    try:
        return json.dumps(raw, ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate, which JSON may escape but UTF-8 cannot hold
        raise InvalidInput("the event holds text that is not valid Unicode") from None


def _post_text(content: dict[str, Any]) -> str:
    # A received post is {"title", "content": [[element, ...], ...]}; one being composed
    # is keyed by language ({"zh_cn": {...}}): take the first language then.
    if "content" not in content and content:
        first = next(iter(content.values()))
        content = first if isinstance(first, dict) else {}
    lines = [str(content.get("title") or "")] if content.get("title") else []
    paragraphs = content.get("content")
    for paragraph in paragraphs if isinstance(paragraphs, list) else []:
        if not isinstance(paragraph, list):
            continue
        parts = []
        for element in paragraph:
            if not isinstance(element, dict):
                continue
            tag = element.get("tag")
            if tag in ("text", "a", "code_block"):
                parts.append(str(element.get("text") or ""))
            elif tag == "at":
                key = str(element.get("user_id") or "")
                parts.append(key if key.startswith("@_") else f"@{element.get('user_name', '')}")
            elif tag in ("img", "media", "emotion"):
                parts.append(f"[{tag}]")
        lines.append("".join(parts))
    return "\n".join(lines)


def _object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInput(f"the event has no {field} object")
    return value


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"the event has no {field}")
    return value
