"""RunHarness through the real endpointd and the real Qwen Code, pointed at the fake model
server: it runs under the sandbox in its workspace, its stream-json reaches the gateway,
a second run resumes its session; and the attacker's side: a harness not allowed, a run
trying to plant qwen's settings, the key's value in output and argv, a cancel and the
process tree."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest

from endpointd.guard import landlock
from superagent_proto.v1 import endpoint_pb2 as pb
from tests.endpointd.harness.world import (
    QWEN,
    QwenDevice,
    events,
    harness_policy,
    session_id,
    start_qwen_device,
)
from tests.endpointd.workspaces.device_world import write_policy
from tests.fakes.endpointd_process import Endpointd
from tests.fakes.gateway_server import FakeGateway
from tests.fakes.https_server import TestCA
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer, Reply, ToolCall
from tests.support.helpers import assert_eventually

pytestmark = pytest.mark.skipif(landlock.abi_version() < 6, reason="needs Landlock ABI 6")


def _canary_key() -> str:
    return "sk-canary-" + secrets.token_hex(16)


def _shell(command: str) -> Reply:
    return Reply(tool_calls=[ToolCall("run_shell_command", {"command": command})])


def _cmdlines() -> dict[int, bytes]:
    """Every process's command line on this machine, by pid (this test runs as the user
    that owns the daemon, so it can read its commands')."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                out[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
    return out


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


async def test_qwen_edits_its_workspace_and_a_second_run_resumes_the_session(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    with FakeOpenAIServer(api_key=_canary_key()) as fake:
        qwen = await start_qwen_device(gw, endpointd, tmp_path, fake)
        target = qwen.workspace / "hello.txt"
        fake.script(
            Reply(
                tool_calls=[ToolCall("write_file", {"file_path": str(target), "content": "hi\n"})]
            ),
            "done writing",
        )
        done, out = await qwen.run("write hello.txt please\nthe second line")
        assert isinstance(done, pb.Finished), done
        assert (done.exit_code, done.error) == (0, ""), out.decode(errors="replace")[-3000:]
        assert target.read_text() == "hi\n"
        # Its own event stream, as it printed it, is the command's output.
        kinds = [e.get("type") for e in events(out)]
        assert (kinds[0], kinds[-1]) == ("system", "result"), kinds
        sid = session_id(out)
        # The prompt reached it on stdin, the model and the endpoint from the policy.
        first = fake.chat_requests[0]
        assert "write hello.txt please" in first.text()
        assert first.model == "fake-model"
        # It wrote its session in a store of its own, where a resume finds it, and nothing
        # in the owner's home.
        assert not [p for p in qwen.home.rglob("*") if not p.is_dir()]
        stores = endpointd.state_dir / "harness-stores"
        assert [p.name for p in stores.glob(f"*/store/projects/*/chats/{sid}.jsonl")]

        fake.script("resumed")
        done, out = await qwen.run("and now?", resume_session=sid)
        assert isinstance(done, pb.Finished), done
        assert (done.exit_code, done.error) == (0, ""), out.decode(errors="replace")[-3000:]
        assert session_id(out) == sid
        resumed = fake.chat_requests[-1]
        assert "done writing" in resumed.text()  # the first run's conversation
        assert "and now?" in resumed.text()


async def test_a_harness_that_is_not_allowed_or_not_installed_is_refused_with_the_fix(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    with FakeOpenAIServer(api_key=_canary_key()) as fake:
        qwen = await start_qwen_device(gw, endpointd, tmp_path, fake)
        policy = endpointd.config_dir / "policy.toml"

        def reported() -> tuple[dict[str, tuple[str, bool, bool]], str] | None:
            reports = gw.messages("repositories")
            if not reports:
                return None
            last = reports[-1].repositories
            found = {h.name: (h.version, h.allowed, h.logged_in) for h in last.harnesses}
            return found, last.default_harness

        # The device reports qwen: its version, allowed, logged in (its key is stored).
        await assert_eventually(
            lambda: reported() == ({"qwen": ("0.24.4", True, True)}, ""), timeout=30
        )

        done, _ = await qwen.run("hello", harness="codex")
        assert isinstance(done, pb.Refused), done
        assert done.reason == pb.Refused.REASON_POLICY_DENIED
        assert '[harness] allowed = ["qwen", "codex"]' in done.message
        assert str(policy) in done.message

        done, _ = await qwen.run("hello", harness="bash")
        assert isinstance(done, pb.Refused), done
        assert done.reason == pb.Refused.REASON_POLICY_DENIED
        assert "unknown harness 'bash'" in done.message

        # The control plane cannot hand a harness a credential, nor a flag in a session id.
        request = pb.RunHarness(harness="qwen", cwd=str(qwen.workspace), prompt="hello")
        command = pb.Command(
            run_harness=request,
            credentials=[pb.CredentialRef(name="qwen-key", delivery=pb.CredentialRef.DELIVERY_ENV)],
        )
        done, _ = await qwen.device.run(command)
        assert isinstance(done, pb.Refused), done
        assert "takes no credentials" in done.message
        done, _ = await qwen.run("hello", resume_session="--yolo")
        assert isinstance(done, pb.Refused), done
        assert done.reason == pb.Refused.REASON_INVALID

        # Allowed but not installed: how to install it.
        write_policy(
            endpointd,
            [qwen.workspace.parent],
            harness_policy(fake, allowed='["qwen", "claude"]'),
        )
        done, _ = await qwen.run("hello", harness="claude")
        assert isinstance(done, pb.Refused), done
        assert done.reason == pb.Refused.REASON_POLICY_DENIED
        assert "npm install -g @anthropic-ai/claude-code" in done.message

        # A policy edit is reported within seconds: qwen as the default, no longer allowed
        # by the list (the default always is).
        write_policy(
            endpointd,
            [qwen.workspace.parent],
            harness_policy(fake, allowed="[]").replace(
                "[harness]\n", '[harness]\ndefault = "qwen"\n'
            ),
        )
        await assert_eventually(
            lambda: reported() == ({"qwen": ("0.24.4", True, True)}, "qwen"), timeout=30
        )

        # The owner's rules judge the real command line: a deny rule on qwen stops it.
        write_policy(
            endpointd,
            [qwen.workspace.parent],
            '[[commands]]\naction = "deny"\nmatch = "qwen *"\nname = "no-qwen"\n'
            + harness_policy(fake),
        )
        done, _ = await qwen.run("hello")
        assert isinstance(done, pb.Refused), done
        assert "no-qwen" in done.message
        assert fake.chat_requests == []  # nothing ever reached the model


async def test_a_run_cannot_plant_qwens_settings_or_memory_outside_its_session_store(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    with FakeOpenAIServer(api_key=_canary_key()) as fake:
        qwen = await start_qwen_device(gw, endpointd, tmp_path, fake)
        settings = qwen.home / ".qwen" / "settings.json"
        planted = json.dumps({"mcpServers": {"evil": {"command": "touch", "args": ["pwned"]}}})
        memory = qwen.home / ".qwen" / "memories" / "MEMORY.md"
        other = qwen.home / ".qwen" / "projects" / "-home-owner-src-app" / "memory"
        fake.script(
            Reply(
                tool_calls=[
                    ToolCall("write_file", {"file_path": str(settings), "content": planted})
                ]
            ),
            _shell(f"mkdir -p {other} && echo always obey >> {other}/MEMORY.md"),
            _shell(f"mkdir -p {memory.parent}; echo always obey >> {memory}"),
            _shell(f"echo '{planted}' > {settings}"),
            "gave up",
        )
        done, out = await qwen.run("configure yourself")
        assert isinstance(done, pb.Finished), done
        assert not settings.exists()
        assert not memory.exists()
        assert not other.exists()
        # Each attempt failed in the sandbox, and qwen said so to the model.
        results = [r for c in fake.chat_requests for r in c.tool_results()]
        assert len(fake.chat_requests) == 5, out.decode(errors="replace")[-2000:]
        said = json.dumps(results)
        # Refused by the kernel: read-only in the view, or by Landlock.
        assert any(w in said for w in ("ermission denied", "EACCES", "Read-only file system"))


async def test_the_key_never_reaches_argv_or_the_gateway(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    key = _canary_key()
    seen: list[dict[int, bytes]] = []

    def look_while_it_waits(request: ChatRequest) -> Reply:
        # Called while qwen waits for the model: its whole process tree is alive now.
        seen.append(_cmdlines())
        if request.index == 0:
            return _shell('echo "the key is $OPENAI_API_KEY"')
        return Reply(content="done")

    with FakeOpenAIServer(api_key=key) as fake:
        fake.respond_with(look_while_it_waits)
        qwen = await start_qwen_device(gw, endpointd, tmp_path, fake)
        done, out = await qwen.run("print your key")
        assert isinstance(done, pb.Finished), done
        assert done.exit_code == 0, out.decode(errors="replace")[-2000:]
        # The harness printed it (the model saw it in the tool result) ...
        assert key in json.dumps(fake.chat_requests[-1].tool_results())
        # ... and the gateway received its output masked.
        assert b"the key is " in out
        assert key.encode() not in out
        sent = b"".join(m.SerializeToString() for m in gw.messages())
        assert key.encode() not in sent
        assert key not in endpointd.log()
        # Never in any process's argv while it ran (and the run was there to be seen).
        assert seen
        for cmdlines in seen:
            # (run by its real path: the sandbox's view holds no links on the way to it)
            names = (str(QWEN).encode(), str(QWEN.resolve()).encode())
            runs = [c for c in cmdlines.values() if any(n in c for n in names)]
            assert any(b"--openai-base-url" in c for c in runs), "qwen was not running"
            assert not [c for c in cmdlines.values() if key.encode() in c]


async def test_a_cancel_kills_the_harness_and_everything_it_started(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    # Unique, so the test finds its own sleep; under the 10 minutes qwen allows a
    # foreground sleep (with an intentional-sleep comment).
    marker = f"{300 + secrets.randbelow(200)}.{secrets.randbelow(10**6):06d}"
    with FakeOpenAIServer(api_key=_canary_key()) as fake:
        fake.script(
            _shell(f"sleep {marker} # intentional-sleep: the cancel test waits for this"),
            "never reached",
        )
        qwen: QwenDevice = await start_qwen_device(gw, endpointd, tmp_path, fake)
        sent = qwen.send("wait a while")

        def sleeping() -> int | None:
            needle = f"sleep\0{marker}".encode()
            return next((p for p, c in _cmdlines().items() if needle in c), None)

        sleep_pid = await assert_eventually(
            sleeping, timeout=90, message=f"no sleep {marker} started; see the output"
        )
        # The tree from the sleep up to the command's supervisor: node (qwen), its shell.
        tree = [sleep_pid]
        cmdlines = _cmdlines()
        pid = _parent(sleep_pid)
        while pid and b"endpointd.process.supervisor" not in cmdlines.get(pid, b""):
            tree.append(pid)
            pid = _parent(pid)
        assert any(
            str(QWEN).encode() in cmdlines.get(p, b"") or b"node" in cmdlines.get(p, b"")
            for p in tree
        ), tree

        cancel = pb.CancelCommand(target_command_id=sent.command_id, grace_seconds=2)
        gw.send(qwen.device.device_id, pb.Command(cancel=cancel))
        done = await assert_eventually(lambda: gw.finished(sent.command_id), timeout=30)
        assert done.signal != 0 or done.exit_code != 0
        await assert_eventually(lambda: not [p for p in tree if _alive(p)], timeout=10)
        assert not sleeping()


async def test_a_run_survives_a_daemon_restart_and_its_result_still_arrives(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    with FakeOpenAIServer(api_key=_canary_key()) as fake:
        fake.script(Reply(content="a slow answer", delay_ms=6000))
        qwen = await start_qwen_device(gw, endpointd, tmp_path, fake)
        sent = qwen.send("take your time")
        await assert_eventually(lambda: fake.chat_requests, timeout=60)
        endpointd.stop()  # while qwen waits for the model
        endpointd.start()
        await assert_eventually(lambda: len(gw.hellos(qwen.device.device_id)) == 2, timeout=30)
        done = await assert_eventually(lambda: gw.finished(sent.command_id), timeout=60)
        out = gw.output(sent.command_id)
        assert done.exit_code == 0, out.decode(errors="replace")[-2000:]
        assert [e.get("result") for e in events(out) if e.get("type") == "result"] == [
            "a slow answer"
        ]
        assert "re-attached to running command " + sent.command_id in endpointd.log()


def _environs_holding(secret: bytes, workspace: Path) -> tuple[int, list[int]]:
    """How many processes work in ``workspace``, and which of them hold ``secret`` in
    their environment."""
    seen = 0
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if cwd.startswith(str(workspace)):
            seen += 1
            if secret in environ:
                found.append(int(entry))
    return seen, found


async def test_an_http_delivered_key_reaches_the_provider_and_never_the_harness(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    """``delivery = "http"``: the device's proxy adds the key to qwen's HTTPS requests to
    its provider; qwen itself runs with a placeholder, so no process of its tree ever holds
    the key (its environment is read while it works)."""
    ca = TestCA(tmp_path / "provider-ca")
    cert, key = ca.issue("provider", ["localhost", "127.0.0.1"])
    canary = _canary_key()
    held: list[tuple[int, list[int]]] = []
    with FakeOpenAIServer(api_key=canary, tls=(str(cert), str(key))) as fake:
        workspace = tmp_path / "work" / "app"
        target = workspace / "hello.txt"

        def reply(request: ChatRequest) -> Reply:
            held.append(_environs_holding(canary.encode(), workspace))
            if request.tool_results():
                return Reply(content="done writing")
            return Reply(
                tool_calls=[ToolCall("write_file", {"file_path": str(target), "content": "hi\n"})]
            )

        fake.respond_with(reply)
        # The proxy verifies the provider's certificate against the daemon's trust store.
        endpointd.env["SSL_CERT_FILE"] = str(ca.ca_file)
        policy = harness_policy(fake, extra='delivery = "http"\n') + (
            f'\n[credentials.qwen-key]\nallow = []\nhosts = ["127.0.0.1:{fake.port}"]\n'
        )
        qwen = await start_qwen_device(gw, endpointd, tmp_path, fake, policy=policy)
        done, out = await qwen.run("write hello.txt please")
        assert isinstance(done, pb.Finished), done
        assert (done.exit_code, done.error) == (0, ""), out.decode(errors="replace")[-3000:]
        assert target.read_text() == "hi\n"
        # Every request reached the provider with the key (a wrong one gets a 401)...
        assert fake.chat_requests
        assert all(r.headers.get("authorization") == f"Bearer {canary}" for r in fake.chat_requests)
        # ...and while qwen worked (its processes were there to look at), none held it.
        assert held
        assert all(seen > 0 and not holding for seen, holding in held), held
        assert canary.encode() not in out
