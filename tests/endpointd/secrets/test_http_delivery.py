"""Credentials a command never sees: ``http`` delivery through endpointd's per-command proxy,
a git helper that answers only for its hosts and its own command, and egress by allowlist.

End to end: a real ``endpointd run`` paired with a scripted gateway, a credential stored
with ``endpointd creds add`` (a file keyring under tmp), and a real HTTPS server on loopback
(its own test CA, which the daemon trusts through ``SSL_CERT_FILE``) that demands the token
as a bearer token, for a JSON API and for git over smart HTTP. ``curl``, Python's
``urllib`` and ``git`` reach it through the proxy, while the token is searched for, in
every encoding the redactor knows, in the command's environment and CA files, every file
under the test's directory (the daemon's state and config, spool, journal, audit log, log,
the command's work and temp files), and every message the gateway received: it is nowhere.

Then the pieces on their own (in process): host matching, header injection (a client's own
``Authorization`` is replaced), ``407`` without the token, plain HTTP never carrying a
credential, the device CA's leaves, and the daemon's own secrets for the redactor.
"""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from endpointd.config import KeyConfig
from endpointd.keys import DeviceKey, _write_key_file
from endpointd.rules.tables import CredentialScope
from endpointd.secrets import ca as ca_module
from endpointd.secrets import delivery, environment_secrets, own_secrets, secret_looking
from endpointd.secrets.ca import DeviceCA, system_trust_pem, write_bundle
from endpointd.secrets.proxy import CredentialProxy, Egress, Injection, host_matches
from endpointd.secrets.redact import Redactor, credential_patterns
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared.messages import CredentialRef, Delivery
from tests.fakes.endpointd_process import Endpointd, endpointd_in, start_paired
from tests.fakes.gateway_server import FakeGateway
from tests.fakes.https_server import HttpsServer, TestCA
from tests.support.helpers import assert_eventually

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

API = "api-token"
GIT = "git-token"
HTTP = pb.CredentialRef.DELIVERY_HTTP
GIT_HELPER = pb.CredentialRef.DELIVERY_GIT_HELPER
# The programs the credentials may be given to: the shell scripts and Python.
ALLOW = json.dumps(["sh *", f"{sys.executable} *"])
# Masking leaves runs of '*' where a secret was: none may appear in these commands' output.
MASKED = b"*" * 12

needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _token() -> str:
    return "canary-http-" + os.urandom(16).hex()


# ----------------------------------------------------------------------- fixtures


@pytest.fixture
def token() -> str:
    return _token()


@pytest.fixture
def test_ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path / "test-ca")


@pytest.fixture
def server(tmp_path: Path, token: str, test_ca: TestCA) -> Iterator[HttpsServer]:
    with HttpsServer(tmp_path / "api", token, ca=test_ca) as running:
        yield running


@pytest.fixture
def endpointd(tmp_path: Path, test_ca: TestCA) -> Iterator[Endpointd]:
    with endpointd_in(tmp_path) as daemon:
        daemon.use_file_keyring(tmp_path / "keyring-data")
        # The daemon's proxy verifies the upstream with its default trust: the test CA.
        daemon.env["SSL_CERT_FILE"] = str(test_ca.ca_file)
        yield daemon


def _policy(work: Path, body: str) -> str:
    return f"""
allowed_roots = [{json.dumps(str(work))}]
default_action = "allow"
sandbox = "off"
{body}
"""


async def _running(gw: FakeGateway, endpointd: Endpointd, policy: str) -> str:
    work = endpointd.root.parent / "work"
    work.mkdir(exist_ok=True)
    device = await start_paired(gw, endpointd)
    policy_file = endpointd.config_dir / "policy.toml"
    policy_file.write_text(policy)
    policy_file.chmod(0o600)
    return device


def _add_credential(endpointd: Endpointd, name: str, value: str) -> None:
    added = subprocess.run(
        [sys.executable, "-m", "endpointd", "creds", "add", name],
        input=value,  # from stdin, never argv
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tempfile.gettempdir(),
        env=endpointd.env,
    )
    assert added.returncode == 0, added.stderr


def _exec(argv: list[str], cwd: Path, *refs: pb.CredentialRef) -> pb.Command:
    return pb.Command(
        exec=pb.ExecCommand(argv=argv, cwd=str(cwd), timeout_seconds=120), credentials=refs
    )


async def _run(gw: FakeGateway, device: str, command: pb.Command) -> tuple[pb.Finished, bytes]:
    sent = gw.send(device, command)
    ended = await assert_eventually(
        lambda: gw.refused(sent.command_id) or gw.finished(sent.command_id), timeout=90
    )
    assert isinstance(ended, pb.Finished), f"refused: {ended}"
    return ended, gw.output(sent.command_id)


def _bare_repo(tmp_path: Path, bare: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", HOME=str(tmp_path))
    source = tmp_path / "source"
    source.mkdir()

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=source, env=env, capture_output=True, text=True, check=True
        )
        return done.stdout

    git("init", "-q", "-b", "main")
    (source / "README").write_text("hello through the proxy\n")
    git("add", "README")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "one")
    git("clone", "-q", "--bare", str(source), str(bare))
    return git("rev-parse", "HEAD").strip()


def _leaks(token: str) -> list[bytes]:
    """Every form of the token the redactor knows (raw, base64 at each shift, URL, JSON...)
    and the basic-auth header that would carry it: none may be found anywhere."""
    forms = credential_patterns(token.encode())
    forms.add(base64.b64encode(b"x-access-token:" + token.encode()))
    return sorted(forms, key=len, reverse=True)


def _exists(path: Path) -> bool:
    return path.exists()


def _files_with(root: Path, forms: list[bytes], skip: Path) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if skip in path.parents or not path.is_file() or path.is_symlink():
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if any(form in data for form in forms):
            found.append(str(path))
    return found


# ----------------------------------------------------------------------- end to end


SCRIPT = r"""
set -u
out="$1"; api="$2"; repo="$3"; python="$4"
export GIT_TERMINAL_PROMPT=0
FETCH='import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())'
env > "$out/env.txt"
for f in "$SSL_CERT_FILE" "$REQUESTS_CA_BUNDLE" "$NODE_EXTRA_CA_CERTS" "$GIT_SSL_CAINFO" \
         "$CURL_CA_BUNDLE"; do cat "$f"; done > "$out/ca-files.txt"
cat /proc/self/environ > "$out/proc-environ.bin"
curl -sS --fail -o "$out/curl.json" "$api/curl" && echo "curl ok"
curl -sS --fail -H "Authorization: Bearer not-the-token" -o "$out/curl-own.json" "$api/own" \
    && echo "curl with its own header ok"
"$python" -c "$FETCH" "$api/urllib" > "$out/urllib.json" && echo "urllib ok"
git ls-remote "$repo" > "$out/ls-remote.txt" && echo "ls-remote ok"
git clone -q "$repo" "$out/clone" && echo "clone ok"
cp -r "$TMPDIR" "$out/tmpdir-copy" 2>/dev/null || true
ls -la "$TMPDIR" > "$out/tmpdir.txt" 2>&1 || true
"""


@needs_curl
@needs_git
async def test_curl_urllib_and_git_work_through_http_delivery_and_the_token_is_nowhere(
    gw: FakeGateway, endpointd: Endpointd, server: HttpsServer, token: str, tmp_path: Path
) -> None:
    head = _bare_repo(tmp_path, server.root / "repo.git")
    work = tmp_path / "work"
    device = await _running(
        gw,
        endpointd,
        _policy(
            work,
            f"""
[credentials.{API}]
allow = {ALLOW}
hosts = ["localhost:{server.port}"]
""",
        ),
    )
    _add_credential(endpointd, API, token)
    out = work / "out"
    out.mkdir()
    (work / "probe.sh").write_text(SCRIPT)
    command = _exec(
        ["sh", "probe.sh", str(out), server.url("/api"), server.git_url("repo"), sys.executable],
        work,
        pb.CredentialRef(name=API, delivery=HTTP),
    )
    finished, output = await _run(gw, device, command)
    assert finished.exit_code == 0, output
    for line in ("curl ok", "curl with its own header ok", "urllib ok", "ls-remote ok", "clone ok"):
        assert line.encode() in output, output
    assert json.loads((out / "curl.json").read_text())["ok"] is True
    assert json.loads((out / "urllib.json").read_text())["path"] == "/api/urllib"
    assert f"{head}\trefs/heads/main" in (out / "ls-remote.txt").read_text()
    assert (out / "clone" / "README").read_text() == "hello through the proxy\n"
    # The server saw the token, once per request, never the client's own header.
    seen = server.authorizations
    assert seen
    assert all(got == [f"Bearer {token}"] for got in seen), seen
    assert server.denied == 0

    # The command had the proxy and the CA bundle, not the token.
    env = dict(
        line.split("=", 1) for line in (out / "env.txt").read_text().splitlines() if "=" in line
    )
    assert env["HTTPS_PROXY"].startswith("http://endpointd:")
    assert env["https_proxy"] == env["HTTP_PROXY"] == env["HTTPS_PROXY"]
    assert env["NO_PROXY"] == ""
    bundle = Path(env["SSL_CERT_FILE"])
    for name in ("REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "CURL_CA_BUNDLE"):
        assert env[name] == str(bundle)
    assert b"endpointd device CA" in (out / "ca-files.txt").read_bytes()
    assert not _exists(bundle)  # gone with the command

    # Nowhere: not in the output, nor in any file under the test's directory (the daemon's
    # config, state, spool, journal, audit log, log; the command's files and its TMPDIR
    # copy), except the keyring file where it is stored; nor in any message the gateway got.
    forms = _leaks(token)
    assert MASKED not in output
    assert not any(form in output for form in forms)
    keyring_dir = tmp_path / "keyring-data"
    assert any(
        form in p.read_bytes() for p in keyring_dir.rglob("*") if p.is_file() for form in forms
    )
    assert _files_with(tmp_path, forms, skip=keyring_dir) == []
    for message in gw.messages():
        raw = message.SerializeToString()
        assert not any(form in raw for form in forms), message.WhichOneof("msg")
    assert token not in endpointd.log()

    # The device CA: its certificate in the config dir, its key in the keyring under an
    # entry `creds list` never shows.
    ca_cert = x509.load_pem_x509_certificate((endpointd.config_dir / "device-ca.pem").read_bytes())
    assert ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    listed = endpointd.cli("creds", "list")
    assert listed.returncode == 0, listed.stderr
    assert API in listed.stdout
    assert "device-ca" not in listed.stdout
    entry = b"device_2dca_2d"  # "device-ca-" as the file keyring spells entry names
    assert any(entry in p.read_bytes() for p in keyring_dir.rglob("*") if p.is_file())


GIT_SCRIPT = r"""
out="$1"; good="$2"
export GIT_TERMINAL_PROMPT=0
printf 'protocol=https\nhost=evil.example\n\n' | git credential fill > "$out/evil.txt" 2>&1
echo "evil exit $?"
printf 'protocol=http\nhost=%s\n\n' "$good" | git credential fill > "$out/plain.txt" 2>&1
echo "plain exit $?"
printf 'protocol=https\nhost=%s\n\n' "$good" | git credential fill > "$out/good.txt" 2>&1
echo "good exit $?"
"""


@needs_git
async def test_the_git_helper_answers_only_for_its_hosts(
    gw: FakeGateway, endpointd: Endpointd, server: HttpsServer, token: str, tmp_path: Path
) -> None:
    """``git credential fill`` inside the credentialed command: nothing for a foreign host or
    plain http; the password for the credential's host (which is why the docs count the git
    helper's value as readable by the command, unlike the http delivery's)."""
    work = tmp_path / "work"
    good = f"localhost:{server.port}"
    device = await _running(
        gw,
        endpointd,
        _policy(work, f'[credentials.{GIT}]\nallow = {ALLOW}\nhosts = ["{good}"]\n'),
    )
    _add_credential(endpointd, GIT, token)
    out = work / "out"
    out.mkdir()
    (work / "git.sh").write_text(GIT_SCRIPT)
    finished, output = await _run(
        gw,
        device,
        _exec(
            ["sh", "git.sh", str(out), good],
            work,
            pb.CredentialRef(name=GIT, delivery=GIT_HELPER),
        ),
    )
    assert finished.exit_code == 0, output
    assert b"evil exit 128" in output, output
    assert b"plain exit 128" in output, output
    assert b"good exit 0" in output, output
    for name in ("evil.txt", "plain.txt"):
        answer = (out / name).read_text()
        assert "password=" not in answer, answer
        assert token not in answer
    assert f"password={token}" in (out / "good.txt").read_text().splitlines()


async def test_a_command_without_credentials_reaches_only_the_allowed_hosts_under_network_proxy(
    gw: FakeGateway,
    endpointd: Endpointd,
    server: HttpsServer,
    test_ca: TestCA,
    token: str,
    tmp_path: Path,
) -> None:
    with (
        HttpsServer(tmp_path / "other", token, ca=test_ca, name="other") as other,
        _PlainServer() as plain,
    ):
        work = tmp_path / "work"
        device = await _running(
            gw,
            endpointd,
            _policy(
                work,
                f'network = "proxy"\n[proxy]\nallow_hosts = ["127.0.0.1:{server.port}",'
                f' "127.0.0.1:{plain.port}"]\n',
            ),
        )
        probe = work / "egress.py"
        probe.write_text(EGRESS_PROBE)
        argv = [
            sys.executable,
            str(probe),
            str(test_ca.ca_file),
            server.url("/api/allowed", "127.0.0.1"),
            other.url("/api/refused", "127.0.0.1"),
            f"http://127.0.0.1:{plain.port}/allowed",
            f"http://127.0.0.1:{other.port}/refused-plain",
        ]
        finished, output = await _run(gw, device, _exec(argv, work))
        assert finished.exit_code == 0, output
        result = json.loads(output.decode().strip().splitlines()[-1])
        assert result["proxy"].startswith("http://endpointd:")
        assert result["ssl_cert_file"] is None  # no credential: no device CA either
        assert result["allowed"] == 401  # reached the server (which wants a token)
        assert result["refused"] == "tunnel 403"
        assert result["plain_allowed"] == [200, "plain ok"]
        status, body = result["plain_refused"]
        assert status == 403
        assert f"127.0.0.1:{other.port}" in body
        assert "[proxy] allow_hosts" in body
        assert other.allowed == other.denied == 0


EGRESS_PROBE = r"""
import json, os, re, ssl, sys, urllib.error, urllib.request
ca, allowed, refused, plain_allowed, plain_refused = sys.argv[1:6]
context = ssl.create_default_context(cafile=ca)
def status(url):
    try:
        with urllib.request.urlopen(url, context=context, timeout=30) as r:
            return [r.status, r.read().decode().strip()]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode().strip()]
    except urllib.error.URLError as e:
        found = re.search(r"Tunnel connection failed: (\d+)", str(e.reason))
        return "tunnel " + found.group(1) if found else str(e)
result = {
    "proxy": os.environ.get("HTTPS_PROXY", ""),
    "ssl_cert_file": os.environ.get("SSL_CERT_FILE"),
    "allowed": status(allowed)[0],
    "refused": status(refused),
    "plain_allowed": status(plain_allowed),
    "plain_refused": status(plain_refused),
}
print(json.dumps(result))
"""


OUTSIDER_SCRIPT = r"""
import os, sys, time
print(os.environ["HTTPS_PROXY"], flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


async def test_the_commands_proxy_refuses_a_process_outside_the_command(
    gw: FakeGateway, endpointd: Endpointd, server: HttpsServer, token: str, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    device = await _running(
        gw,
        endpointd,
        _policy(
            work, f'[credentials.{API}]\nallow = {ALLOW}\nhosts = ["localhost:{server.port}"]\n'
        ),
    )
    _add_credential(endpointd, API, token)
    go = work / "go"
    (work / "wait.py").write_text(OUTSIDER_SCRIPT)
    sent = gw.send(
        device,
        _exec(
            [sys.executable, "wait.py", str(go)], work, pb.CredentialRef(name=API, delivery=HTTP)
        ),
    )
    proxy_url = await assert_eventually(
        lambda: gw.output(sent.command_id).decode().strip(), timeout=60
    )
    assert proxy_url.startswith("http://endpointd:")
    try:
        # This test process has the URL and its token, but is not the command.
        for with_token in (True, False):
            url = proxy_url if with_token else "http://127.0.0.1:" + proxy_url.rsplit(":", 1)[1]
            answer = await asyncio.to_thread(_via_proxy, url, server.url("/api/outsider"))
            assert answer.startswith("403" if with_token else "407"), answer
        assert server.authorizations == []
    finally:
        go.touch()
    finished = await assert_eventually(lambda: gw.finished(sent.command_id), timeout=60)
    assert finished.exit_code == 0


def _via_proxy(proxy_url: str, target: str) -> str:
    """CONNECT through ``proxy_url`` (its user:token as basic auth), the answer's status line
    and body, from this process."""
    rest = proxy_url.removeprefix("http://")
    auth, _, address = rest.rpartition("@")
    host, port = address.rsplit(":", 1)
    authority = target.removeprefix("https://").split("/", 1)[0]
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if auth:
        lines.append("Proxy-Authorization: Basic " + base64.b64encode(auth.encode()).decode())
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    head, _, body = data.decode().partition("\r\n\r\n")
    return head.split(" ", 1)[1] + " " + body


# ----------------------------------------------------------------------- in process


class _PlainHandler(http.server.BaseHTTPRequestHandler):
    server: _PlainHTTP

    def do_GET(self) -> None:
        self.server.seen.append(str(self.headers))
        body = b"plain ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _PlainHTTP(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        self.seen: list[str] = []
        super().__init__(("127.0.0.1", 0), _PlainHandler)


class _PlainServer:
    def __init__(self) -> None:
        self.server = _PlainHTTP()
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def __enter__(self) -> _PlainServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    ("patterns", "host", "port", "default", "expected"),
    [
        (["api.github.com"], "api.github.com", 443, 443, True),
        (["api.github.com"], "API.GitHub.com.", 443, 443, True),
        (["api.github.com"], "api.github.com", 8443, 443, False),
        (["api.github.com"], "api.github.com", 80, 80, True),  # plain HTTP: its own default
        (["api.github.com"], "github.com", 443, 443, False),
        (["api.github.com"], "evil-api.github.com", 443, 443, False),
        (["api.github.com"], "api.github.com.evil.example", 443, 443, False),
        (["*.example.com"], "a.example.com", 443, 443, True),
        (["*.example.com"], "a.b.example.com", 443, 443, True),
        (["*.example.com"], "example.com", 443, 443, False),
        (["*.example.com"], "evilexample.com", 443, 443, False),
        (["*.example.com:8443"], "a.example.com", 8443, 443, True),
        (["*.example.com:8443"], "a.example.com", 443, 443, False),
        (["localhost:8443"], "localhost", 8443, 443, True),
        (["localhost:8443"], "localhost", 443, 443, False),
        (["127.0.0.1:9000"], "127.0.0.1", 9000, 443, True),
        (["127.0.0.1:9000"], "localhost", 9000, 443, False),  # names are compared, not resolved
        (["[::1]:9000"], "::1", 9000, 443, True),
        ([], "anything", 443, 443, False),
        (["bad host/"], "bad host/", 443, 443, False),
    ],
)
def test_host_matching(
    patterns: list[str], host: str, port: int, default: int, expected: bool
) -> None:
    assert host_matches(patterns, host, port, default_port=default) is expected


@pytest.fixture
async def direct(
    server: HttpsServer, token: str, test_ca: TestCA
) -> AsyncIterator[tuple[CredentialProxy, HttpsServer]]:
    """A proxy in this process adding ``token`` for the server, trusting the test CA."""
    upstream = ssl.create_default_context(cafile=str(test_ca.ca_file))
    proxy = CredentialProxy(
        injections=[
            Injection(
                API, [f"localhost:{server.port}"], "Authorization: Bearer {secret}", token.encode()
            )
        ],
        ca=DeviceCA.generate(),
        upstream_context=upstream,
    )
    await proxy.start()
    try:
        yield proxy, server
    finally:
        proxy.close()


def _client_context(proxy: CredentialProxy, tmp_path: Path) -> ssl.SSLContext:
    assert proxy.ca is not None
    (tmp_path / "device-ca.pem").write_bytes(proxy.ca.cert_pem)
    context = ssl.create_default_context(cafile=str(tmp_path / "device-ca.pem"))
    return context


async def _raw_request(
    proxy: CredentialProxy,
    authority: str,
    request: bytes,
    *,
    auth: str | None = None,
    tls: ssl.SSLContext | None = None,
    server_hostname: str = "localhost",
) -> bytes:
    """CONNECT ``authority`` (then TLS when ``tls``) and send ``request``; the raw answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        auth = auth if auth is not None else f"endpointd:{proxy.token}"
        head = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n"
        if auth:
            head += f"Proxy-Authorization: Basic {base64.b64encode(auth.encode()).decode()}\r\n"
        writer.write(head.encode() + b"\r\n")
        await writer.drain()
        status = await reader.readuntil(b"\r\n\r\n")
        if not status.startswith(b"HTTP/1.1 200"):
            return status + await reader.read()
        if tls is not None:
            await writer.start_tls(tls, server_hostname=server_hostname)
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(-1), 30)
    finally:
        writer.close()


async def test_the_proxy_replaces_a_client_supplied_header_and_adds_the_credential(
    direct: tuple[CredentialProxy, HttpsServer], token: str, tmp_path: Path
) -> None:
    proxy, server = direct
    authority = f"localhost:{server.port}"
    request = (
        f"GET /api/injected HTTP/1.1\r\nHost: {authority}\r\n"
        "authorization: Bearer client-made\r\nAUTHORIZATION: Basic eDp5\r\n"
        "Connection: keep-alive\r\nProxy-Authorization: Basic c3RvbGVu\r\n\r\n"
    ).encode()
    answer = await _raw_request(proxy, authority, request, tls=_client_context(proxy, tmp_path))
    assert answer.startswith(b"HTTP/1.0 200") or answer.startswith(b"HTTP/1.1 200"), answer
    assert b'"path": "/api/injected"' in answer
    assert server.authorizations == [[f"Bearer {token}"]]
    assert token.encode() not in answer
    assert token not in repr(proxy) + repr(proxy.injections)


async def test_an_inner_request_for_another_host_gets_no_credential_and_goes_nowhere(
    direct: tuple[CredentialProxy, HttpsServer], tmp_path: Path
) -> None:
    """CONNECT names the credential's host, then the request inside the tunnel names
    another (a virtual host behind the same address, or a fronted domain): the proxy
    answers it itself, and neither the credential nor the request reaches the upstream."""
    proxy, server = direct
    authority = f"localhost:{server.port}"
    misdirected = [
        "GET / HTTP/1.1\r\nHost: other-host.example\r\n\r\n",
        f"GET / HTTP/1.1\r\nHost: other-host.example:{server.port}\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",  # another port: 443
        f"GET / HTTP/1.1\r\nHost: localhost:{server.port + 1}\r\n\r\n",
        f"GET / HTTP/1.1\r\nHost: {authority}\r\nHost: other-host.example\r\n\r\n",
        "GET / HTTP/1.1\r\n\r\n",  # no Host at all
        f"GET https://other-host.example/ HTTP/1.1\r\nHost: {authority}\r\n\r\n",
        f"GET //other-host.example/ HTTP/1.1\r\nHost: {authority}\r\n\r\n",
        f"GET * HTTP/1.1\r\nHost: {authority}\r\n\r\n",
    ]
    context = _client_context(proxy, tmp_path)
    for request in misdirected:
        answer = await _raw_request(proxy, authority, request.encode(), tls=context)
        assert answer.startswith((b"HTTP/1.1 421 ", b"HTTP/1.1 400 ")), (request, answer)
        assert b"endpointd proxy" in answer
    assert server.authorizations == []
    # The same request naming the CONNECT host, in any case or absolute form, goes through.
    for request in (
        f"GET /api/a HTTP/1.1\r\nHost: LOCALHOST:{server.port}\r\n\r\n",
        f"GET https://{authority}/api/b HTTP/1.1\r\nHost: {authority}\r\n\r\n",
    ):
        answer = await _raw_request(proxy, authority, request.encode(), tls=context)
        assert answer.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200")), (request, answer)
    assert len(server.authorizations) == 2


class _Recorder:
    """An HTTPS server that keeps every byte it receives and answers every request head it
    sees (as a server that ignores ``Connection: close`` would), so a test sees exactly
    what a proxy forwarded. After its first answer it waits a little for more, then closes."""

    def __init__(self, test_ca: TestCA) -> None:
        cert, key = test_ca.issue("recorder", ["localhost"])
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        self.received = b""
        self.port = 0

    async def __aenter__(self) -> _Recorder:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            self.received += await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            # A forwarded second request would already be on its way (sent in one write).
            while more := await asyncio.wait_for(reader.read(65536), 2):
                self.received += more
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def test_nothing_after_the_one_request_goes_upstream(
    token: str, tmp_path: Path, test_ca: TestCA
) -> None:
    """Behind one Host check, a second request pipelined in the same tunnel (naming another
    host), or smuggled in a body whose framing is ambiguous, is never forwarded."""
    async with _Recorder(test_ca) as recorder:
        authority = f"localhost:{recorder.port}"
        proxy = CredentialProxy(
            injections=[
                Injection(API, [authority], "Authorization: Bearer {secret}", token.encode())
            ],
            ca=DeviceCA.generate(),
            upstream_context=ssl.create_default_context(cafile=str(test_ca.ca_file)),
        )
        await proxy.start()
        try:
            context = _client_context(proxy, tmp_path)
            second = "GET /second HTTP/1.1\r\nHost: other-host.example\r\n\r\n"
            pipelined = (
                f"POST /first HTTP/1.1\r\nHost: {authority}\r\nContent-Length: 5\r\n\r\nhello"
                + second
            )
            answer = await _raw_request(proxy, authority, pipelined.encode(), tls=context)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            chunked = (
                f"POST /chunked HTTP/1.1\r\nHost: {authority}\r\nTransfer-Encoding: chunked\r\n"
                "\r\n5\r\nhello\r\n0\r\n\r\n" + second
            )
            answer = await _raw_request(proxy, authority, chunked.encode(), tls=context)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            smuggled = (
                f"POST /smuggle HTTP/1.1\r\nHost: {authority}\r\nContent-Length: 4\r\n"
                "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + second
            )
            answer = await _raw_request(proxy, authority, smuggled.encode(), tls=context)
            assert answer.startswith(b"HTTP/1.1 400"), answer
        finally:
            proxy.close()
    assert b"/first" in recorder.received
    assert b"hello" in recorder.received
    assert b"/chunked" in recorder.received
    assert b"0\r\n\r\n" in recorder.received
    assert b"/second" not in recorder.received, recorder.received
    assert b"other-host" not in recorder.received
    assert b"/smuggle" not in recorder.received
    assert recorder.received.count(token.encode()) == 2  # the two requests it let through


async def test_the_proxy_wants_its_token(
    direct: tuple[CredentialProxy, HttpsServer], tmp_path: Path
) -> None:
    proxy, server = direct
    authority = f"localhost:{server.port}"
    for auth in ("", "endpointd:wrong-token", f"endpointd:{proxy.token}x"):
        answer = await _raw_request(proxy, authority, b"", auth=auth)
        assert answer.startswith(b"HTTP/1.1 407 "), answer
        assert b'Proxy-Authenticate: Basic realm="endpointd"' in answer
    assert server.authorizations == []


async def test_plain_http_never_carries_a_credential(token: str, tmp_path: Path) -> None:
    with _PlainServer() as plain:
        proxy = CredentialProxy(
            injections=[
                Injection(API, [f"127.0.0.1:{plain.port}"], "X-Api-Key: {secret}", token.encode())
            ],
            ca=DeviceCA.generate(),
            egress=Egress(network="proxy", allow_hosts=()),
        )
        await proxy.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            auth = base64.b64encode(f"endpointd:{proxy.token}".encode()).decode()
            writer.write(
                f"GET http://127.0.0.1:{plain.port}/x HTTP/1.1\r\nHost: 127.0.0.1:{plain.port}\r\n"
                f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode()
            )
            answer = await asyncio.wait_for(reader.read(-1), 30)
            writer.close()
            # The URL names an allowed host, the Host header another (fronting): refused.
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(
                f"GET http://127.0.0.1:{plain.port}/x HTTP/1.1\r\nHost: other-host.example\r\n"
                f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode()
            )
            fronted = await asyncio.wait_for(reader.read(-1), 30)
            writer.close()
        finally:
            proxy.close()
    assert b"plain ok" in answer
    assert fronted.startswith(b"HTTP/1.1 421 "), fronted
    assert len(plain.server.seen) == 1
    assert "x-api-key" not in plain.server.seen[0].lower()
    assert token not in plain.server.seen[0]
    assert "proxy-authorization" not in plain.server.seen[0].lower()


async def test_a_refused_host_is_named_with_the_policy_key(tmp_path: Path) -> None:
    proxy = CredentialProxy(egress=Egress(network="proxy", allow_hosts=("*.example.com",)))
    await proxy.start()
    try:
        answer = await _raw_request(proxy, "evil.example:443", b"")
        assert answer.startswith(b"HTTP/1.1 403 "), answer
        assert b"evil.example:443" in answer
        assert b"[proxy] allow_hosts" in answer
        denied = CredentialProxy(egress=Egress(network="deny"))
        await denied.start()
        try:
            answer = await _raw_request(denied, "a.example.com:443", b"")
            assert b'network = "deny"' in answer, answer
        finally:
            denied.close()
    finally:
        proxy.close()


def test_injection_refuses_what_cannot_be_one_header_line() -> None:
    with pytest.raises(ValueError, match="line break") as raised:
        Injection("x", ["h"], "Authorization: Bearer {secret}", b"SECRET\r\nX-Evil: 1")
    assert "SECRET" not in str(raised.value)
    with pytest.raises(ValueError, match="header must be"):
        Injection("x", ["h"], "no colon {secret}", b"SECRET-1")


async def test_prepare_sets_up_the_proxy_and_the_bundle(tmp_path: Path, token: str) -> None:
    prepared = delivery.prepare(
        tmp_path / "spool",
        [CredentialRef(name=API, delivery=Delivery.HTTP)],
        {API: token.encode()},
        scopes={API: CredentialScope(allow=("*",), hosts=("api.example.com",))},
        directory=tmp_path,
    )
    try:
        assert prepared.proxy_port
        env = prepared.apply({"NO_PROXY": "localhost", "SSL_CERT_FILE": "/elsewhere"})
        assert env["HTTPS_PROXY"].endswith(f"@127.0.0.1:{prepared.proxy_port}")
        assert env["NO_PROXY"] == env["no_proxy"] == ""
        bundle = tmp_path / "ca-bundle.pem"
        assert env["SSL_CERT_FILE"] == env["GIT_SSL_CAINFO"] == str(bundle)
        assert oct(bundle.stat().st_mode & 0o777) == "0o644"
        assert token not in repr(prepared) + json.dumps(env)
        await prepared.start()
    finally:
        prepared.close()
    assert not (tmp_path / "ca-bundle.pem").exists()
    # network = "proxy" without credentials: a proxy, no CA bundle.
    egress_only = delivery.prepare(
        tmp_path / "spool", [], {}, egress=Egress(network="proxy", allow_hosts=("a.example",))
    )
    try:
        assert egress_only.proxy_port
        assert "SSL_CERT_FILE" not in egress_only.env
    finally:
        egress_only.close()


def test_device_ca_leaves_and_bundle(tmp_path: Path) -> None:
    ca = DeviceCA.generate()
    cert_pem, _ = ca.leaf_pem("api.example.com")
    leaf = x509.load_pem_x509_certificate(cert_pem)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["api.example.com"]
    assert (leaf.not_valid_after_utc - leaf.not_valid_before_utc).days <= 1
    ip_leaf = x509.load_pem_x509_certificate(ca.leaf_pem("127.0.0.1")[0])
    ip_names = ip_leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(a) for a in ip_names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert ca.server_context("api.example.com") is ca.server_context("API.example.com")
    bundle = write_bundle(tmp_path, ca).read_bytes()
    assert bundle.endswith(ca.cert_pem)
    assert system_trust_pem() in bundle
    assert b"PRIVATE KEY" not in bundle


def test_the_daemons_own_secrets_for_the_redactor(tmp_path: Path) -> None:
    for name in (
        "GITHUB_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "DB_PASSWORD",
        "OPENAI_API_KEY",
        "SIGNING_KEY",
        "my_passwd",
        "GOOGLE_CREDENTIALS",
    ):
        assert secret_looking(name), name
    for name in (
        "PATH",
        "HOME",
        "KEYBOARD",
        "SSH_AUTH_SOCK",
        "TOKEN_FILE",
        "PYTHON_KEYRING_BACKEND",
    ):
        assert not secret_looking(name), name
    found = environment_secrets(
        {"GH_TOKEN": "ghp_0123456789", "X_TOKEN": "short", "LANG": "C.UTF-8"}
    )
    assert list(found.values()) == [b"ghp_0123456789"]

    key = DeviceKey(Ed25519PrivateKey.generate())
    key_file = tmp_path / "device.key"
    _write_key_file(key_file, key)
    own = own_secrets(KeyConfig(storage="file", path=str(key_file)), {"API_KEY": "abcdefgh-123"})
    assert own["endpointd:device-key"] == key._raw_private()
    redactor = Redactor(own)
    # The key file as it is (PEM) and the keyring's base64 form are both masked.
    assert MASKED * 3 in redactor.bytes(key_file.read_bytes())
    assert redactor.bytes(base64.b64encode(key._raw_private())).count(b"*") >= 40
    assert redactor.bytes(b"key=abcdefgh-123") == b"key=" + b"*" * 12


def test_a_loaded_device_ca_key_is_masked_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = DeviceCA.generate()
    monkeypatch.setitem(ca_module._CACHE, tmp_path, ca)
    redactor = Redactor(own_secrets(None, {}))
    pem = ca_module._key_pem(ca._key)
    masked = redactor.bytes(pem)
    body = [line for line in masked.splitlines() if not line.startswith(b"-----")]
    assert body
    assert all(set(line) == {ord("*")} for line in body), masked
    assert b"-----BEGIN PRIVATE KEY-----" in masked  # the armour is no secret
