"""Harness output streams parsed into harness events (controlplane/workers/harness/streams).

Samples (``samples/``): ``qwen.jsonl`` is a real Qwen Code 0.24.4 run against
``tests/fakes/openai_server.FakeOpenAIServer``, recorded by ``samples/record_qwen.py``
(writes a file, edits it, runs a command, makes a call qwen refuses, answers);
``qwen_no_auth.jsonl`` is a real qwen run refused before any model call (no
``--auth-type``). The claude and codex samples are written by hand from the documented
shapes (Claude Code's headless/CLI reference; openai/codex ``docs/exec.md`` and
``codex-rs/exec/src/exec_events.rs``), as no claude or codex binary runs here.
"""

from __future__ import annotations

import json
import random
from decimal import Decimal
from pathlib import Path

import pytest

from controlplane.llm.prices import PriceBook
from controlplane.settings import LlmPrices
from controlplane.workers.harness.runs import priced
from controlplane.workers.harness.streams import (
    HarnessEvent,
    Tally,
    Usage,
    parser_for,
)

SAMPLES = Path(__file__).with_name("samples")
QWEN_SESSION = "164c1c46-78c2-4cb7-be9d-e92beaa87810"
CLAUDE_SESSION = "8f1d6c52-3b0e-4c8e-9d0a-2f4c1e7b9a10"
CODEX_THREAD = "0199a213-81c0-7800-8aa1-bbab2a035a53"
ALL = [
    ("qwen", "qwen.jsonl"),
    ("qwen", "qwen_no_auth.jsonl"),
    ("claude", "claude.jsonl"),
    ("codex", "codex.jsonl"),
    ("codex", "codex_failed.jsonl"),
]


def sample(name: str) -> bytes:
    return (SAMPLES / name).read_bytes()


def parse(harness: str, data: bytes, chunks: list[int] | None = None) -> list[HarnessEvent]:
    """All events of ``data``, fed whole or cut at the given sizes (the rest in one piece)."""
    parser = parser_for(harness)
    events: list[HarnessEvent] = []
    at = 0
    for size in chunks or []:
        events += parser.feed(data[at : at + size])
        at += size
    events += parser.feed(data[at:])
    return events + parser.finish()


def tally(events: list[HarnessEvent]) -> Tally:
    summary = Tally()
    for event in events:
        summary.add(event)
    return summary


def of(events: list[HarnessEvent], kind: str) -> list[HarnessEvent]:
    return [e for e in events if e.kind == kind]


# ---------------------------------------------------------------------------------- qwen


def test_real_qwen_run_becomes_session_calls_results_messages_and_totals() -> None:
    events = parse("qwen", sample("qwen.jsonl"))

    assert [e.kind for e in events] == [
        "session",
        "message",
        *["tool_call", "usage", "tool_result"] * 4,
        "message",
        "usage",
        "result",
    ]
    assert events[0].session_id == QWEN_SESSION
    assert all(e.session_id == QWEN_SESSION for e in events)
    write, edit, shell, read = of(events, "tool_call")
    assert (write.tool, write.call_id) == ("write_file", "call_fake_1")
    assert write.arguments == {"file_path": "/workspace/hello.txt", "content": "hello\n"}
    assert write.files == edit.files == ("/workspace/hello.txt",)
    assert (shell.tool, shell.arguments, shell.files) == (
        "run_shell_command",
        {"command": "cat hello.txt"},
        (),
    )
    results = of(events, "tool_result")
    assert [r.call_id for r in results] == [
        "call_fake_1",
        "call_fake_2",
        "call_fake_3",
        "call_fake_4",
    ]
    assert results[0].text.startswith("Successfully created and wrote to new file")
    assert results[0].files == ("/workspace/hello.txt",)
    assert results[2].text == "hello world"
    assert [r.is_error for r in results] == [False, False, False, True]
    assert read.tool == results[3].tool == "read_file"
    assert [m.text for m in of(events, "message")] == [
        "I'll write the file.",
        "Done: hello.txt says hello world.",
    ]
    result = events[-1]
    assert not result.is_error
    assert result.text == "Done: hello.txt says hello world."
    assert result.turns == 5
    # qwen counts cache reads inside input_tokens (OpenAI's way): prompt_tokens as printed.
    assert result.usage == Usage(prompt_tokens=95785, completion_tokens=88, cached_tokens=76288)


def test_real_qwen_run_tally() -> None:
    summary = tally(parse("qwen", sample("qwen.jsonl")))

    assert summary.session_id == QWEN_SESSION
    assert summary.turns == 5
    assert summary.usage == Usage(95785, 88, 76288)
    assert summary.files == ["/workspace/hello.txt"]  # written then edited: listed once
    assert summary.last_message == summary.result_text == "Done: hello.txt says hello world."
    assert summary.succeeded is True
    assert summary.error is None
    assert summary.tool_signatures == [
        'write_file:{"content":"hello\\n","file_path":"/workspace/hello.txt"}',
        'edit:{"file_path":"/workspace/hello.txt","new_string":"hello world","old_string":"hello"}',
        'run_shell_command:{"command":"cat hello.txt"}',
        'read_file:{"absolute_path":"/workspace/missing.txt"}',
    ]


def test_qwen_refusing_to_start_is_a_failed_result_with_its_reason() -> None:
    events = parse("qwen", sample("qwen_no_auth.jsonl"))
    summary = tally(events)

    assert [e.kind for e in events] == ["session", "result"]
    assert summary.session_id == "6e21c0a5-0e74-4ab3-b01f-abfe3a6f8e09"
    assert summary.succeeded is False
    assert summary.error is not None
    assert summary.error.startswith("No auth type is selected")
    assert summary.turns == 0
    assert summary.usage.total == 0


# ---------------------------------------------------------------------------------- claude


def test_claude_stream_counts_each_response_once_with_its_last_usage() -> None:
    events = parse("claude", sample("claude.jsonl"))

    # msg_01 came as three lines (thinking, text, tool_use) repeating its usage: one event,
    # with the last (final) count; claude's input_tokens excludes the cache: added back.
    usages = [e.usage for e in of(events, "usage")]
    assert usages == [
        Usage(4 + 1200 + 10000, 60, 10000),
        Usage(3 + 100 + 11200, 20, 11200),
        Usage(3 + 80 + 11300, 40, 11300),
        Usage(2 + 50 + 11380, 5, 11380),
    ]
    result = events[-1]
    assert result.kind == "result"
    assert result.usage == Usage(12 + 1430 + 43880, 125, 43880, cost_usd=0.0321)
    total = Usage()
    for usage in usages:
        assert usage is not None
        total = total + usage
    assert (total.prompt_tokens, total.completion_tokens) == (
        result.usage.prompt_tokens,
        result.usage.completion_tokens,
    )


def test_claude_stream_tally() -> None:
    events = parse("claude", sample("claude.jsonl"))
    summary = tally(events)

    assert events[0] == HarnessEvent(
        "session", session_id=CLAUDE_SESSION, model="claude-sonnet-4-5"
    )
    calls = of(events, "tool_call")
    assert [(c.tool, c.files) for c in calls] == [
        ("Write", ("/workspace/src/new.py",)),
        ("Bash", ()),
        ("Edit", ("/workspace/src/old.py",)),
    ]
    assert of(events, "tool_result")[1].text == "1 passed in 0.01s"  # a list of text blocks
    assert summary.session_id == CLAUDE_SESSION
    assert summary.turns == 4
    assert summary.usage == Usage(45322, 125, 43880, cost_usd=0.0321)
    assert summary.files == ["/workspace/src/new.py"]  # the failed Edit changed nothing
    assert summary.last_message == "Added src/new.py; src/old.py had no `A = 1`."
    assert summary.succeeded is True


def test_a_stream_cut_before_its_result_sums_per_call_usage_once() -> None:
    lines = sample("claude.jsonl").splitlines(keepends=True)
    cut = b"".join(line for line in lines if b'"type":"result"' not in line)

    summary = tally(parse("claude", cut))

    assert summary.usage == Usage(45322, 125, 43880)  # no cost: only the result has it
    assert summary.turns == 4
    assert summary.succeeded is None
    assert summary.result_text is None


def test_claude_api_error_reported_as_success_subtype_is_a_failure() -> None:
    line = {
        "type": "result",
        "subtype": "success",
        "is_error": True,
        "result": "API Error: 529 overloaded",
        "session_id": "s1",
        "num_turns": 1,
        "total_cost_usd": 0,
    }
    summary = tally(parse("claude", json.dumps(line).encode()))

    assert summary.succeeded is False
    assert summary.error == "API Error: 529 overloaded"
    assert summary.usage == Usage(cost_usd=0.0)


def test_claude_error_subtype_without_result_text_uses_its_errors() -> None:
    line = {"type": "result", "subtype": "error_max_turns", "is_error": True, "errors": ["max"]}
    [result] = parse("claude", json.dumps(line).encode())
    assert result.is_error
    assert result.text == "max"


def test_sub_agent_messages_interleaved_are_counted_once_and_not_as_main_turns() -> None:
    def assistant(msg_id: str, parent: str | None, output: int, content: object) -> str:
        message = {
            "id": msg_id,
            "content": content,
            "usage": {"input_tokens": 1, "output_tokens": output},
        }
        return json.dumps({"type": "assistant", "message": message, "parent_tool_use_id": parent})

    task = [{"type": "tool_use", "id": "toolu_task", "name": "Task", "input": {"prompt": "look"}}]
    lines = [
        assistant("m1", None, 5, task),
        assistant("s1", "toolu_task", 7, [{"type": "text", "text": "sub says"}]),
        assistant("m1", None, 6, [{"type": "text", "text": "waiting"}]),  # same response
        assistant("s1", "toolu_task", 8, [{"type": "text", "text": "sub done"}]),
        assistant("m2", None, 2, [{"type": "text", "text": "main done"}]),
    ]
    events = parse("claude", "\n".join(lines).encode())
    summary = tally(events)

    usages = [
        (e.parent_call_id, e.usage.completion_tokens if e.usage else None)
        for e in of(events, "usage")
    ]
    assert sorted(usages, key=str) == sorted([(None, 6), ("toolu_task", 8), (None, 2)], key=str)
    assert summary.turns == 2  # the main agent's responses
    assert summary.usage == Usage(3, 16, 0)  # everyone's tokens cost
    assert summary.last_message == "main done"


# ---------------------------------------------------------------------------------- codex


def test_codex_stream_events() -> None:
    events = parse("codex", sample("codex.jsonl"))

    assert events[0] == HarnessEvent("session", session_id=CODEX_THREAD)
    calls = of(events, "tool_call")
    assert [(c.tool, c.call_id) for c in calls] == [
        ("command_execution", "item_1"),
        ("file_change", "item_3"),
        ("command_execution", "item_4"),
        ("mcp_tool_call", "item_5"),
        ("file_change", "item_6"),
    ]
    assert calls[0].arguments == {"command": "bash -lc ls"}
    assert calls[1].files == ("src/app.py", "tests/test_app.py")
    assert calls[3].arguments == {
        "server": "docs",
        "tool": "search",
        "arguments": {"query": "pytest fixtures"},
    }
    results = {r.call_id: r for r in of(events, "tool_result")}
    assert list(results) == ["item_1", "item_3", "item_4", "item_5", "item_6"]
    assert results["item_1"].text == "README.md\nsrc\n"
    assert not results["item_1"].is_error
    assert results["item_4"].is_error
    assert results["item_4"].text == "1 failed, 3 passed\n\n[exit code 1]"
    assert results["item_5"].text == "Fixtures are functions..."
    assert results["item_6"].is_error
    notes = [n.text for n in of(events, "note")]
    assert notes == [
        "codex: model rerouted: gpt-5-codex -> gpt-5 (HighRiskCyberActivity)",
        "codex plan: [x] Fix the bug; [x] Run the tests",
    ]
    assert [m.text for m in of(events, "message")] == ["Fixed src/app.py; one test still fails."]
    result = events[-1]
    assert result.kind == "result"
    assert result.usage == Usage(prompt_tokens=24763, completion_tokens=122, cached_tokens=24448)
    assert result.text == "Fixed src/app.py; one test still fails."
    assert result.turns == 1


def test_codex_stream_tally() -> None:
    summary = tally(parse("codex", sample("codex.jsonl")))

    assert summary.session_id == CODEX_THREAD
    assert summary.turns == 1
    assert summary.usage == Usage(24763, 122, 24448)
    assert summary.files == ["src/app.py", "tests/test_app.py"]  # not the failed change
    assert summary.last_message == summary.result_text == "Fixed src/app.py; one test still fails."
    assert summary.succeeded is True
    assert summary.tool_signatures[0] == 'command_execution:{"command":"bash -lc ls"}'


def test_codex_failed_turn() -> None:
    events = parse("codex", sample("codex_failed.jsonl"))
    summary = tally(events)

    assert [e.kind for e in events] == ["session", "error", "error", "result"]
    assert summary.session_id == "0199a214-0000-7000-8000-000000000001"
    assert summary.succeeded is False
    assert summary.error == "stream disconnected before completion: error sending request"
    assert summary.usage == Usage()


def test_codex_retry_error_then_success_ends_succeeded() -> None:
    lines = [
        {"type": "thread.started", "thread_id": "t"},
        {"type": "turn.started"},
        {"type": "error", "message": "Reconnecting... 1/5"},
        {
            "type": "turn.completed",
            "usage": {"input_tokens": 10, "cached_input_tokens": 0, "output_tokens": 2},
        },
    ]
    summary = tally(parse("codex", "\n".join(json.dumps(x) for x in lines).encode()))
    assert summary.succeeded is True
    assert summary.error == "Reconnecting... 1/5"  # what went wrong on the way
    assert summary.usage == Usage(10, 2, 0)


# ---------------------------------------------------------------------------------- framing


@pytest.mark.parametrize(("harness", "name"), ALL)
def test_any_chunking_gives_the_same_events(harness: str, name: str) -> None:
    data = sample(name)
    whole = parse(harness, data)
    assert parse(harness, data, [1] * len(data)) == whole
    rng = random.Random(name)
    for _ in range(25):
        sizes = [rng.randint(1, 300) for _ in range(len(data) // 50 + 1)]
        assert parse(harness, data, sizes) == whole


@pytest.mark.parametrize(("harness", "name"), ALL)
def test_output_without_a_final_newline_is_parsed_at_finish(harness: str, name: str) -> None:
    data = sample(name)
    assert parse(harness, data.rstrip(b"\n")) == parse(harness, data)
    parser = parser_for(harness)
    fed = parser.feed(data.rstrip(b"\n"))
    assert fed != parse(harness, data)  # the last line waits for its end
    assert fed + parser.finish() == parse(harness, data)


@pytest.mark.parametrize(("harness", "name"), ALL)
def test_stray_stderr_lines_and_garbage_become_notes_and_change_nothing_else(
    harness: str, name: str
) -> None:
    junk = [
        b"Reading additional input from stdin...",
        b"\x1b[33mWarning:\x1b[0m deprecated flag",
        b"{not json at all",
        b'{"type": "assistant", "message": ',  # a line cut short
        b"[1, 2, 3]",
        b"42",
        b"\xff\xfe invalid utf-8 \xc3",
        b"   ",
        b"",
        b'{"no_type": true}',
        b"\r",
    ]
    lines = sample(name).splitlines()
    mixed: list[bytes] = []
    for i, line in enumerate(lines):
        mixed.append(junk[i % len(junk)])
        mixed.append(line + (b"\r" if i % 2 else b""))  # CRLF endings too
    mixed += junk

    events = parse(harness, b"\n".join(mixed), [7] * 200)

    clean = parse(harness, sample(name))
    assert [e for e in events if e.kind != "note"] == [e for e in clean if e.kind != "note"]
    notes = [e.text for e in events if e.kind == "note" and e not in clean]
    assert "Reading additional input from stdin..." in notes
    assert any(n.startswith("malformed JSON: {not json") for n in notes)
    assert "[1, 2, 3]" in notes
    assert any("invalid utf-8" in n for n in notes)


@pytest.mark.parametrize("harness", ["qwen", "claude", "codex"])
def test_an_over_long_line_is_dropped_with_one_note_and_parsing_goes_on(harness: str) -> None:
    data = sample(f"{harness}.jsonl")
    lines = data.splitlines(keepends=True)
    huge = b'{"type":"assistant","message":{"content":[{"type":"text","text":"' + b"x" * (3 << 20)
    stream = b"".join(lines[:2]) + huge + b'"}]}}\n' + b"".join(lines[2:])

    parser = parser_for(harness)
    events: list[HarnessEvent] = []
    for at in range(0, len(stream), 64 << 10):
        events += parser.feed(stream[at : at + (64 << 10)])
    events += parser.finish()

    dropped = [e for e in events if e.kind == "note" and "dropped a line" in e.text]
    assert len(dropped) == 1
    assert dropped[0].text == "dropped a line over 1048576 bytes"
    assert [e for e in events if e not in dropped] == parse(harness, data)


def test_a_line_at_the_cap_is_kept_and_one_byte_more_is_dropped() -> None:
    line = json.dumps({"type": "turn.failed", "error": {"message": "x" * 50}}).encode()
    at_cap = parser_for("codex", max_line_bytes=len(line))
    assert [e.kind for e in at_cap.feed(line + b"\n")] == ["result"]
    over = parser_for("codex", max_line_bytes=len(line) - 1)
    assert [e.text for e in over.feed(line + b"\n") + over.finish()] == [
        f"dropped a line over {len(line) - 1} bytes"
    ]
    unterminated = parser_for("codex", max_line_bytes=len(line) - 1)
    assert [e.kind for e in unterminated.feed(line) + unterminated.finish()] == ["note"]


def test_texts_from_the_stream_are_capped() -> None:
    big = "y" * 200_000
    lines = [
        {"type": "system", "subtype": "init", "session_id": "s" * 10_000},
        {
            "type": "assistant",
            "message": {
                "content": [
                    {"type": "text", "text": big},
                    {
                        "type": "tool_use",
                        "id": "t1",
                        "name": "Write",
                        "input": {
                            "file_path": "a",
                            "content": big,
                            "list": list(range(5000)),
                            "deep": _nested(50),
                        },
                    },
                ]
            },
        },
        {
            "type": "user",
            "message": {"content": [{"type": "tool_result", "tool_use_id": "t1", "content": big}]},
        },
        {"type": "result", "subtype": "success", "result": big, "session_id": "s" * 10_000},
    ]
    events = parse("claude", "\n".join(json.dumps(x) for x in lines).encode())

    for event in events:
        assert len(event.text) < 17_000
        assert len(event.session_id or "") < 600
        assert len(json.dumps(event.arguments)) < 20_000
    call = of(events, "tool_call")[0]
    assert call.arguments["content"].endswith("more characters]")
    assert call.files == ("a",)
    assert len(call.arguments["list"]) == 201


def _nested(depth: int) -> object:
    value: object = "bottom"
    for _ in range(depth):
        value = {"d": value}
    return value


@pytest.mark.parametrize(("harness", "name"), ALL)
def test_fields_of_the_wrong_type_never_make_a_parser_raise(harness: str, name: str) -> None:
    # A harness is a model-driven program on a device: any field may hold anything.
    rng = random.Random(f"fuzz-{name}")
    odd: list[object] = [
        None,
        0,
        -5,
        1.5,
        float("inf"),
        True,
        "",
        "x",
        [],
        [1, "a", None],
        {},
        {"a": []},
    ]
    objects = [json.loads(line) for line in sample(name).splitlines()]

    def mutate(value: object) -> object:
        if isinstance(value, dict):
            return {
                k: (rng.choice(odd) if rng.random() < 0.3 else mutate(v)) for k, v in value.items()
            }
        if isinstance(value, list):
            return [rng.choice(odd) if rng.random() < 0.3 else mutate(v) for v in value]
        return value

    for _ in range(60):
        mutated = [mutate(obj) for obj in objects]
        data = "\n".join(json.dumps(obj) for obj in mutated).encode()
        events = parse(harness, data, [rng.randint(1, 97) for _ in range(40)])
        assert all(isinstance(e, HarnessEvent) for e in events)
        tally(events)  # and the tally takes whatever the parser made


def test_deeply_nested_json_is_a_note_not_a_crash() -> None:
    events = parse("codex", b'{"a":' * 100_000 + b"1" + b"}" * 100_000)
    assert [e.kind for e in events] == ["note"]


def test_unknown_event_types_are_noted_once_and_skipped() -> None:
    lines = [
        {"type": "thread.started", "thread_id": "t"},
        {"type": "thread.forked", "x": 1},
        {"type": "thread.forked", "x": 2},
        {"type": "item.completed", "item": {"id": "i", "type": "hologram"}},
        {"type": "item.completed", "item": {"id": "i", "type": "reasoning", "text": "hm"}},
        {"type": "item.plan.delta", "item_id": "i", "delta": "x"},
    ]
    events = parse("codex", "\n".join(json.dumps(x) for x in lines).encode())
    assert [(e.kind, e.text) for e in events] == [
        ("session", ""),
        ("note", "codex: skipped event type 'thread.forked'"),
        ("note", "codex: skipped item type 'hologram'"),
    ]
    qwen = [{"type": "stream_event", "event": {}}, {"type": "hook_event"}, {"type": "hook_event"}]
    events = parse("qwen", "\n".join(json.dumps(x) for x in qwen).encode())
    assert [e.text for e in events] == ["qwen: skipped event type 'hook_event'"]


# ---------------------------------------------------------------------------------- API


def test_parser_for_knows_three_harnesses_and_refuses_others_clearly() -> None:
    for harness in ("qwen", "claude", "codex"):
        assert parser_for(harness) is not parser_for(harness)  # one parser per run
    with pytest.raises(
        ValueError, match=r"unknown harness 'aider': expected one of claude, codex, qwen"
    ):
        parser_for("aider")


def test_tool_signatures_are_equal_for_identical_calls_and_differ_otherwise() -> None:
    def call(tool: str, arguments: dict[str, object]) -> HarnessEvent:
        return HarnessEvent("tool_call", tool=tool, arguments=arguments)

    summary = Tally()
    summary.add(call("Bash", {"command": "pytest", "timeout": 60}))
    summary.add(call("Bash", {"timeout": 60, "command": "pytest"}))  # same call, keys reordered
    summary.add(call("Bash", {"command": "pytest -x", "timeout": 60}))
    summary.add(call("Read", {"command": "pytest", "timeout": 60}))
    summary.add(call("Write", {"content": "a" * 5000}))
    summary.add(call("Write", {"content": "a" * 5000}))
    summary.add(call("Write", {"content": "a" * 4999 + "b"}))

    sigs = summary.tool_signatures
    assert sigs[0] == sigs[1] == 'Bash:{"command":"pytest","timeout":60}'
    assert len({sigs[1], sigs[2], sigs[3]}) == 3
    assert sigs[4] == sigs[5]
    assert sigs[5] != sigs[6]
    assert sigs[4].startswith("Write:sha256:")  # long arguments are hashed
    assert all(s.split(":", 1)[0] in ("Bash", "Read", "Write") for s in sigs)


def test_repeated_call_counts_the_same_call_in_a_row() -> None:
    summary = Tally()
    assert summary.repeated_call() is None
    for command in ["ls", "make", "make", "make"]:
        summary.add(HarnessEvent("tool_call", tool="Bash", arguments={"command": command}))
    assert summary.repeated_call() == ('Bash:{"command":"make"}', 3)


def test_the_model_a_run_names_prices_it_when_the_harness_reports_no_cost() -> None:
    """Qwen Code (like Claude Code) names its model when it starts but, unlike Claude Code,
    reports no cost: its tokens are priced at that model's rates, cache reads at the cached
    rate. A cost the harness reports is kept as reported."""
    qwen = tally(parse("qwen", sample("qwen.jsonl")))
    assert qwen.model == "fake"
    book = PriceBook(
        {
            "fake": LlmPrices(
                input_usd_per_mtok=2.0, cached_usd_per_mtok=0.5, output_usd_per_mtok=10.0
            )
        }
    )
    expected = (
        Decimal("2.0") * (95785 - 76288) + Decimal("0.5") * 76288 + Decimal("10.0") * 88
    ) / 1_000_000
    assert priced(qwen, book) == expected
    claude = tally(parse("claude", sample("claude.jsonl")))
    assert claude.model == "claude-sonnet-4-5"
    assert priced(claude, book) == Decimal("0.0321")  # its own total_cost_usd
    codex = tally(parse("codex", sample("codex.jsonl")))
    assert codex.model is None
    assert priced(codex, book) is None  # no model named, no cost reported: tokens only
