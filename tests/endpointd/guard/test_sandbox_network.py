"""A rogue command against the network modes: the host's sockets are out of reach by any
address, not only by port.

Each test runs a real endpointd with a scripted gateway (as ``test_sandbox_rogue.py``) and
sends an allowed command that tries to reach listeners the test starts on the host. Under
``proxy`` the command learns the proxy's port from its own ``HTTPS_PROXY`` and connects
straight to that port on other local addresses (a port-only rule let it through); under
``deny`` it looks for, and at, what listens on the host's loopback.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import sys
import threading
from pathlib import Path

import pytest

from endpointd.guard import landlock
from superagent_proto.v1 import endpoint_pb2 as pb
from tests.fakes.endpointd_process import Endpointd, start_paired
from tests.fakes.gateway_server import FakeGateway
from tests.support.helpers import assert_eventually
from tests.support.listeners import Greeter

pytestmark = pytest.mark.skipif(landlock.abi_version() < 6, reason="needs Landlock ABI 6")


def _own_address() -> str | None:
    """This machine's address on its default route, if it has one (not loopback)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 9))  # no packet is sent: this only picks a route
        address = str(s.getsockname()[0])
        if not address.startswith("127."):
            return address
    return None


def _listeners(port: int) -> list[Greeter]:
    """Listeners on ``port`` at every local address but 127.0.0.1: 127.0.0.2, ::1 and this
    machine's own address."""
    out = [Greeter.tcp("127.0.0.2", port)]
    with contextlib.suppress(OSError):  # (a machine without IPv6 has no ::1 to reach)
        out.append(Greeter.tcp("::1", port, socket.AF_INET6))
    own = _own_address()
    if own is not None:
        out.append(Greeter.tcp(own, port))
    return out


async def _device(gw: FakeGateway, endpointd: Endpointd, tmp_path: Path, extra: str) -> str:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    device = await start_paired(gw, endpointd)
    policy = f'allowed_roots = [{json.dumps(str(work))}]\ndefault_action = "allow"\n{extra}\n'
    policy_file = endpointd.config_dir / "policy.toml"
    policy_file.write_text(policy)
    policy_file.chmod(0o600)
    return device


async def _finished(gw: FakeGateway, command_id: str) -> bytes:
    ended = await assert_eventually(
        lambda: gw.refused(command_id) or gw.finished(command_id), timeout=60
    )
    assert isinstance(ended, pb.Finished), f"refused: {ended}"
    return gw.output(command_id)


# The command: tell the proxy's port, wait for the test's listeners (a file in the workspace),
# then connect straight to that port on each address given, and fetch the allowed URL
# through the proxy as a program normally would.
DIRECT_PROBE = r"""
import json, os, socket, sys, time, urllib.request
from urllib.parse import urlsplit
port = urlsplit(os.environ["HTTPS_PROXY"]).port
print("port", port, flush=True)
go = sys.argv[1]
deadline = time.monotonic() + 30
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.01)
result = {}
for host in json.load(open(go)):
    try:
        with socket.create_connection((host, port), timeout=5) as s:
            result[host] = "reached " + s.recv(100).decode(errors="replace")
    except OSError as exc:
        result[host] = "blocked %s" % exc.errno
try:
    with urllib.request.urlopen(sys.argv[2], timeout=30) as r:
        result["through the proxy"] = [r.status, r.read().decode().strip()]
except Exception as exc:
    result["through the proxy"] = repr(exc)
print(json.dumps(result), flush=True)
"""


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"allowed host ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


async def test_under_proxy_no_address_on_the_proxys_port_is_reachable_directly(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    allowed = f"127.0.0.1:{server.server_address[1]}"
    work = tmp_path / "work"
    device = await _device(
        gw, endpointd, tmp_path, f'network = "proxy"\n[proxy]\nallow_hosts = ["{allowed}"]'
    )
    go = work / "go.json"
    argv = [sys.executable, "-c", DIRECT_PROBE, str(go), f"http://{allowed}/"]
    sent = gw.send(device, pb.Command(exec=pb.ExecCommand(argv=argv, cwd=str(work))))
    said = await assert_eventually(
        lambda: gw.output(sent.command_id) if b"port " in gw.output(sent.command_id) else None,
        timeout=60,
    )
    port = int(said.split(b"port ")[1].split()[0])
    listeners = _listeners(port)
    try:
        hosts = [str(listener.sock.getsockname()[0]) for listener in listeners]
        go.write_text(json.dumps(hosts))
        output = await _finished(gw, sent.command_id)
        result = json.loads(output.decode().strip().splitlines()[-1])
        for host in hosts:
            assert result[host].startswith("blocked"), (host, result)
        assert [listener.hits for listener in listeners] == [0] * len(listeners)
        # The way out that remains: the proxy, for the hosts the policy lists.
        assert result["through the proxy"] == [200, "allowed host ok"], result
    finally:
        for listener in listeners:
            listener.close()
        server.shutdown()


# The command under deny: what listens on the host (its TCP tables), a connection to the
# host's listener at each address, and a server of its own on the same port.
DENY_PROBE = r"""
import json, socket, sys
port = int(sys.argv[1])
result = {"seen": [], "own": None}
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        rows = open(table).read().splitlines()[1:]
    except OSError:
        continue
    for row in rows:
        local = row.split()[1]
        if int(local.rsplit(":", 1)[1], 16) == port:
            result["seen"].append(table)
for host in json.loads(sys.argv[2]):
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect((host, port))
            result[host] = "reached " + s.recv(100).decode(errors="replace")
    except OSError as exc:
        result[host] = "blocked %s" % exc.errno
try:
    with socket.create_server(("127.0.0.1", port)) as server:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            conn, _ = server.accept()
            conn.sendall(b"its own")
            result["own"] = client.recv(100).decode()
            conn.close()
except OSError as exc:
    result["own"] = "failed %s" % exc.errno
print(json.dumps(result), flush=True)
"""


async def test_under_deny_the_hosts_loopback_is_out_of_reach_and_its_own_is_private(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    loopback = Greeter.tcp()
    listeners = [loopback, *_listeners(loopback.port)]
    hosts = [str(listener.sock.getsockname()[0]) for listener in listeners]
    work = tmp_path / "work"
    device = await _device(gw, endpointd, tmp_path, 'network = "deny"')
    argv = [sys.executable, "-c", DENY_PROBE, str(loopback.port), json.dumps(hosts)]
    try:
        sent = gw.send(device, pb.Command(exec=pb.ExecCommand(argv=argv, cwd=str(work))))
        output = await _finished(gw, sent.command_id)
        result = json.loads(output.decode().strip().splitlines()[-1])
        assert result["seen"] == [], result  # the host's listeners are not even listed
        for host in hosts:
            assert result[host].startswith("blocked"), (host, result)
        assert [listener.hits for listener in listeners] == [0] * len(listeners)
        # Its loopback is its own: a server there is reached by the command alone, even on
        # the port the host's listener holds.
        assert result["own"] == "its own", result
    finally:
        for listener in listeners:
            listener.close()


@pytest.mark.parametrize("network", ["deny", "proxy"])
async def test_a_command_cannot_leave_its_network_namespace_by_netlink_or_vsock(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path, network: str
) -> None:
    """Families the namespace does not contain (vsock reaches a VM's host whatever the
    namespace) stay closed by seccomp: the kernel layers remain beneath the namespace."""
    work = tmp_path / "work"
    device = await _device(gw, endpointd, tmp_path, f'network = "{network}"')
    script = (
        "import socket\n"
        "for name in ('AF_NETLINK', 'AF_PACKET', 'AF_VSOCK'):\n"
        "    family = getattr(socket, name, None)\n"
        "    if family is None:\n"
        "        continue\n"
        "    try:\n"
        "        socket.socket(family, socket.SOCK_DGRAM if name != 'AF_VSOCK'"
        " else socket.SOCK_STREAM).close()\n"
        "        print(name, 'opened')\n"
        "    except OSError as exc:\n"
        "        print(name, 'blocked', exc.errno)\n"
    )
    sent = gw.send(
        device,
        pb.Command(exec=pb.ExecCommand(argv=[sys.executable, "-c", script], cwd=str(work))),
    )
    output = await _finished(gw, sent.command_id)
    assert b"opened" not in output, output
    assert b"AF_NETLINK blocked" in output, output


def _loopback_name() -> str | None:
    """A host name (not `localhost`, not an address) this machine resolves to loopback
    only, as a name under an allowed wildcard might resolve (/etc/hosts, the host name)."""
    names = [socket.gethostname(), "localhost.localdomain"]
    with contextlib.suppress(OSError), open("/etc/hosts") as hosts:
        for line in hosts:
            fields = line.split("#", 1)[0].split()
            if fields and fields[0] in ("127.0.0.1", "::1", "127.0.1.1"):
                names += fields[1:]
    for name in names:
        if not name or name.lower() == "localhost" or name.replace(".", "").isdigit():
            continue
        with contextlib.suppress(OSError):
            infos = socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)
            if infos and all(str(i[4][0]) in ("127.0.0.1", "::1", "127.0.1.1") for i in infos):
                return name
    return None


NAME_PROBE = r"""
import json, re, sys, urllib.error, urllib.request
result = {}
for kind, url in (("plain", sys.argv[1]), ("tunnel", sys.argv[2])):
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            result[kind] = [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        result[kind] = [e.code, e.read().decode()]
    except urllib.error.URLError as e:
        found = re.search(r"Tunnel connection failed: (\d+)", str(e.reason))
        result[kind] = ["tunnel " + found.group(1)] if found else [str(e)]
print(json.dumps(result), flush=True)
"""


async def test_under_proxy_an_allowed_name_never_leads_to_this_machine(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    """The proxy is the namespace's one way out, and it runs on the host: a name the owner
    allowed that resolves to loopback (or a cloud VM's metadata address, as
    ``ec2-169-254-169-254.compute-1.amazonaws.com`` under ``*.amazonaws.com`` does) must
    not lead there. An address named literally still does (the first test)."""
    name = _loopback_name()
    if name is None:
        pytest.skip("no host name resolves to loopback only on this machine")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    hits: list[str] = []
    server.RequestHandlerClass = type(
        "Counted", (_Hello,), {"log_request": lambda self, *a: hits.append(self.path)}
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        device = await _device(
            gw,
            endpointd,
            tmp_path,
            f'network = "proxy"\n[proxy]\nallow_hosts = ["{name}:{port}"]',
        )
        argv = [
            sys.executable,
            "-c",
            NAME_PROBE,
            f"http://{name}:{port}/plain",
            f"https://{name}:{port}/tunnel",
        ]
        sent = gw.send(
            device, pb.Command(exec=pb.ExecCommand(argv=argv, cwd=str(tmp_path / "work")))
        )
        output = await _finished(gw, sent.command_id)
        result = json.loads(output.decode().strip().splitlines()[-1])
        assert result["plain"][0] == 403, result
        assert "this machine" in result["plain"][1], result
        assert result["tunnel"] == ["tunnel 403"], result
        assert hits == []
    finally:
        server.shutdown()
