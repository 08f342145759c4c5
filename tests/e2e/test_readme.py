"""README.md's "Your first ticket in five minutes", run command by command as a new user would.

Every command of the section's ``sh`` blocks runs, in order, in bash, from a clean copy of
the repository, with a home directory of its own and a PATH with nothing of this project on
it: the programs come from the fresh venv the README's first command makes, installed
offline from the wheelhouse `scripts/bootstrap` keeps (the wheels of every dependency).
Where a user would type something of their own, the test does instead, and only there:

* ``export OPENAI_BASE_URL=… OPENAI_API_KEY=…`` points at the fake OpenAI server, which
  plays the router and the worker;
* a command ending in ``&`` runs in the background, and the next one waits until the
  control plane it started answers and, with ``--device``, until it says this machine is
  a device (a user waits for those lines);
* ``kill %1`` stops that background job as Ctrl-C would.

The machine has no OS keyring (most CI boxes and containers do not), so `up --device` keeps
the device key in a 0600 file.
"""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer, Reply, ToolCall
from tests.support.distributions import WHEELHOUSE, clean_environment, copy_sources
from tests.support.e2e_world import pending, router_lines
from tests.support.helpers import free_port

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Your first ticket in five minutes"
COMMIT = "Add CONTRIBUTORS"
DEVICE_READY = "This machine is now device"  # what `up --device` says once it has paired


def section_commands() -> list[str]:
    """The section's commands, in order: every line of its sh blocks but comments."""
    body = README.read_text(encoding="utf-8").split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", body, re.S)
    return [
        line.strip()
        for block in blocks
        for line in block.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


class Shell:
    """bash, one README line at a time, carrying the environment from line to line."""

    def __init__(self, env: dict[str, str], cwd: Path, logs: Path, fake: FakeOpenAIServer):
        self.env = env
        self.cwd = cwd
        self.logs = logs
        self.fake = fake
        self.jobs: list[subprocess.Popen[bytes]] = []
        self.started = 0  # background jobs so far, each with a log of its own
        self.outputs: dict[str, str] = {}

    def run(self, line: str) -> None:
        if line == "kill %1":
            self.stop_jobs()
        elif line.endswith("&"):
            self.background(line[:-1].strip())
        else:
            self.foreground(line)

    def foreground(self, line: str) -> None:
        env_file = self.logs / "env"
        script = f"{line}\nstatus=$?\nenv -0 > {shlex.quote(str(env_file))}\nexit $status\n"
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, (
            f"`{line}` exited {done.returncode}:\n{done.stdout}{done.stderr}"
        )
        self.outputs[line] = done.stdout
        entries = env_file.read_bytes().split(b"\0")
        self.env = dict(e.decode().split("=", 1) for e in entries if b"=" in e)
        if line.startswith("export ") and "OPENAI_BASE_URL" in self.env:
            # The one thing a reader types of their own: their model endpoint and key.
            self.env["OPENAI_BASE_URL"] = self.fake.url
            self.env["OPENAI_API_KEY"] = self.fake.api_key or ""

    def background(self, line: str) -> None:
        self.started += 1
        with (self.logs / f"job-{self.started}.log").open("wb") as out:
            job = subprocess.Popen(
                ["bash", "-c", f"exec {line}"],
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.jobs.append(job)
        url = f"http://127.0.0.1:{self.env['SUPERAGENT_HTTP__PORT']}/readyz"
        deadline = time.monotonic() + 180
        while True:
            assert job.poll() is None, f"`{line}` exited {job.returncode}:\n{self.job_log()}"
            try:
                # Answering comes first; pairing this machine as a device (slow on a loaded
                # machine) after it, and `say "/run laptop …"` needs the device paired.
                ready = httpx.get(url, timeout=2).status_code == 200
                if ready and ("--device" not in line or DEVICE_READY in self.job_log()):
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"`{line}` never became ready:\n{self.job_log()}"
            time.sleep(0.5)

    def job_log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.logs.glob("job-*.log")))

    def stop_jobs(self) -> None:
        for job in self.jobs:
            if job.poll() is None:
                job.send_signal(signal.SIGINT)
                try:
                    job.wait(30)
                except subprocess.TimeoutExpired:
                    job.kill()
                    job.wait(10)
                assert job.returncode == 0, self.job_log()
        self.jobs.clear()


class Models:
    """The fake endpoint's answers: the router makes a ticket of the request and relays the
    report; the worker writes the file, commits it, and reports."""

    def __init__(self, demo: Path) -> None:
        self.demo = demo

    def __call__(self, request: ChatRequest) -> Reply:
        if (request.system_prompt() or "").startswith("You are the router"):
            return self.route(request)
        return self.work(request)

    def route(self, request: ChatRequest) -> Reply:
        lines = router_lines(request)
        if lines is None:
            return Reply(content="done")
        calls: list[ToolCall] = []
        for thread, line in lines:
            if (found := re.search(r"\[(trg_\w+)\] explicit", line)) and "CONTRIBUTORS" in line:
                ticket = {
                    "title": "Add a CONTRIBUTORS file",
                    "scope": "a CONTRIBUTORS file listing Ada Lovelace, committed",
                    "threads": [thread],
                    "device": "laptop",
                    "mandate_from": found[1],
                    "workdir": str(self.demo),
                }
                calls.append(ToolCall("create_ticket", ticket))
            if "report.ready" in line:
                text = "Done: CONTRIBUTORS lists Ada Lovelace, committed on the ticket's branch."
                calls.append(ToolCall("reply", {"thread": thread, "text": text}))
        return Reply(tool_calls=calls) if calls else Reply(content="nothing to do")

    def work(self, request: ChatRequest) -> Reply:
        last = request.messages[-1]
        if last["role"] == "tool" and pending(str(last.get("content"))):
            return Reply(content="waiting for the job")
        finished = [
            m
            for m in request.messages[2:]
            if m.get("role") == "tool"
            and ('"exit_code"' in str(m["content"]) or '"created"' in str(m["content"]))
        ]
        finished += [
            m
            for m in request.messages[2:]
            if m.get("role") == "user" and '"type": "job_ended"' in str(m["content"])
        ]
        commit = (
            "git add CONTRIBUTORS && git -c user.name=Super-agent -c user.email=agent@example.com "
            f"commit -qm '{COMMIT}'"
        )
        steps = [
            ToolCall("create_file", {"path": "CONTRIBUTORS", "content": "Ada Lovelace\n"}),
            ToolCall("shell", {"command": commit}),
        ]
        if len(finished) < len(steps):
            return Reply(tool_calls=[steps[len(finished)]])
        report = {"status": "ready", "summary": "CONTRIBUTORS added and committed"}
        return Reply(tool_calls=[ToolCall("report", report)])


@pytest.fixture
def shell(tmp_path: Path, fake_llm: FakeOpenAIServer) -> Iterator[Shell]:
    if not (WHEELHOUSE / ".stamp").is_file():
        raise AssertionError(f"no wheelhouse at {WHEELHOUSE}: run scripts/bootstrap")
    home = tmp_path / "home"
    home.mkdir()
    # No ~/.gitconfig: git does not know who commits on a fresh machine, and the README's
    # own commit (and the agent's) once failed there ("Author identity unknown").
    # `python3` is this interpreter's base Python (not this venv), as on a fresh machine.
    tools = tmp_path / "tools"
    tools.mkdir()
    base_python = getattr(sys, "_base_executable", sys.executable)
    (tools / "python3").symlink_to(base_python)
    env = clean_environment()
    for name in list(env):
        if name.startswith(("SUPERAGENT_", "OPENAI_", "ENDPOINTD_", "DATABASE_URL", "XDG_")):
            del env[name]
    env.update(
        {
            "HOME": str(home),
            "PATH": f"{tools}:/usr/local/bin:/usr/bin:/bin",
            # Offline: pip finds every dependency, and the build backend, in the wheelhouse.
            "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": str(WHEELHOUSE),
            # Byte-compiling every installed module (lark-oapi alone has thousands) would
            # take minutes here; Python compiles what it imports anyway.
            "PIP_NO_COMPILE": "1",
            # Ports of its own (the defaults may be taken on a shared machine).
            "SUPERAGENT_HTTP__PORT": str(free_port()),
            "SUPERAGENT_GRPC__PORT": str(free_port()),
            "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring",
        }
    )
    clone = copy_sources(tmp_path / "clone")
    logs = tmp_path / "logs"
    logs.mkdir()
    fake_llm.respond_with(Models(home / "src" / "demo"))
    runner = Shell(env, clone, logs, fake_llm)
    try:
        yield runner
    finally:
        for job in runner.jobs:
            if job.poll() is None:
                job.kill()
                job.wait(10)


@pytest.mark.timeout(1200)
def test_your_first_ticket_in_five_minutes(shell: Shell, fake_llm: FakeOpenAIServer) -> None:
    commands = section_commands()
    for line in commands:
        shell.run(line)

    # No model yet: the command's own output came back to the terminal.
    (run_line,) = [c for c in commands if c.startswith("superagent say") and "/run" in c]
    assert "hello from the device" in shell.outputs[run_line]

    # With one: the request became a ticket, worked on its own branch, and said so.
    (ask,) = [c for c in commands if c.startswith("superagent say") and "CONTRIBUTORS" in c]
    assert "Done: CONTRIBUTORS lists Ada Lovelace" in shell.outputs[ask]
    log = next(c for c in commands if c.startswith("git -C ~/src/demo log"))
    assert COMMIT in shell.outputs[log]
    demo = Path(shell.env["HOME"]) / "src" / "demo"
    status = subprocess.run(
        ["git", "-C", str(demo), "status", "--porcelain"], capture_output=True, text=True
    )
    assert status.stdout == "", "the owner's checkout was touched"
    assert not (demo / "CONTRIBUTORS").exists()
    assert any(r.path == "/v1/chat/completions" for r in fake_llm.requests)
    shell.stop_jobs()
