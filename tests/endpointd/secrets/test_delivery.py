"""Brokered credentials reach an exec's child only as asked: env, a 0600 file, git's helper.

Every command here runs under a real supervisor, started as a fresh interpreter or forked by
a real zygote, as the daemon does it; git runs for real against a local HTTPS server that
requires basic auth, and the helper answers only for the credential's hosts. What must never
happen: a value in argv, in the spool, in a file left
behind after the command, or in an error message.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from endpointd.process.executor import ExecLimits, Zygote, exec_spec, pid_alive, start_supervisor
from endpointd.rules.tables import CredentialScope
from endpointd.secrets import delivery
from endpointd.secrets.delivery import DeliveryError, GitHelperServer, Prepared
from endpointd.spool import ExitStatus, read_all
from superagent_shared.messages import CredentialRef, Delivery, Exec
from tests.fakes.https_server import HttpsServer
from tests.support.helpers import assert_eventually

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

ENV, FILE, GIT, HTTP = Delivery.ENV, Delivery.FILE, Delivery.GIT_HELPER, Delivery.HTTP
GIT_CLIENT = Path(delivery.__file__).with_name("git_helper.py")

# The child: reports what it received (a hash, never the value) and waits for the go-file,
# so the test can look at the running processes.
CHILD = """
import hashlib, os, sys, time
how, name, go = sys.argv[1:4]
if how == "env":
    data = os.environb[name.encode()]
else:
    path = os.environ[name]
    with open(path, "rb") as f:
        data = f.read()
    print(oct(os.stat(path).st_mode & 0o777), oct(os.stat(os.path.dirname(path)).st_mode & 0o777))
    print(path)
print(hashlib.sha256(data).hexdigest(), flush=True)
while not os.path.exists(go):
    time.sleep(0.02)
"""


def _secret() -> bytes:
    return b"canary-" + os.urandom(18).hex().encode()


def _refs(*refs: tuple[str, int, str]) -> list[CredentialRef]:
    return [CredentialRef(name=name, delivery=how, env_var=env_var) for name, how, env_var in refs]


class Launcher:
    """Starts a supervisor the way the daemon does: fresh interpreter, or a zygote's spare."""

    def __init__(self, how: str, zygote: Zygote | None) -> None:
        self.how = how
        self.zygote = zygote
        self._done: list[socket.socket] = []

    async def launch(self, spool: Path, spec: dict[str, Any]) -> int:
        if self.zygote is None:
            return start_supervisor(spool, spec).pid
        pid, done = await self.zygote.launch(spool, spec)
        self._done.append(done)
        return pid

    def close(self) -> None:
        for done in self._done:
            done.close()


@pytest.fixture(params=["fresh", "zygote"])
async def launcher(request: pytest.FixtureRequest) -> AsyncIterator[Launcher]:
    if request.param == "fresh":
        run = Launcher("fresh", None)
        yield run
        run.close()
        return
    z = Zygote()
    z.ensure_started()
    try:
        await assert_eventually(z.ready, timeout=20, message="the zygote never became ready")
        run = Launcher("zygote", z)
        yield run
        run.close()
    finally:
        z.stop()


def _spec(
    spool: Path,
    argv: Sequence[str],
    cwd: Path,
    prepared: Prepared | None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    ex = Exec(argv=tuple(argv), cwd=str(cwd), env=env or {})
    return exec_spec(
        spool, ex, limits=ExecLimits(max_timeout_seconds=60), default_cwd=cwd, delivery=prepared
    )


def _child(tmp_path: Path, how: str, name: str) -> tuple[list[str], Path]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    go = tmp_path / "go"
    return [sys.executable, str(script), how, name, str(go)], go


def _stdout(spool: Path) -> bytes:
    return b"".join(data for stream, data in read_all(spool) if stream == 1)


def _child_pid(spool: Path) -> int:
    text = (spool / "child.pid").read_text() if (spool / "child.pid").exists() else ""
    return int(text) if text else 0


def _proc(pid: int, what: str) -> bytes:
    return Path(f"/proc/{pid}/{what}").read_bytes()


def _files_holding(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def _exists(path: str | Path) -> bool:
    return os.path.exists(path)


def _mode(path: str | Path) -> int:
    return os.stat(path).st_mode & 0o777


async def _finished(spool: Path) -> ExitStatus:
    status = await assert_eventually(lambda: ExitStatus.read(spool), timeout=20)
    assert isinstance(status, ExitStatus)
    return status


async def test_env_delivery_reaches_the_child_only(launcher: Launcher, tmp_path: Path) -> None:
    secret = _secret()
    spool = tmp_path / "spool"
    prepared = delivery.prepare(spool, _refs(("api", ENV, "API_TOKEN")), {"api": secret})
    assert secret.decode() not in repr(prepared)
    argv, go = _child(tmp_path, "env", "API_TOKEN")
    supervisor = await launcher.launch(spool, _spec(spool, argv, tmp_path, prepared))

    digest = hashlib.sha256(secret).hexdigest().encode()
    await assert_eventually(lambda: digest in _stdout(spool), timeout=20)
    child = await assert_eventually(lambda: _child_pid(spool))
    # The child has it in its environment; nobody has it in argv; the supervisor (whose
    # spec came through a pipe or a socket) does not even have it in its own environment.
    assert b"API_TOKEN=" + secret in _proc(child, "environ").split(b"\0")
    for pid in (child, supervisor):
        assert secret not in _proc(pid, "cmdline")
    assert secret not in _proc(supervisor, "environ")
    assert not _files_holding(spool, secret)

    go.touch()
    status = await _finished(spool)
    assert status.exit_code == 0, (spool / "supervisor.log").read_text()
    assert not _files_holding(spool, secret)
    assert not (spool / delivery.CREDENTIALS_DIR).exists()


async def test_file_delivery_is_0600_readable_and_deleted_at_the_end(
    launcher: Launcher, tmp_path: Path
) -> None:
    secret = _secret() + b"\n\x00\xffbinary is fine in a file"
    spool = tmp_path / "spool"
    prepared = delivery.prepare(spool, _refs(("key", FILE, "KEY_FILE")), {"key": secret})
    argv, go = _child(tmp_path, "file", "KEY_FILE")
    supervisor = await launcher.launch(spool, _spec(spool, argv, tmp_path, prepared))

    digest = hashlib.sha256(secret).hexdigest().encode()
    await assert_eventually(lambda: digest in _stdout(spool), timeout=20)
    modes, path, _ = _stdout(spool).decode().splitlines()
    assert modes == "0o600 0o700"
    directory = spool.absolute() / delivery.CREDENTIALS_DIR
    assert os.path.dirname(path) == str(directory)
    assert _mode(path) == 0o600
    child = await assert_eventually(lambda: _child_pid(spool))
    for pid in (child, supervisor):
        assert secret not in _proc(pid, "cmdline")

    go.touch()
    status = await _finished(spool)
    assert status.exit_code == 0, (spool / "supervisor.log").read_text()
    # Deleted by the supervisor before it recorded the outcome.
    assert not _exists(path)
    assert not _exists(directory)
    assert not _files_holding(spool, secret[:20])
    prepared.close()  # what the daemon does at the end: nothing left to do


# Plays a daemon that starts the command and dies at once.
_LAUNCH_AND_DIE = (
    "import json, sys; from pathlib import Path; "
    "from endpointd.process.executor import start_supervisor; "
    "print(start_supervisor(Path(sys.argv[1]), json.load(sys.stdin)).pid)"
)


async def test_the_file_goes_even_when_the_daemon_that_started_the_command_is_gone(
    tmp_path: Path,
) -> None:
    secret = _secret()
    spool = tmp_path / "spool"
    prepared = delivery.prepare(spool, _refs(("key", FILE, "KEY_FILE")), {"key": secret})
    argv, go = _child(tmp_path, "file", "KEY_FILE")
    spec = _spec(spool, argv, tmp_path, prepared)
    launched = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", _LAUNCH_AND_DIE, str(spool)],
        input=json.dumps(spec).encode(),
        capture_output=True,
        timeout=30,
        check=True,
    )
    supervisor = int(launched.stdout)
    (path,) = _files_holding(spool / delivery.CREDENTIALS_DIR, secret)
    await assert_eventually(lambda: hashlib.sha256(secret).hexdigest().encode() in _stdout(spool))
    assert _exists(path)  # the command is still running, its "daemon" long gone
    go.touch()
    status = await _finished(spool)
    assert status.exit_code == 0
    assert not _exists(path)
    await assert_eventually(lambda: not pid_alive(supervisor))


async def test_a_killed_supervisor_leaves_the_file_to_the_daemons_cleanup(
    tmp_path: Path,
) -> None:
    secret = _secret()
    spool = tmp_path / "spool"
    prepared = delivery.prepare(spool, _refs(("key", FILE, "KEY_FILE")), {"key": secret})
    argv, _ = _child(tmp_path, "file", "KEY_FILE")
    proc = start_supervisor(spool, _spec(spool, argv, tmp_path, prepared))
    child = await assert_eventually(lambda: _child_pid(spool), timeout=20)
    proc.kill()
    proc.wait()
    os.killpg(child, signal.SIGKILL)
    assert (spool / delivery.CREDENTIALS_DIR).exists()
    # What a restarted daemon does when it records the "outcome unknown" end.
    delivery.remove(spool)
    assert not (spool / delivery.CREDENTIALS_DIR).exists()
    assert not _files_holding(spool, secret)


async def test_a_withdrawn_launch_deletes_the_file_too(zygote: Zygote, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    prepared = delivery.prepare(spool, _refs(("key", FILE, "KEY_FILE")), {"key": _secret()})
    marker = tmp_path / "ran"
    spec = _spec(spool, ["touch", str(marker)], tmp_path, prepared)
    pid, done = await zygote.launch(spool, spec, gated=True)
    await assert_eventually(lambda: (spool / "supervisor.pid").exists())
    assert (spool / delivery.CREDENTIALS_DIR).exists()
    done.close()  # the daemon withdraws it: nothing runs, and the file goes
    await assert_eventually(lambda: not pid_alive(pid))
    assert not (spool / delivery.CREDENTIALS_DIR).exists()
    assert not marker.exists()


# ------------------------------------------------------------------------- git


def _git(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout


def _git_env(tmp_path: Path) -> dict[str, str]:
    """No user or system config, except a global one with a helper that must be ignored."""
    global_config = tmp_path / "gitconfig"
    global_config.write_text(f"[credential]\n\thelper = store --file={tmp_path / 'store'}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return {
        **env,
        "GIT_CONFIG_GLOBAL": str(global_config),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "HOME": str(tmp_path),
    }


def _bare_repo(tmp_path: Path, bare: Path) -> str:
    """A bare repository at ``bare`` with one commit on main; that commit."""
    env = _git_env(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    _git("init", "-q", "-b", "main", cwd=work, env=env)
    (work / "README").write_text("hello\n")
    _git("add", "README", cwd=work, env=env)
    _git(
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@example.com",
        "commit",
        "-qm",
        "one",
        cwd=work,
        env=env,
    )
    _git("clone", "-q", "--bare", str(work), str(bare), cwd=tmp_path, env=env)
    return _git("rev-parse", "HEAD", cwd=work, env=env).strip()


def _scopes(name: str, *hosts: str) -> dict[str, CredentialScope]:
    return {name: CredentialScope(allow=("*",), hosts=hosts)}


async def test_git_authenticates_through_the_helper_for_the_commands_lifetime(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = _secret()
    with HttpsServer(tmp_path, secret.decode()) as server:
        head = _bare_repo(tmp_path, server.root / "repo.git")
        url = server.git_url("repo")
        spool = tmp_path / "spool"
        refs = _refs(("gh", GIT, "alice"))
        supervisor: list[int] = []
        prepared = delivery.prepare(
            spool,
            refs,
            {"gh": secret},
            scopes=_scopes("gh", f"localhost:{server.port}"),
            root_pid=lambda: supervisor[0] if supervisor else None,
        )
        assert prepared.git is not None
        socket_path = prepared.git.socket_path
        await prepared.start()
        assert _mode(socket_path) == 0o600
        assert _mode(os.path.dirname(socket_path)) == 0o700

        env = {**_git_env(tmp_path), "GIT_SSL_CAINFO": str(server.ca_file)}
        go = tmp_path / "go"
        # git, then the command waits: the helper serves only while it runs.
        script = 'git ls-remote "$0" && until [ -e "$1" ]; do sleep 0.05; done'
        spec = _spec(spool, ["sh", "-c", script, url, str(go)], tmp_path, prepared)
        spec["env"] = prepared.apply(env)
        supervisor.append(start_supervisor(spool, spec).pid)
        await assert_eventually(lambda: b"refs/heads/main" in _stdout(spool), timeout=30)
        assert f"{head}\trefs/heads/main" in _stdout(spool).decode()
        assert server.denied >= 1  # asked for credentials...
        assert server.allowed >= 1  # ...and got them
        assert not (tmp_path / "store").exists()  # the global helper was not used
        assert not _files_holding(spool, secret)

        # The same helper, asked by a process outside the command's tree: nothing.
        outsider = await asyncio.to_thread(
            subprocess.run,
            ["git", "ls-remote", url],
            env=spec["env"],
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert outsider.returncode != 0
        assert secret not in outsider.stderr + outsider.stdout
        assert "refused a process outside the command" in caplog.text, outsider.stderr

        go.touch()
        status = await _finished(spool)
        output = b"".join(data for _, data in read_all(spool)).decode()
        assert status.exit_code == 0, output
        assert not _files_holding(spool, secret)

        prepared.close()  # the command ended
        assert not _exists(socket_path)
        assert not _exists(os.path.dirname(socket_path))
        denied = server.denied
        late = await asyncio.to_thread(
            subprocess.run,
            ["git", "ls-remote", url],
            env=spec["env"],
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert late.returncode != 0
        assert server.denied > denied
        assert secret not in late.stderr + late.stdout


async def test_git_credential_fill_gets_the_served_credential_and_the_default_username(
    tmp_path: Path,
) -> None:
    secret = _secret()
    prepared = delivery.prepare(
        tmp_path / "spool",
        _refs(("gh", GIT, "")),
        {"gh": secret},
        scopes=_scopes("gh", "example.com", "*.example.org"),
    )
    await prepared.start()
    try:
        env = prepared.apply(_git_env(tmp_path))
        # The global config's helper would answer first, were it not reset.
        (tmp_path / "store").write_text("https://mallory:wrong-password@example.com\n")

        def fill(request: bytes) -> list[bytes]:
            done = subprocess.run(
                ["git", "credential", "fill"],
                input=request,
                env=env,
                capture_output=True,
                timeout=30,
                check=False,
            )
            assert secret not in done.stderr
            return done.stdout.splitlines()

        # In a thread: the helper is served by this very event loop.
        lines = await asyncio.to_thread(fill, b"protocol=https\nhost=example.com\n\n")
        assert b"username=x-access-token" in lines
        assert b"password=" + secret in lines
        for host in (b"example.com:443", b"api.example.org", b"a.b.example.org"):
            asked = await asyncio.to_thread(fill, b"protocol=https\nhost=" + host + b"\n\n")
            assert b"password=" + secret in asked, host
        # Other hosts, other ports, or plain http: git hears nothing from the helper.
        for request in (
            b"protocol=https\nhost=evil.example\n\n",
            b"protocol=https\nhost=example.com.evil.example\n\n",
            b"protocol=https\nhost=example.com:8443\n\n",
            b"protocol=https\nhost=example.org\n\n",
            b"protocol=http\nhost=example.com\n\n",
            b"protocol=https\n\n",
        ):
            refused = await asyncio.to_thread(fill, request)
            assert not any(line.startswith(b"password=") for line in refused), request
        assert prepared.git is not None
        # Raw values, the global file's first; git's credential code resets at the "".
        helpers = _git("config", "--get-all", "credential.helper", cwd=tmp_path, env=env)
        assert helpers.splitlines()[-2:] == [
            "",
            delivery.git_helper_command(prepared.git.socket_path),
        ]
    finally:
        prepared.close()


async def test_git_config_already_in_the_environment_is_kept(tmp_path: Path) -> None:
    prepared = delivery.prepare(
        tmp_path / "spool",
        _refs(("gh", GIT, "")),
        {"gh": _secret()},
        scopes=_scopes("gh", "example.com"),
    )
    try:
        base = {
            **_git_env(tmp_path),
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "user.name",
            "GIT_CONFIG_VALUE_0": "Kept Name",
        }
        env = prepared.apply(base)
        assert env["GIT_CONFIG_COUNT"] == "3"
        assert _git("config", "user.name", cwd=tmp_path, env=env).strip() == "Kept Name"
        helpers = _git("config", "--get-all", "credential.helper", cwd=tmp_path, env=env)
        assert helpers.splitlines()[-2] == ""  # ours come after the kept entry
    finally:
        prepared.close()


def _client(socket_path: str, action: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-I", "-S", str(GIT_CLIENT), socket_path, action],
        input=b"protocol=https\nhost=example.com\n\n",
        capture_output=True,
        timeout=30,
        check=False,
    )


async def test_the_helper_server_answers_get_ignores_store_and_erase_and_closes(
    tmp_path: Path,
) -> None:
    secret = _secret()
    directory = tmp_path / "sock"
    directory.mkdir(mode=0o700)
    path = str(directory / "s")
    server = GitHelperServer()
    await server.start(path, "bob", secret, hosts=["example.com"])

    async def client(action: str) -> subprocess.CompletedProcess[bytes]:
        return await asyncio.to_thread(_client, path, action)

    got = await client("get")
    assert got.returncode == 0, got.stderr
    assert got.stdout == b"username=bob\npassword=" + secret + b"\n\n"
    for action in ("store", "erase"):
        ignored = await client(action)
        assert (ignored.returncode, ignored.stdout) == (0, b"")
    server.close()
    server.close()  # idempotent
    assert not _exists(path)
    late = await client("get")
    assert late.returncode == 1
    assert late.stdout == b""
    assert b"no credential from endpointd" in late.stderr
    assert secret not in late.stderr


# --------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("refs", "values", "expected"),
    [
        (_refs(("a", ENV, "PATH")), None, "'PATH' is reserved"),
        (_refs(("a", ENV, "LD_PRELOAD")), None, "'LD_PRELOAD' is reserved"),
        (_refs(("a", FILE, "BASH_ENV")), None, "'BASH_ENV' is reserved"),
        (_refs(("a", FILE, "PYTHONSTARTUP")), None, "'PYTHONSTARTUP' is reserved"),
        (_refs(("a", ENV, "GIT_ASKPASS")), None, "'GIT_ASKPASS' is reserved"),
        (_refs(("a", ENV, "ld_preload")), None, "'ld_preload' is reserved"),
        (_refs(("a", ENV, "1TOKEN")), None, "not a valid environment variable name"),
        (_refs(("a", ENV, "A=B")), None, "not a valid environment variable name"),
        (_refs(("a", ENV, "")), None, "env delivery needs env_var"),
        (_refs(("a", FILE, "")), None, "file delivery needs env_var"),
        (_refs(("a", 0, "TOKEN")), None, "unknown delivery 0"),
        (_refs(("", ENV, "TOKEN")), None, "has no name"),
        (_refs(("a", ENV, "TOKEN"), ("b", FILE, "TOKEN")), None, "both target env_var 'TOKEN'"),
        (_refs(("a", GIT, ""), ("b", GIT, "")), None, "only one credential per command"),
        (_refs(("a", GIT, "bad\nuser")), None, "must be one line"),
        (_refs(("a", ENV, "TOKEN"), ("b", ENV, "OTHER")), {"a": b"x" * 8}, "'b' is not available"),
        (_refs(("a", ENV, "TOKEN")), {"a": b"SECRET\x00NUL"}, "contains a NUL byte"),
        (_refs(("a", ENV, "TOKEN")), {"a": b"S" * 200_000}, "too large for an environment"),
        (_refs(("a", GIT, "")), {"a": b"SECRET\nline2"}, "one non-empty line"),
    ],
)
def test_bad_references_are_refused_naming_the_credential_never_the_value(
    tmp_path: Path,
    refs: list[CredentialRef],
    values: dict[str, bytes] | None,
    expected: str,
) -> None:
    values = values if values is not None else {ref.name: b"SECRET-value-1" for ref in refs}
    spool = tmp_path / "spool"
    scopes = {ref.name: CredentialScope(allow=("*",), hosts=("example.com",)) for ref in refs}
    with pytest.raises(DeliveryError) as raised:
        delivery.prepare(spool, refs, values, scopes=scopes)
    message = str(raised.value)
    assert expected in message
    assert "SECRET" not in message
    assert "\n" not in message
    assert not (spool / delivery.CREDENTIALS_DIR).exists()


def test_check_needs_no_values_and_a_failed_prepare_leaves_nothing(tmp_path: Path) -> None:
    good = _refs(("a", ENV, "API_TOKEN"), ("b", FILE, "KEY_FILE"), ("c", GIT, "me"))
    delivery.check(good)  # what the daemon can do on receipt, before Accepted
    with pytest.raises(DeliveryError, match="reserved"):
        delivery.check(_refs(("a", ENV, "DYLD_INSERT_LIBRARIES")))
    # The file is written before the git password turns out unusable: it is removed again.
    spool = tmp_path / "spool"
    values = {"a": b"v" * 10, "b": b"file-value", "c": b"two\nlines"}
    with pytest.raises(DeliveryError, match="one non-empty line"):
        delivery.prepare(spool, good, values, scopes=_scopes("c", "example.com"))
    assert not (spool / delivery.CREDENTIALS_DIR).exists()


@pytest.mark.parametrize("how", [GIT, HTTP])
@pytest.mark.parametrize(
    "scopes",
    [{}, {"a": CredentialScope(allow=("*",))}, {"b": CredentialScope(hosts=("example.com",))}],
)
def test_git_and_http_deliveries_need_the_credentials_hosts(
    tmp_path: Path, how: int, scopes: dict[str, CredentialScope]
) -> None:
    with pytest.raises(DeliveryError) as raised:
        delivery.prepare(
            tmp_path / "spool", _refs(("a", how, "")), {"a": b"SECRET-x"}, scopes=scopes
        )
    message = str(raised.value)
    assert "hosts = [" in message
    assert "[credentials.a]" in message
    assert "SECRET" not in message


def test_env_delivery_cannot_take_over_the_proxy_or_the_trust_store() -> None:
    for name in ("HTTPS_PROXY", "http_proxy", "NO_PROXY", "SSL_CERT_FILE", "CURL_CA_BUNDLE"):
        with pytest.raises(DeliveryError, match="reserved"):
            delivery.check(_refs(("a", ENV, name)))
