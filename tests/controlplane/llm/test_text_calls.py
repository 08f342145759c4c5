"""Tool calls written in the message text: the recognizer alone (a pure function), then the
model boundary over HTTP against the scripted fake."""

from __future__ import annotations

import json
import time
from typing import Any

import asyncpg
import pytest

from controlplane.llm.text_calls import READ_CHARS, Reading, read
from controlplane.settings import LlmSettings
from tests.fakes.openai_server import FAKE_MODEL, FakeOpenAIServer, Reply, ToolCall

OFFERED = frozenset({"shell", "report", "read_file"})
SHELL = {"name": "shell", "arguments": {"command": "ls"}}
LS = '{"command": "ls"}'


def _js(value: object) -> str:
    return json.dumps(value)


def _calls(reading: Reading | None) -> list[tuple[str, dict[str, object], str]]:
    assert reading is not None
    assert reading.problem is None, reading.problem
    return [(c.name, json.loads(c.arguments), c.form) for c in reading.calls]


@pytest.mark.parametrize(
    ("text", "form"),
    [
        (f"```json\n{_js(SHELL)}\n```", "fenced"),
        (f"```JSON\n{_js(SHELL)}\n```", "fenced"),
        (f"```\n{_js(SHELL)}\n```", "fenced"),
        (f"```tool_call\n{_js(SHELL)}\n```", "fenced"),
        (f"```json {_js(SHELL)} ```", "fenced"),
        (f"<tool_call>{_js(SHELL)}</tool_call>", "tagged"),
        (f"<tool_call>\n```json\n{_js(SHELL)}\n```\n</tool_call>", "tagged"),
        (_js(SHELL), "bare"),
        (f"  {_js(SHELL)}\n", "bare"),
        (_js({"name": "shell", "parameters": {"command": "ls"}}), "bare"),
        (_js({"name": "shell", "arguments": LS}), "bare"),
        (_js({"type": "function", "function": {"name": "shell", "arguments": LS}}), "bare"),
        (_js({"function": {"name": "shell", "arguments": {"command": "ls"}}}), "bare"),
        # The tool's name under another key than "name" (the 1.5B worker wrote "function",
        # a real run, 2026-12-07; others write "tool" or "tool_name"): the same call.
        (f"```json\n{_js({'function': 'shell', 'arguments': {'command': 'ls'}})}\n```", "fenced"),
        (_js({"tool": "shell", "arguments": {"command": "ls"}}), "bare"),
        (_js({"tool_name": "shell", "parameters": {"command": "ls"}}), "bare"),
        (_js({"function_name": "shell", "arguments": LS}), "bare"),
        (_js({"recipient_name": "shell", "parameters": {"command": "ls"}}), "bare"),
        (_js([SHELL]), "list"),
        (f"```json\n{_js([SHELL])}\n```", "list"),
        (f"<tool_call>{_js([SHELL])}</tool_call>", "list"),
    ],
)
def test_each_form_is_read_as_the_call(text: str, form: str) -> None:
    assert _calls(read(text, OFFERED)) == [("shell", {"command": "ls"}, form)]


def test_several_calls_of_one_form_are_read_in_order() -> None:
    report = {"name": "report", "arguments": {"status": "ready", "summary": "ok"}}
    tags = f"<tool_call>{_js(SHELL)}</tool_call>\n<tool_call>{_js(report)}</tool_call>"
    assert [c[0] for c in _calls(read(tags, OFFERED))] == ["shell", "report"]
    fences = f"```json\n{_js(SHELL)}\n```\nthen\n```json\n{_js(report)}\n```"
    assert [c[0] for c in _calls(read(fences, OFFERED))] == ["shell", "report"]
    listed = _js([SHELL, report])
    assert [c[2] for c in _calls(read(listed, OFFERED))] == ["list", "list"]


def test_the_prose_around_a_call_is_kept_as_what_the_model_said() -> None:
    reading = read(f"I'll list the files.\n```json\n{_js(SHELL)}\n```\nThen I read.", OFFERED)
    assert reading is not None
    assert reading.content == "I'll list the files.\n\nThen I read."
    alone = read(f"```json\n{_js(SHELL)}\n```", OFFERED)
    assert alone is not None
    assert alone.content is None


def test_arguments_are_kept_as_the_model_wrote_them_for_the_tool_to_check() -> None:
    # Validation is the tools' (the same as for a native call): wrong types pass through.
    (call,) = _calls(read(_js({"name": "shell", "arguments": {"command": ["ls"]}}), OFFERED))
    assert call[1] == {"command": ["ls"]}
    missing = read(_js({"name": "report"}), OFFERED)
    assert missing is not None
    assert [c.arguments for c in missing.calls] == ["{}"]
    # Arguments given as a string that is not JSON go to the tool as written.
    odd = read(_js({"name": "shell", "arguments": "ls -la"}), OFFERED)
    assert odd is not None
    assert [c.arguments for c in odd.calls] == ["ls -la"]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "All done: I ran shell and read_file, and the report is below.",
        "Use `shell` to run it.",
        '```json\n{"retries": 3, "name": "my-app"}\n```',
        '{"name": "my-app", "version": "1.0.0", "scripts": {"test": "pytest"}}',
        "```python\nprint('shell')\n```",
        "[1] see the docs [2] {not json}",
        '{"name": "Bob"}',
        '{"function": "main", "file": "app.py"}',
    ],
)
def test_text_that_is_not_a_call_is_a_text_answer(text: str) -> None:
    assert read(text, OFFERED) is None


def test_a_name_that_is_no_tool_in_the_call_shape_is_read_for_the_tools_to_refuse() -> None:
    reading = read('```json\n{"name": "delete_everything", "arguments": {}}\n```', OFFERED)
    assert [(c.name, c.form) for c in (reading.calls if reading else ())] == [
        ("delete_everything", "fenced")
    ]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('```json\n{"name": "shell", "arguments": {"command": "ls"\n```', "does not parse"),
        ('{"name": "shell", "arguments": {"command": "ls"', "does not parse"),
        ('<tool_call>{"name": "shell", "arguments": {"command": "ls"}}', "not closed"),
        ("<tool_call>run ls please</tool_call>", "not a JSON call"),
        ('```json\n{"tool": "shell", "command": "ls"}\n```', "not a call"),
        ('{"steps": [{"name": "shell", "arguments": {"command": "ls"}}]}', "not a call"),
        ("```python\ntools.call(name='shell', command='ls')\n```", "not a call"),
        ("```tool_call\nshell ls\n```", "not a JSON call"),
        # Two names for what to call: which one is meant is a guess.
        ('{"name": "shell", "tool": "read_file", "arguments": {}}', "not a call"),
        # The 1.5B worker's answer (a real run, 2026-12-07): a brace short. Its nested
        # object parses, but the JSON that holds it does not, and that is what is said.
        (
            '<tools>\n{"function": {"name": "shell", "arguments": {"command": "cd demo && '
            "echo 'Ada Lovelace' >> CONTRIBUTORS\"}}\n</tools>",
            "does not parse",
        ),
    ],
)
def test_a_call_that_cannot_be_read_is_a_problem_never_a_guess(text: str, why: str) -> None:
    reading = read(text, OFFERED)
    assert reading is not None
    assert reading.calls == ()
    assert reading.problem is not None
    assert why in reading.problem, reading.problem
    assert "could not be read" in reading.problem
    assert reading.content == text  # the whole text stays on record


def test_one_unreadable_call_stops_the_readable_ones_too() -> None:
    text = f"{_js(SHELL)}\n" + '{"name": "report", "arguments": {"status": '
    reading = read(text, OFFERED)
    assert reading is not None
    assert reading.calls == ()
    assert reading.problem is not None
    assert "report" in reading.problem


def test_a_call_inside_broken_json_is_not_picked_out_of_it() -> None:
    reading = read('{"plan": {"name": "shell", "arguments": {"command": "ls"}} oops', OFFERED)
    assert reading is not None
    assert reading.calls == ()
    assert reading.problem is not None


@pytest.mark.parametrize(
    "text",
    [
        '{"a' * 20_000,
        "[" * 60_000,
        "<tool_call>" * 5_000,
        "```" * 30_000,
        '{"name": "shell", "arguments": ' * 2_000,
        _js(SHELL) * 3_000,
    ],
)
def test_text_built_to_be_slow_is_read_in_linear_time(text: str) -> None:
    started = time.monotonic()
    read(text, OFFERED)
    assert time.monotonic() - started < 1.5


def test_an_answer_longer_than_any_call_is_a_text_answer() -> None:
    assert read(_js(SHELL) + " " * READ_CHARS, OFFERED) is None


def test_two_forms_in_one_answer_are_ambiguous() -> None:
    text = f"<tool_call>{_js(SHELL)}</tool_call>\n```json\n{_js(SHELL)}\n```"
    reading = read(text, OFFERED)
    assert reading is not None
    assert reading.calls == ()
    assert reading.problem is not None
    assert "two forms" in reading.problem


# -- the boundary ---------------------------------------------------------------------------


async def test_the_client_reads_a_call_in_the_text_only_when_tools_were_offered(
    pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    from controlplane.llm import Accounting, LlmClient

    tools = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
    text = f"Running it.\n```json\n{_js(SHELL)}\n```"
    fake_llm.script(Reply(content=text), Reply(content=text))
    client = LlmClient(pool, fake_llm.async_openai_client(), LlmSettings())
    messages = [{"role": "user", "content": "list the files"}]
    answer = await client.complete(
        model=FAKE_MODEL, messages=messages, tools=tools, accounting=Accounting(None)
    )
    (call,) = answer.tool_calls
    assert (call.name, json.loads(call.arguments), call.form) == (
        "shell",
        {"command": "ls"},
        "fenced",
    )
    assert call.id.startswith("text_call_0")
    assert answer.content == "Running it."
    stored = answer.message()
    assert stored["tool_calls"][0]["form"] == "fenced"  # on record
    # Without tools offered, the same text is only text.
    plain = await client.complete(model=FAKE_MODEL, messages=messages, accounting=Accounting(None))
    assert plain.tool_calls == ()
    assert plain.content == text


async def test_the_form_on_record_never_reaches_the_provider(
    pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    from controlplane.llm import Accounting, LlmClient

    fake_llm.script(Reply(content="ok"), Reply(tool_calls=[ToolCall("shell", {"command": "ls"})]))
    client = LlmClient(pool, fake_llm.async_openai_client(), LlmSettings())
    recorded: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "text_call_0_x",
                "type": "function",
                "function": {"name": "shell", "arguments": LS},
                "form": "fenced",
            }
        ],
    }
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "list"},
        recorded,
        {"role": "tool", "tool_call_id": "text_call_0_x", "content": "a\nb"},
    ]
    await client.complete(model=FAKE_MODEL, messages=messages, accounting=Accounting(None))
    sent = fake_llm.chat_requests[0].messages[1]
    assert sent["tool_calls"] == [
        {"id": "text_call_0_x", "type": "function", "function": {"name": "shell", "arguments": LS}}
    ]
    assert recorded["tool_calls"][0]["form"] == "fenced"  # the caller's record is untouched
