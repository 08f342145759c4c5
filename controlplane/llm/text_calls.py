"""Tool calls a model wrote in its message text, read when the provider returned none.

Small models served by llama.cpp's ``llama-server``, Ollama or vLLM often write a call as
JSON in the content instead of the tool-calling channel, and the server then returns plain
``content``. :func:`read` finds such calls in an answer whose tools were offered and which
has no native ``tool_calls``; :mod:`controlplane.llm.client` turns them into the answer's
tool calls, which then run through the same tools, with the same checks, as native ones.

The forms read (``form``, on record with each call):

* ``tagged``: ``<tool_call>{...}</tool_call>`` (Hermes, Qwen), one or several;
* ``fenced``: a fenced block whose whole body is a call (```` ```json ````, ```` ``` ````,
  ```` ```tool_call ````, any language tag: the body decides);
* ``bare``: a call object alone or inside prose (Llama's ``{"name", "parameters"}``);
* ``list``: a JSON array of calls, in any of the three.

A call object is ``{"name": N, "arguments": A}`` (or ``"parameters"``; ``"id"`` and
``"type": "function"`` allowed; ``N`` under ``"function"``, ``"tool"``, ``"tool_name"``,
``"function_name"`` or ``"recipient_name"`` instead, once) or OpenAI's ``{"type":
"function", "function": {"name": N, "arguments": A}}``, with ``A`` an object or a string
(kept as written: the tool checks it).
It counts when ``N`` is an offered tool, or when it has exactly that shape with ``A`` an
object or a string: then it is clearly meant as a call, and the tools refuse the unknown
name, listing the ones that exist, as they do for a native call.

Ambiguity is answered, never guessed (:attr:`Reading.problem`; nothing of the answer runs):

* an offered tool's name as a call's name (``"name": "shell"``, also ``tool``,
  ``function``, ``name=``) outside every call that was read: JSON that does not parse, JSON
  of another shape, a call nested in other JSON, code that only names the tool;
* a ``<tool_call>`` tag that is not closed, or whose body is not a call; a ```` ```tool_call ````
  block that is not one;
* calls in two forms in one answer (a tag and a fence, a fence and bare JSON): which of
  them is meant, and whether one repeats the other, is a guess.

Prose that only mentions a tool (``I ran shell``) is a text answer, as before. So is an
answer over :data:`READ_CHARS`; bare JSON is looked for in answers up to
:data:`SCAN_CHARS`. Reading is linear in the text, whatever a model (or whoever steers it)
writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

__all__ = ["NATIVE", "UNREADABLE", "Reading", "Written", "read"]

NATIVE = "native"  # returned as a call; the forms in the text: tagged, fenced, bare, list
UNREADABLE = "unreadable"  # the form on record of the error call an unreadable answer gets
READ_CHARS = 256 * 1024  # a longer answer is a text answer: nobody's call is that long
SCAN_CHARS = 64 * 1024  # bare JSON is looked for in this much text (fences and tags: all)
SCAN_TRIES = 256  # JSON that does not parse, at most, before bare JSON is looked for no more
_WHY_CHARS = 4096  # how far back from a tool's name the JSON holding it is looked for
_WHY_BRACES = 32  # and from how many of the braces there

_OPEN_TAG = re.compile(r"<tool_call>", re.IGNORECASE)
_CLOSE_TAG = re.compile(r"</tool_call>", re.IGNORECASE)
_LOOSE_TAG = re.compile(r"</?tool_call>", re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[ \t]*\n?(.*?)```", re.DOTALL)
_CALL_FENCES = frozenset({"tool_call", "tool_calls", "function_call", "function_calls"})
# Where JSON that may be or hold a call starts: an object, or an array of objects, strings
# or arrays (a call nested in an array or object is skipped with it, and then unread).
_OPENING = re.compile(r'\{\s*"|\[\s*[{"\[]')
# What to call, under the keys models put it: "name" (OpenAI, Hermes, Llama), and the
# others small models write instead ("function", "tool", ...). A call names it once.
_NAME_KEYS = ("name", "tool", "tool_name", "function", "function_name", "recipient_name")
_CALL_KEYS = frozenset({"arguments", "parameters", "id", "type"})
_WRAPPER_KEYS = frozenset({"type", "function", "id"})
_KEYS = f"(?:{'|'.join(_NAME_KEYS)})"  # an offered tool's name given as what to call


@dataclass(frozen=True)
class Written:
    """One call read from the text."""

    name: str
    arguments: str  # as the model wrote them (an object as JSON text): the tool checks them
    form: str


@dataclass(frozen=True)
class Reading:
    """What the text held: calls (and the prose left around them), or a problem."""

    calls: tuple[Written, ...]
    content: str | None  # the prose outside the calls; the whole text when there is a problem
    problem: str | None = None  # why nothing runs, for the model
    about: str | None = None  # the tool an unreadable call names, when it names one


@dataclass(frozen=True)
class _Found:
    start: int
    end: int
    wrapper: str  # tagged, fenced, bare
    calls: tuple[tuple[str, str], ...]
    listed: bool


def read(content: str, offered: Collection[str]) -> Reading | None:
    """The calls written in ``content``, given the offered tools' names; None if it holds
    none (a text answer)."""
    names = frozenset(offered)
    if not content or not names or len(content) > READ_CHARS:
        return None
    found: list[_Found] = []
    problems: list[tuple[str, str | None]] = []  # why, and the tool it names
    masked = content

    tags = _tags(content)
    for start, body_start, body_end, end in tags:
        body = _unfence(content[body_start:body_end].strip())
        calls, listed = _calls(_loads(body), names)
        if calls is None:
            problems.append(("a <tool_call> block that is not a JSON call", _named(body, names)))
        else:
            found.append(_Found(start, end, "tagged", calls, listed))
    masked = _blank(masked, [(start, end) for start, _, _, end in tags])
    for loose in _LOOSE_TAG.finditer(masked):
        problems.append(
            ("a <tool_call> tag that is not closed", _named(masked[loose.end() :], names))
        )
        break

    fences: list[tuple[int, int, str]] = []  # each unread fence's body, for its markers
    for match in _FENCE.finditer(masked):
        language, body = match.group(1).lower(), match.group(2).strip()
        calls, listed = _calls(_loads(body), names)
        if calls is not None:
            found.append(_Found(match.start(), match.end(), "fenced", calls, listed))
            continue
        fences.append((match.start(2), match.start(2) + len(match.group(2)), body))
        if language in _CALL_FENCES and _named(body, names) is None:
            problems.append((f"a ```{language} block that is not a JSON call", None))

    masked = _blank(masked, [(f.start, f.end) for f in found if f.wrapper == "fenced"])
    if len(masked) <= SCAN_CHARS:
        decoder = json.JSONDecoder()
        position, tries = 0, 0
        while tries < SCAN_TRIES and (opening := _OPENING.search(masked, position)) is not None:
            start = opening.start()
            if _inside(start, fences):
                position = start + 1
                continue
            try:
                value, end = decoder.raw_decode(masked, start)
            except json.JSONDecodeError as exc:
                # Not JSON up to where it broke: nothing from there back is read as a call
                # (a call inside broken JSON is a guess). Each failure costs a scan of the
                # text before it (the error's line number), hence the bound on tries.
                position, tries = max(exc.pos, start + 1), tries + 1
                continue
            except RecursionError:
                break  # nested too deeply to be anyone's call
            calls, listed = _calls(value, names)
            if calls is not None:
                found.append(_Found(start, end, "bare", calls, listed))
            position = end  # never inside JSON that is not a call: a call nested there is unread

    masked = _blank(masked, [(f.start, f.end) for f in found])
    for marker in _marker(names).finditer(masked):
        tool = marker.group("tool")
        problems.append((_why(masked, marker.start(), fences), tool))
        break

    if problems:
        why, tool = problems[0]
        tool = tool or next((name for f in found for name, _ in f.calls if name in names), None)
        what = f"a {tool} call" if tool else "a tool call"
        return Reading(
            (),
            content,
            f"not run: your answer looks like {what} written in the text, but it could not "
            f"be read with confidence ({why}). Nothing in this answer ran. Make the call "
            "through the tool-calling interface, or write it alone as one JSON object: "
            '{"name": "<tool>", "arguments": {...}}',
            tool,
        )
    if not found:
        return None
    wrappers = sorted({f.wrapper for f in found})
    if len(wrappers) > 1:
        return Reading(
            (),
            content,
            f"not run: your answer writes tool calls in two forms ({' and '.join(wrappers)}), "
            "so which are meant, and whether one repeats another, is unclear. Nothing in this "
            "answer ran. Write each call once, in one form.",
        )
    found.sort(key=lambda f: f.start)
    written = tuple(
        Written(name, arguments, "list" if f.listed else f.wrapper)
        for f in found
        for name, arguments in f.calls
    )
    return Reading(written, _prose(content, found))


def _calls(value: Any, names: frozenset[str]) -> tuple[tuple[tuple[str, str], ...] | None, bool]:
    """The calls ``value`` is (one object, or a non-empty list of them), and whether it was
    a list; None if it is not calls, every item one."""
    if isinstance(value, list):
        if not value:
            return None, True
        items = [_call(item, names) for item in value]
        if any(item is None for item in items):
            return None, True
        return tuple(item for item in items if item is not None), True
    one = _call(value, names)
    return (None if one is None else (one,)), False


def _call(value: Any, names: frozenset[str]) -> tuple[str, str] | None:
    if not isinstance(value, dict):
        return None
    function = value.get("function")
    if isinstance(function, dict):
        if not set(value) <= _WRAPPER_KEYS or value.get("type", "function") != "function":
            return None
        value = function
    named = [key for key in _NAME_KEYS if key in value]
    if len(named) != 1 or not set(value) - {named[0]} <= _CALL_KEYS:
        return None  # no name, two names, or other keys: somebody's data, or a guess
    if value.get("type", "function") != "function":
        return None
    name = value[named[0]]
    if not isinstance(name, str) or not name:
        return None
    if "arguments" in value and "parameters" in value:
        return None
    arguments = value.get("arguments", value.get("parameters"))
    if isinstance(arguments, str):
        return name, arguments
    if isinstance(arguments, dict):
        return name, json.dumps(arguments, ensure_ascii=False)
    if name not in names:
        return None  # not the call shape, and no tool's name: somebody's data
    if arguments is None:
        return name, "{}"
    return name, json.dumps(arguments, ensure_ascii=False)  # the tool says it is no object


def _marker(names: frozenset[str]) -> re.Pattern[str]:
    """An offered tool's name given as what to call: ``"name": "shell"``, ``name='shell'``."""
    alternatives = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
    return re.compile(
        rf"""(?:(["']){_KEYS}\1\s*:|(?<![\w-]){_KEYS}\s*=)\s*["'](?P<tool>{alternatives})["']"""
    )


def _named(text: str, names: frozenset[str]) -> str | None:
    match = _marker(names).search(text)
    return match.group("tool") if match else None


def _why(text: str, at: int, fences: list[tuple[int, int, str]]) -> str:
    """Why the call naming a tool at ``at`` could not be read."""
    for start, end, body in fences:
        if start <= at < end:
            if not body.startswith(("{", "[")):
                return "the code block is not a call in JSON"
            parsed = _loads(body)
            if parsed is _UNPARSED:
                return f"its JSON does not parse: {_error(body)}"
            return "the JSON is not a call: an object of just name and arguments"
    # The JSON around the name, from its outermost brace: a call whose object is left
    # unclosed (a brace short) holds a nested object that parses, and the brace short is
    # what the model must hear about. Braces in the last few KiB, the nearest 32.
    back = max(0, at - _WHY_CHARS)
    starts = [back + m.start() for m in re.finditer(r"\{", text[back:at])][-_WHY_BRACES:]
    if not starts:
        return "it is not a call: an object of just name and arguments"
    decoder = json.JSONDecoder()
    for start in starts:
        try:
            _, end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError) as exc:
            if not isinstance(exc, json.JSONDecodeError) or exc.pos > at:
                return f"its JSON does not parse: {_message(exc)}"
            continue  # broken before the name: not the JSON that holds it
        if end > at:
            break  # the outermost JSON that holds the name parses
    return "it is not a call of its own: an object of just name and arguments"


_UNPARSED = object()


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _UNPARSED


def _error(text: str) -> str:
    try:
        json.loads(text)
    except (ValueError, RecursionError) as exc:
        return _message(exc)
    return "?"


def _message(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "it is nested too deeply"
    return exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)


def _tags(text: str) -> list[tuple[int, int, int, int]]:
    """Each closed ``<tool_call>`` block: its start, its body's start and end, its end. An
    opening tag that is never closed ends the search (and is then found unclosed)."""
    out, position = [], 0
    while (opening := _OPEN_TAG.search(text, position)) is not None:
        closing = _CLOSE_TAG.search(text, opening.end())
        if closing is None:
            break
        out.append((opening.start(), opening.end(), closing.start(), closing.end()))
        position = closing.end()
    return out


def _unfence(body: str) -> str:
    """A tag's body without a fence around it (some models put one inside the tag)."""
    match = _FENCE.fullmatch(body)
    return match.group(2).strip() if match else body


def _blank(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with each ``[start, end)`` of ``spans`` as spaces: positions stay, what was
    read is gone."""
    parts, position = [], 0
    for start, end in sorted(spans):
        if start < position:
            continue
        parts += [text[position:start], " " * (end - start)]
        position = end
    parts.append(text[position:])
    return "".join(parts)


def _inside(at: int, spans: list[tuple[int, int, str]]) -> bool:
    return any(start <= at < end for start, end, _ in spans)


def _prose(content: str, found: list[_Found]) -> str | None:
    """What the model said around its calls; None if nothing."""
    parts, position = [], 0
    for f in found:
        parts.append(content[position : f.start])
        position = f.end
    parts.append(content[position:])
    text = re.sub(r"\n{3,}", "\n\n", "".join(parts)).strip()
    return text or None
