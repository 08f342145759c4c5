"""The pieces of a world whose tickets a real Qwen Code works (test helper, and
bench/harness_overhead.py): the router's script, the harness's model script, the device
policy that allows qwen, its key in endpointd's keyring.

Qwen Code is installed by scripts/bootstrap into ``.tools/harnesses``; its model is a
``FakeOpenAIServer`` of its own (the harness's provider is the owner's, not the control
plane's), which accepts any key so the test can check which one arrived.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer, Reply, ToolCall
from tests.support.e2e_world import ALICE, DEVICE, REPO, World, router_lines

ROOT = Path(__file__).resolve().parents[2]
QWEN = ROOT / ".tools" / "harnesses" / "node_modules" / ".bin" / "qwen"
CALC = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = (
    "import unittest\n\nfrom calc import add\n\n\n"
    "class CalcTest(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
)
ALICE_USER = {"login": "alice", "id": ALICE, "type": "User"}
KEY_NAME = "qwen-key"
HARNESS_MODEL = "qwen-fake"
FINAL = "Fixed add() in calc.py; the tests pass."
SLOW_MS = 8000.0


def qwen() -> Path:
    assert QWEN.exists(), f"{QWEN} is missing: run scripts/bootstrap (it installs Qwen Code)"
    return QWEN


def repository_files(push_credential: str) -> dict[str, str]:
    """A repository whose test fails until add() is fixed, and whose config names its tests
    and its push credential."""
    config = (
        f"[push]\ncredential = {json.dumps(push_credential)}\n"
        f"[checks]\ntest = {json.dumps(sys.executable + ' -m unittest -q')}\n"
    )
    return {"calc.py": CALC, "test_calc.py": TESTS, ".superagent/config": config}


@dataclass
class Router:
    """The control plane's model: the router creates a ticket with harness=qwen for each
    "<what> with qwen" request; a worker model is never asked (recorded if it is)."""

    asked_worker: list[str] = field(default_factory=list)

    def __call__(self, request: ChatRequest) -> Reply:
        if not (request.system_prompt() or "").startswith("You are the router"):
            self.asked_worker.append(request.last_user_message() or "")
            return Reply(content="the built-in worker should not run here")
        lines = router_lines(request)
        if lines is None:
            return Reply(content="done")
        calls: list[ToolCall] = []
        for thread, line in lines:
            found = re.search(r"\[(trg_\w+)\] explicit issue_comment", line)
            if found and (
                what := re.search(r"(fix add\(\)|loop|sleep|slow)( \d+)? with qwen", line)
            ):
                calls.append(
                    ToolCall(
                        "create_ticket",
                        {
                            "title": f"Harness: {what[1]}{what[2] or ''}",
                            "scope": "make test_add pass; open a pull request",
                            "threads": [thread],
                            "device": DEVICE,
                            "mandate_from": found[1],
                            "harness": "qwen",
                        },
                    )
                )
        return Reply(tool_calls=calls) if calls else Reply(content="nothing to do")


@dataclass
class Harness:
    """Qwen Code's model: reads calc.py and writes the fix (plus a line on a follow-up;
    after a pause for "slow"); or loops on one command; or starts a long sleep."""

    runs: list[list[dict[str, Any]]] = field(default_factory=list)  # each request's messages
    keys: set[str] = field(default_factory=set)

    def __call__(self, request: ChatRequest) -> Reply:
        self.keys.add(request.headers.get("authorization", ""))
        if not request.tools:
            return Reply(content="ok")  # a side request (a summary, a check): not the work
        self.runs.append(request.messages)
        text = request.text()
        last = request.last_message() or {}
        if "Harness: loop" in text:
            return Reply(tool_calls=[ToolCall("run_shell_command", {"command": "ls"})])
        if "Harness: sleep" in text and last.get("role") != "tool":
            command = {"command": "sleep 300 & sleep 301; wait", "is_background": False}
            return Reply(tool_calls=[ToolCall("run_shell_command", command)])
        workspace = re.search(r"Workspace: (/\S+?),", text)
        assert workspace, text[:3000]
        path = f"{workspace[1]}/calc.py"
        done = _tool_results_since_instruction(request.messages)
        if done == 0:  # Qwen Code writes a file only after reading it in the session
            return Reply(tool_calls=[ToolCall("read_file", {"file_path": path})])
        if done == 1:
            follow_up = _last_instruction(request.messages).startswith("Follow-up")
            content = FIXED + "# reviewed\n" if follow_up else FIXED
            # "slow": time for a test to kill the control plane while the harness works.
            delay = SLOW_MS if "Harness: slow" in text else 0.0
            return Reply(
                tool_calls=[ToolCall("write_file", {"file_path": path, "content": content})],
                delay_ms=delay,
            )
        return Reply(content=FINAL)


def _tool_results_since_instruction(messages: list[dict[str, Any]]) -> int:
    count = 0
    for message in reversed(messages):
        if message.get("role") == "user":
            break
        count += message.get("role") == "tool"
    return count


def _last_instruction(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(str(part.get("text", "")) for part in content)
            text = str(content or "")
            if "Follow-up on ticket" in text:
                return text[text.index("Follow-up") :]
            if "Ticket tkt_" in text:
                return text[text.index("Ticket tkt_") :]
    return ""


def device_policy(harness_llm: FakeOpenAIServer) -> str:
    """The device's policy lines: qwen allowed, its model and endpoint, its key by name."""
    return (
        '\n[harness]\nallowed = ["qwen"]\n'
        f"[harness.qwen]\nprogram = {json.dumps(str(qwen()))}\n"
        f"model = {json.dumps(HARNESS_MODEL)}\n"
        f"base_url = {json.dumps(harness_llm.url)}\n"
        f"credential = {json.dumps(KEY_NAME)}\n"
    )


def store_key(world: World, value: str) -> None:
    """The harness's key in endpointd's keyring (before the daemon starts)."""
    done = subprocess.run(
        [sys.executable, "-m", "endpointd", "creds", "add", KEY_NAME],
        input=(value + "\n").encode(),
        capture_output=True,
        env=world.daemon.env,
        cwd=world.daemon.root,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()


def repository(*, private: bool = True) -> dict[str, Any]:
    return {"full_name": REPO, "name": "widgets", "owner": {"login": "acme"}, "private": private}


def comment(comment_id: int, body: str, issue: int = 1, *, private: bool = True) -> dict[str, Any]:
    """Alice's comment on issue ``issue``, as GitHub delivers it."""
    return {
        "action": "created",
        "issue": {
            "number": issue,
            "title": "add() is broken",
            "user": ALICE_USER,
            "state": "open",
            "html_url": f"https://github.com/{REPO}/issues/{issue}",
        },
        "comment": {"id": comment_id, "body": body, "user": ALICE_USER},
        "repository": repository(private=private),
        "sender": ALICE_USER,
    }
