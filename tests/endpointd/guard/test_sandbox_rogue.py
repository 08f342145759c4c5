"""A rogue control plane against the sandbox: what an allowed command still cannot do.

Each test pairs a real endpointd with a scripted gateway and sends the commands a
compromised control plane (or a worker talked into misbehaving) would: commands the policy
*allows*, whose harm is in what they do once running. The kernel stops them (Landlock,
seccomp), not a check on the command's text, so each attack is written the way a string
check would miss it: through a shell, a symlink, a transform of the secret.

Canaries are planted where the attack aims (an SSH key, the daemon's own environment, the
keyring file, another command's environment) and searched for in everything the gateway
received, in hex too, since `od` or `rev` defeats any masking.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from endpointd.guard import landlock
from superagent_proto.v1 import endpoint_pb2 as pb
from tests.fakes.endpointd_process import Endpointd, start_paired
from tests.fakes.gateway_server import FakeGateway
from tests.support.helpers import assert_eventually
from tests.support.listeners import Greeter

pytestmark = pytest.mark.skipif(landlock.abi_version() < 6, reason="needs Landlock ABI 6")

SSH_KEY = "ssh-canary-" + os.urandom(12).hex()
DAEMON_SECRET = "aws-canary-" + os.urandom(12).hex()
OTHER_SECRET = "other-command-canary-" + os.urandom(12).hex()
TOKEN_NAME = "deploy-token"
TOKEN = "keyring-canary-" + os.urandom(12).hex()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(SSH_KEY)
    (home / "notes.txt").write_text("readable")
    return home


@pytest.fixture
def endpointd(endpointd: Endpointd, tmp_path: Path) -> Endpointd:
    endpointd.env["AWS_SECRET_ACCESS_KEY"] = DAEMON_SECRET
    endpointd.use_file_keyring(tmp_path / "keyring-data")
    return endpointd


def _policy(work: Path, extra: str = "") -> str:
    return f"""
allowed_roots = [{json.dumps(str(work))}]
default_action = "allow"
{extra}

[credentials.{TOKEN_NAME}]
allow = ["git *"]
"""


async def _device(gw: FakeGateway, endpointd: Endpointd, tmp_path: Path, extra: str = "") -> str:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    device = await start_paired(gw, endpointd)
    policy_file = endpointd.config_dir / "policy.toml"
    policy_file.write_text(_policy(work, extra))
    policy_file.chmod(0o600)
    return device


def _sh(script: str, cwd: Path, env: dict[str, str] | None = None) -> pb.Command:
    return pb.Command(exec=pb.ExecCommand(argv=["sh", "-c", script], cwd=str(cwd), env=env or {}))


async def _run(gw: FakeGateway, device: str, command: pb.Command) -> tuple[pb.Finished, bytes]:
    sent = gw.send(device, command)
    ended = await assert_eventually(
        lambda: gw.refused(sent.command_id) or gw.finished(sent.command_id), timeout=30
    )
    assert isinstance(ended, pb.Finished), f"refused: {ended}"
    return ended, gw.output(sent.command_id)


async def _refused(gw: FakeGateway, device: str, command: pb.Command) -> pb.Refused:
    sent = gw.send(device, command)
    ended = await assert_eventually(
        lambda: gw.refused(sent.command_id) or gw.finished(sent.command_id), timeout=30
    )
    assert isinstance(ended, pb.Refused), f"not refused: {ended}"
    return ended


def _everything_sent(gw: FakeGateway) -> bytes:
    return b"".join(m.SerializeToString() for m in gw.messages())


def _nowhere(gw: FakeGateway, *secrets: str) -> None:
    """None of ``secrets`` reached the control plane: as is, reversed, or in hex (also as
    `od` prints it, spaced and wrapped)."""
    sent = _everything_sent(gw)
    squeezed = b"".join(sent.split())
    for secret in secrets:
        raw = secret.encode()
        for form in (raw, raw[::-1], raw.hex().encode(), raw.hex().encode()[::-1]):
            assert form not in sent, f"{secret} reached the control plane"
            assert form not in squeezed, f"{secret} reached the control plane (spaced)"


async def test_ssh_keys_are_unreadable_through_a_shell_and_a_symlink(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path, home: Path
) -> None:
    device = await _device(gw, endpointd, tmp_path)
    work = tmp_path / "work"
    # The argv check sees neither: `cd` with no argument, and a symlink made at run time.
    done, out = await _run(gw, device, _sh("cd && od -An -tx1 .ssh/id_rsa; cat notes.txt", work))
    assert b"readable" not in out, out  # nor the rest of home: it is not in view
    done, out = await _run(
        gw, device, _sh("ln -s / root && cat root" + str(home) + "/.ssh/id_rsa | rev", work)
    )
    # Not in view (the home directory is), or where it is, refused.
    assert b"No such file" in out or b"Permission denied" in out, out
    # Python, with the path assembled at run time.
    script = "import os; print(open(os.path.expanduser('~') + '/.s' + 'sh/id_rsa').read())"
    done, out = await _run(
        gw, device, pb.Command(exec=pb.ExecCommand(argv=["python3", "-c", script], cwd=str(work)))
    )
    assert done.exit_code != 0
    assert b"FileNotFoundError" in out or b"PermissionError" in out, out
    _nowhere(gw, SSH_KEY)


async def test_writes_land_only_in_the_workspace_and_its_tmpdir(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path, home: Path
) -> None:
    device = await _device(gw, endpointd, tmp_path)
    work = tmp_path / "work"
    outside = tmp_path / "outside"
    outside.mkdir()
    stray = Path(tempfile.gettempdir()) / f"endpointd-sandbox-{os.getpid()}"
    script = (
        f"ln -s {outside} escape; echo pwned > escape/file; "
        f"echo pwned >> {home}/.bashrc; echo pwned > {stray}; "
        'echo ok > "$TMPDIR/scratch" && cat "$TMPDIR/scratch"; echo made > inside.txt'
    )
    _, out = await _run(gw, device, _sh(script, work))
    assert not (outside / "file").exists()
    assert not (home / ".bashrc").exists()
    assert not stray.exists()
    assert b"ok\n" in out
    assert (work / "inside.txt").read_text() == "made\n"


def _hidden(path: Path) -> str:
    """Shell text that names ``path`` only once run (the argv check must not see it)."""
    return f"$(echo {str(path)[::-1]} | rev)"


async def test_the_policy_file_and_endpointds_state_cannot_be_written_or_read(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    device = await _device(gw, endpointd, tmp_path)
    work = tmp_path / "work"
    policy_file = endpointd.config_dir / "policy.toml"
    before = policy_file.read_bytes()
    approvals = endpointd.state_dir / "approvals"
    script = (
        f"P={_hidden(policy_file)}; A={_hidden(approvals)}; S={_hidden(endpointd.state_dir)}; "
        'printf \'\\n[[commands]]\\naction="allow"\\nmatch="*"\\n\' >> $P; '
        'mkdir -p $A; echo "{}" > $A/forged.json; '
        "cat $S/journal.sqlite3 | wc -c; ls $S/spool; echo done"
    )
    _, out = await _run(gw, device, _sh(script, work))
    assert b"done" in out, out
    assert policy_file.read_bytes() == before
    assert not (approvals / "forged.json").exists()
    assert b"Permission denied" in out


async def test_a_command_sees_neither_the_daemons_environment_nor_another_commands(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    device = await _device(gw, endpointd, tmp_path, '[env]\nallow = ["OTHER"]')
    work = tmp_path / "work"
    # Another command with a secret in its environment, still running.
    other = gw.send(device, _sh("sleep 30", work, env={"OTHER": OTHER_SECRET}))
    await assert_eventually(lambda: endpointd.spool_pids("child.pid"), timeout=20)
    # Its own environment is minimal; /proc/*/environ of the daemon and of the other
    # command are unreadable (Landlock's ptrace scoping), whatever the encoding.
    script = (
        "env | od -An -tx1; for p in /proc/[0-9]*; do od -An -tx1 $p/environ 2>/dev/null; "
        "done; echo scanned"
    )
    _, out = await _run(gw, device, _sh(script, work))
    assert b"scanned" in out
    _nowhere(gw, DAEMON_SECRET, OTHER_SECRET)
    # Nor may it signal the daemon or the other command.
    assert endpointd.proc is not None
    pgid = endpointd.spool_pids("child.pid")[0]
    _, out = await _run(
        gw, device, _sh(f"kill -TERM {endpointd.proc.pid}; kill -TERM -{pgid}; echo tried", work)
    )
    assert b"tried" in out
    assert endpointd.proc.poll() is None
    assert gw.finished(other.command_id) is None  # still running: not killed


def _store_token(endpointd: Endpointd) -> None:
    """``endpointd creds add`` the canary token (from stdin, as the owner would)."""
    added = subprocess.run(
        [sys.executable, "-m", "endpointd", "creds", "add", TOKEN_NAME],
        input=TOKEN,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tempfile.gettempdir(),
        env=endpointd.env,
    )
    assert added.returncode == 0, added.stderr


async def test_the_keyring_file_is_unreadable_from_python(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    device = await _device(gw, endpointd, tmp_path)
    _store_token(endpointd)
    data = tmp_path / "keyring-data"
    script = (
        "import os, binascii\n"
        f"os.environ['PYTHON_KEYRING_BACKEND'] = 'keyrings.alt.file.PlaintextKeyring'\n"
        f"os.environ['XDG_DATA_HOME'] = {str(data)!r}\n"
        "try:\n"
        "    import keyring\n"
        f"    v = keyring.get_password('superagent-endpointd', 'credential:{TOKEN_NAME}')\n"
        "    print('got', binascii.hexlify((v or '').encode()))\n"
        "except Exception as exc:\n"
        "    print('keyring failed', type(exc).__name__)\n"
        "for root, _, files in os.walk(os.environ['XDG_DATA_HOME']):\n"
        "    for f in files:\n"
        "        try:\n"
        "            print(binascii.hexlify(open(os.path.join(root, f), 'rb').read()))\n"
        "        except OSError as exc:\n"
        "            print('denied', type(exc).__name__)\n"
    )
    await _run(
        gw,
        device,
        pb.Command(
            exec=pb.ExecCommand(argv=[sys.executable, "-c", script], cwd=str(tmp_path / "work"))
        ),
    )
    _nowhere(gw, TOKEN)


async def test_env_injection_is_refused_unless_the_owner_allows_the_name(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    device = await _device(
        gw, endpointd, tmp_path, '[env]\nallow = ["PYTHONDONTWRITEBYTECODE", "FOO"]'
    )
    work = tmp_path / "work"
    for name, value in [
        ("LD_PRELOAD", str(work / "evil.so")),
        ("BASH_ENV", str(work / "evil.sh")),
        ("PATH", str(work)),
        ("GIT_CONFIG_COUNT", "1"),
        ("PYTHONSTARTUP", str(work / "evil.py")),
        ("NODE_OPTIONS", "--require ./evil.js"),
        ("PERL5OPT", "-Mevil"),
        ("ENV", str(work / "evil.sh")),
    ]:
        refused = await _refused(gw, device, _sh("true", work, env={name: value}))
        assert refused.reason == pb.Refused.REASON_POLICY_DENIED
        assert name in refused.message
        assert "[env] allow" in refused.message
    _, out = await _run(
        gw,
        device,
        _sh(
            'echo "[$PYTHONDONTWRITEBYTECODE] [$FOO]"',
            work,
            env={"PYTHONDONTWRITEBYTECODE": "1", "FOO": "bar"},
        ),
    )
    assert out == b"[1] [bar]\n"


async def test_a_shadowed_program_never_receives_a_credential(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    device = await _device(gw, endpointd, tmp_path)
    _store_token(endpointd)  # stored and scoped: only the scope's judgement stands between
    work = tmp_path / "work"
    fake_git = work / "git"
    fake_git.write_text('#!/bin/sh\necho "$TOKEN"\n')
    fake_git.chmod(0o755)
    cred = [
        pb.CredentialRef(name=TOKEN_NAME, delivery=pb.CredentialRef.DELIVERY_ENV, env_var="TOKEN")
    ]
    for argv in (
        [str(fake_git), "status"],
        ["./git", "status"],
        ["sh", "-c", "git status"],
        ["git", "-c", "alias.x=!sh -c 'echo $TOKEN'", "x"],
        ["git", "--config-env=core.pager=TOKEN", "log"],
        ["git", "rebase", "--exec", "env", "HEAD"],
        ["git", "x-not-a-builtin"],
    ):
        command = pb.Command(exec=pb.ExecCommand(argv=argv, cwd=str(work)), credentials=cred)
        refused = await _refused(gw, device, command)
        assert refused.reason == pb.Refused.REASON_CREDENTIAL_UNAVAILABLE, (argv, refused)
        assert f"credential {TOKEN_NAME!r} may not be delivered" in refused.message, refused
    # The real git, with nothing that could make it run another program, gets it.
    allowed = pb.Command(
        exec=pb.ExecCommand(argv=["git", "--version"], cwd=str(work)), credentials=cred
    )
    done, _ = await _run(gw, device, allowed)
    assert done.exit_code == 0


@pytest.mark.parametrize("network", ["deny", "proxy"])
async def test_the_network_is_closed_by_the_kernel_not_by_the_proxy_variable(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path, network: str
) -> None:
    listener = Greeter.tcp()
    device = await _device(gw, endpointd, tmp_path, f'network = "{network}"')
    script = (
        "import socket\n"
        "for kind in ('tcp', 'udp'):\n"
        "    try:\n"
        "        if kind == 'tcp':\n"
        f"            s = socket.create_connection(('127.0.0.1', {listener.port}), timeout=5)\n"
        "            print(kind, s.recv(100))\n"
        "        else:\n"
        "            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"            s.sendto(b'x', ('127.0.0.1', {listener.port}))\n"
        "            print(kind, 'sent')\n"
        "    except OSError as exc:\n"
        "        print(kind, 'blocked', exc.errno)\n"
    )
    _, out = await _run(
        gw,
        device,
        pb.Command(
            exec=pb.ExecCommand(argv=[sys.executable, "-c", script], cwd=str(tmp_path / "work"))
        ),
    )
    assert b"tcp blocked" in out, out
    assert b"udp blocked" in out, out
    assert listener.hits == 0
    listener.sock.close()


@pytest.mark.parametrize("sandbox", ["required", "off"])
async def test_the_agents_socket_is_out_of_reach_by_its_path(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path, sandbox: str
) -> None:
    """Landlock cannot stop a connect() by path: ssh-agent (like the session bus, through
    which systemd --user starts anything) is hidden in the command's mount namespace."""
    agent = tmp_path / "agent" / "ssh.sock"
    agent.parent.mkdir()
    listener = Greeter.unix(agent)
    endpointd.env["SSH_AUTH_SOCK"] = str(agent)
    device = await _device(gw, endpointd, tmp_path, f'sandbox = "{sandbox}"')
    script = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    s.connect(sys.argv[1][::-1])\n"
        "    print('reached', s.recv(100))\n"
        "except OSError as exc:\n"
        "    print('blocked', exc.errno)\n"
    )
    argv = [sys.executable, "-c", script, str(agent)[::-1]]
    _, out = await _run(
        gw, device, pb.Command(exec=pb.ExecCommand(argv=argv, cwd=str(tmp_path / "work")))
    )
    if sandbox == "off":  # the control: the same command reaches it unconfined
        assert b"reached" in out, out
        assert listener.hits == 1
    else:
        assert b"blocked" in out, out
        assert listener.hits == 0
    listener.sock.close()
