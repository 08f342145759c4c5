"""Records ``qwen.jsonl``: a real Qwen Code ``--output-format stream-json`` run (test tooling).

Run by hand when the installed qwen changes (``.venv/bin/python -m
tests.controlplane.workers.harness.samples.record_qwen``); the tests read the recorded file
and never run qwen. The model is ``tests/fakes/openai_server.FakeOpenAIServer``, scripted to
write a file, edit it, run a shell command, make a call qwen refuses (a wrong argument
name), and answer. ``qwen_no_auth.jsonl`` was recorded the same way without
``--auth-type openai``. The run happens in a temporary directory with a temporary HOME;
their paths are replaced (the workspace by ``/workspace``), so nothing of this machine is
recorded, and the fake's API key is a placeholder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer, Reply, ToolCall

QWEN = Path(__file__).resolve().parents[5] / ".tools/harnesses/node_modules/.bin/qwen"
OUT = Path(__file__).with_name("qwen.jsonl")
WORKSPACE = "/workspace"


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp, "ws")
        home = Path(tmp, "home")
        work.mkdir()
        home.mkdir()
        work = work.resolve()
        target = str(work / "hello.txt")
        steps: list[Reply | str] = [
            Reply(
                content="I'll write the file.",
                tool_calls=[ToolCall("write_file", {"file_path": target, "content": "hello\n"})],
            ),
            Reply(
                tool_calls=[
                    ToolCall(
                        "edit",
                        {"file_path": target, "old_string": "hello", "new_string": "hello world"},
                    )
                ]
            ),
            Reply(tool_calls=[ToolCall("run_shell_command", {"command": "cat hello.txt"})]),
            Reply(tool_calls=[ToolCall("read_file", {"absolute_path": str(work / "missing.txt")})]),
            "Done: hello.txt says hello world.",
        ]

        def reply(request: ChatRequest) -> Reply | str:
            if not request.tools:  # a side query qwen makes (titles, next speaker, ...)
                return '{"reasoning": "done", "next_speaker": "user"}'
            done = len(request.tool_results())
            return steps[min(done, len(steps) - 1)]

        with FakeOpenAIServer(api_key="x", models=["fake"]) as fake:
            fake.respond_with(reply)
            env = {
                "PATH": os.environ["PATH"],
                "HOME": str(home),
                "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
                "NO_COLOR": "1",
            }
            argv = [str(QWEN), "--output-format", "stream-json", "--approval-mode", "yolo"]
            argv += [
                "--auth-type",
                "openai",
                "-m",
                "fake",
                "--openai-base-url",
                fake.url,
                "--openai-api-key",
                "x",
            ]
            argv += ["write hello.txt"]
            done = subprocess.run(
                argv, cwd=work, env=env, capture_output=True, timeout=300, check=False
            )
        out = done.stdout.decode().replace(str(work), WORKSPACE).replace(str(home), "/home")
        out = out.replace(tmp, "<tmp>")
        OUT.write_text(out)
        if done.returncode:
            print(f"qwen exited {done.returncode}: {done.stderr.decode()[-3000:]}", file=sys.stderr)
        return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
