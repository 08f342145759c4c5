"""`endpointd pair`: TLS pinning, fingerprints, key storage and server refusals.

Real `endpointd pair` subprocesses against the fake gateway; every failure must be one
clear line on stderr, a non-zero exit, no traceback, and nothing half-written left behind.
"""

from __future__ import annotations

import json
import socket
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization

from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared.gateway_tls import format_fingerprint, generate_gateway_certificates
from tests.fakes.endpointd_process import Endpointd, endpointd_in, start_paired
from tests.fakes.gateway_server import FakeGateway, exec_command
from tests.support.helpers import assert_eventually


@pytest.fixture
def endpointd(tmp_path: Path) -> Iterator[Endpointd]:
    with endpointd_in(tmp_path) as daemon:
        yield daemon


@pytest.fixture
def gw() -> Iterator[FakeGateway]:
    with FakeGateway(tls=True) as gateway:
        yield gateway


def _one_line_error(proc: object) -> str:
    import subprocess

    assert isinstance(proc, subprocess.CompletedProcess)
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return str(lines[0])


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_pair_over_tls_pins_the_ca_and_writes_private_files(
    gw: FakeGateway, endpointd: Endpointd
) -> None:
    code = gw.add_pairing_code("ABCD2345")
    proc = endpointd.pair(gw.url, code, "--name", "alice-laptop", "--fingerprint", gw.fingerprint)
    assert proc.returncode == 0, proc.stderr
    assert "paired with fake superagent as dev_" in proc.stdout
    assert gw.fingerprint in proc.stdout

    (request,) = gw.pair_requests
    assert request.pairing_code == "ABCD2345"
    assert request.device_name == "alice-laptop"
    assert len(request.public_key) == 32
    assert request.protocol_version == 1
    assert request.platform == sys.platform
    assert request.hostname == socket.gethostname()
    assert request.daemon_version

    config_file = endpointd.config_dir / "config.json"
    config = json.loads(config_file.read_text())
    assert config["server_url"] == gw.url
    assert config["device_id"] == next(iter(gw.keys))
    assert config["server_name"] == "fake superagent"
    assert config["trust"]["mode"] == "pinned"
    assert gw.certs is not None
    assert config["trust"]["ca_pem"].encode() == gw.certs.ca_pem
    assert bytes.fromhex(config["trust"]["leaf_sha256"]) == gw.certs.cert_sha256
    assert config["key"] == {
        "storage": "file",
        "service": "",
        "username": "",
        "path": str(endpointd.key_file),
    }
    assert config["public_key"] == request.public_key.hex()
    assert config["paired_at"]
    assert _mode(config_file) == 0o600
    assert _mode(endpointd.config_dir) == 0o700
    assert _mode(endpointd.key_file) == 0o600
    private = serialization.load_pem_private_key(endpointd.key_file.read_bytes(), None)
    public = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    assert public == request.public_key

    again = endpointd.pair(gw.url, gw.add_pairing_code("SECOND22"))
    assert "already paired" in _one_line_error(again)


def test_default_device_name_is_the_hostname_and_fingerprint_is_optional(
    gw: FakeGateway, endpointd: Endpointd
) -> None:
    proc = endpointd.pair(gw.url, gw.add_pairing_code("NOFP1234"))
    assert proc.returncode == 0, proc.stderr
    assert gw.pair_requests[0].device_name == socket.gethostname()


def test_fingerprint_mismatch_aborts_before_the_code_is_sent(
    gw: FakeGateway, endpointd: Endpointd
) -> None:
    other = generate_gateway_certificates()
    code = gw.add_pairing_code("MISMATCH")
    proc = endpointd.pair(gw.url, code, "--fingerprint", format_fingerprint(other.cert_sha256))
    error = _one_line_error(proc)
    assert "certificate fingerprint mismatch — possible interception" in error
    assert gw.pair_requests == []  # the single-use code was never spent
    assert not endpointd.key_file.exists()
    assert not (endpointd.config_dir / "config.json").exists()

    # The same check accepts plain hex without colons or prefix, in any case.
    assert gw.certs is not None
    proc = endpointd.pair(gw.url, code, "--fingerprint", gw.certs.cert_sha256.hex().upper())
    assert proc.returncode == 0, proc.stderr


def test_bad_fingerprint_syntax_is_a_usage_error(gw: FakeGateway, endpointd: Endpointd) -> None:
    proc = endpointd.pair(gw.url, "CODE", "--fingerprint", "sha256:zz")
    assert proc.returncode == 2
    assert "--fingerprint" in proc.stderr


@pytest.mark.parametrize(
    "url", ["http://example.com:8443", "http://10.0.0.5:8443", "http://[2001:db8::1]:1"]
)
def test_plaintext_to_a_non_loopback_host_is_refused(endpointd: Endpointd, url: str) -> None:
    error = _one_line_error(endpointd.pair(url, "CODE1234"))
    assert "refusing plaintext http://" in error
    assert "https://" in error


def test_malformed_urls_are_refused(endpointd: Endpointd) -> None:
    assert "must look like https://" in _one_line_error(endpointd.pair("ftp://x:1", "C"))
    assert "just scheme, host and port" in _one_line_error(
        endpointd.pair("https://host:1/path", "C")
    )


def test_without_a_keyring_or_key_file_pairing_explains_the_fix(
    gw: FakeGateway, endpointd: Endpointd
) -> None:
    proc = endpointd.cli(
        "pair", gw.url, gw.add_pairing_code("NOKEYRING"), "--allow-root", str(endpointd.root)
    )
    error = _one_line_error(proc)
    assert "no OS keyring backend is available" in error
    assert "--key-file PATH" in error
    assert "gnome-keyring" in error
    assert gw.pair_requests == []


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "too many attempts"),
        (grpc.StatusCode.INVALID_ARGUMENT, "unsupported protocol version"),
    ],
)
def test_server_refusals_are_one_clear_line_and_leave_nothing_behind(
    gw: FakeGateway, endpointd: Endpointd, status: grpc.StatusCode, message: str
) -> None:
    code = gw.add_pairing_code("REFUSED1", error=(status, message))
    error = _one_line_error(endpointd.pair(gw.url, code))
    assert f"{status.name}: {message}" in error
    assert not endpointd.key_file.exists()
    assert not (endpointd.config_dir / "config.json").exists()


def test_unknown_code_is_permission_denied(gw: FakeGateway, endpointd: Endpointd) -> None:
    error = _one_line_error(endpointd.pair(gw.url, "WRONG123"))
    assert "PERMISSION_DENIED" in error


def test_pair_response_naming_another_certificate_is_refused(
    gw: FakeGateway, endpointd: Endpointd
) -> None:
    def wrong_cert(response: pb.PairResponse) -> pb.PairResponse:
        response.server_cert_sha256 = b"\x00" * 32
        return response

    gw.pair_response_hook = wrong_cert
    error = _one_line_error(endpointd.pair(gw.url, gw.add_pairing_code("TAMPER01")))
    assert "possible interception" in error
    assert not endpointd.key_file.exists()

    other_ca = generate_gateway_certificates().ca_pem.decode()

    def wrong_ca(response: pb.PairResponse) -> pb.PairResponse:
        response.server_ca_pem = other_ca
        return response

    gw.pair_response_hook = wrong_ca
    error = _one_line_error(endpointd.pair(gw.url, gw.add_pairing_code("TAMPER02")))
    assert "different CA" in error


def test_key_file_readable_by_others_is_refused(gw: FakeGateway, endpointd: Endpointd) -> None:
    endpointd.key_file.write_bytes(b"irrelevant")
    endpointd.key_file.chmod(0o644)
    error = _one_line_error(endpointd.pair(gw.url, gw.add_pairing_code("LOOSE123")))
    assert "chmod 600" in error
    assert gw.pair_requests == []


async def test_plaintext_pairing_on_loopback_and_exec(endpointd: Endpointd) -> None:
    with FakeGateway(tls=False) as gw:
        device = await start_paired(gw, endpointd)
        config = json.loads((endpointd.config_dir / "config.json").read_text())
        assert config["trust"] == {"mode": "plaintext", "ca_pem": "", "leaf_sha256": ""}
        sent = gw.send(device, exec_command(["echo", "plain"]))
        await assert_eventually(lambda: gw.finished(sent.command_id))
        assert gw.output(sent.command_id) == b"plain\n"


async def test_publicly_trusted_certificate_uses_system_trust(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    # Make the fake's CA a "public" one for both Python's ssl and gRPC's default roots.
    assert gw.certs is not None
    roots = tmp_path / "roots.pem"
    roots.write_bytes(gw.certs.ca_pem)
    endpointd.env["SSL_CERT_FILE"] = str(roots)
    endpointd.env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(roots)
    url = f"https://localhost:{gw.port}"
    code = gw.add_pairing_code("SYSTEM12")
    proc = endpointd.pair(url, code)
    assert proc.returncode == 0, proc.stderr
    config = json.loads((endpointd.config_dir / "config.json").read_text())
    assert config["trust"]["mode"] == "system"
    assert config["trust"]["ca_pem"] == ""
    endpointd.start()
    device = config["device_id"]
    await assert_eventually(lambda: gw.connected(device), timeout=15, message=endpointd.log())


async def test_status_then_unpair_deletes_key_and_config_but_keeps_the_journal(
    gw: FakeGateway, endpointd: Endpointd
) -> None:
    device = await start_paired(gw, endpointd)
    sent = gw.send(device, exec_command(["true"]))
    await assert_eventually(lambda: gw.finished(sent.command_id))

    report = json.loads(endpointd.cli("status", "--json").stdout)
    assert report["paired"] is True
    assert report["device_id"] == device
    assert report["trust"] == "pinned"
    assert report["daemon"]["running"] is True
    assert report["daemon"]["state"] == "connected"
    # How commands are sandboxed: the running daemon's own account, as sent in its Hello.
    assert report["sandbox"] == gw.hellos(device)[-1].sandbox
    assert report["sandbox"].startswith(("required", "best-effort"))
    assert report["sandbox_from"] == "daemon"
    human = endpointd.cli("status").stdout
    assert device in human
    assert "connected (pid" in human
    assert f"sandbox:   {report['sandbox']}\n" in human

    refused = endpointd.cli("unpair")
    assert "stop it first" in _one_line_error(refused)
    # Two daemons on one journal would both start its commands: the second one refuses.
    second = endpointd.cli("run")
    assert "already running" in second.stderr
    assert second.returncode == 1

    endpointd.stop()
    report = json.loads(endpointd.cli("status", "--json").stdout)
    assert report["daemon"]["running"] is False
    assert report["sandbox_from"] == "policy file"  # what a daemon started now would do
    assert report["sandbox"] == gw.hellos(device)[-1].sandbox
    proc = endpointd.cli("unpair")
    assert proc.returncode == 0, proc.stderr
    assert "device key deleted" in proc.stdout
    assert not endpointd.key_file.exists()
    assert not (endpointd.config_dir / "config.json").exists()
    assert (endpointd.state_dir / "journal.sqlite3").exists()

    # Pair again (a new key) and purge on the way out this time.
    endpointd.pair_with(gw)
    proc = endpointd.cli("unpair", "--purge")
    assert proc.returncode == 0, proc.stderr
    assert not endpointd.state_dir.exists()


def test_pair_writes_the_network_mode_into_a_new_policy_only(
    gw: FakeGateway, endpointd: Endpointd
) -> None:
    """`superagent up --device` pairs with --network proxy: its new policy sends commands
    out only through the proxy. An owner's existing policy is never changed."""
    from endpointd.rules.parser import parse_policy

    policy = endpointd.config_dir / "policy.toml"
    code = gw.add_pairing_code("NETWORK2")
    proc = endpointd.pair(gw.url, code, "--fingerprint", gw.fingerprint, "--network", "proxy")
    assert proc.returncode == 0, proc.stderr
    assert parse_policy(policy.read_text(), policy).network == "proxy"

    other = Endpointd(endpointd.root.parent, name="second")
    try:
        other.config_dir.mkdir(parents=True)
        policy = other.config_dir / "policy.toml"
        policy.write_text(f"allowed_roots = [{json.dumps(str(other.root.parent))}]\n")
        code = gw.add_pairing_code("NETWORK3")
        proc = other.pair(gw.url, code, "--fingerprint", gw.fingerprint, "--network", "proxy")
        assert proc.returncode == 0, proc.stderr
        assert parse_policy(policy.read_text(), policy).network == "allow"
    finally:
        other.cleanup()


def test_pair_and_unpair_json_say_what_changed(gw: FakeGateway, endpointd: Endpointd) -> None:
    proc = endpointd.pair(gw.url, gw.add_pairing_code("JSON2345"), "--json")
    assert proc.returncode == 0, proc.stderr
    paired = json.loads(proc.stdout)  # the whole of stdout: one document
    assert paired["paired"] is True
    assert paired["device_id"] == next(iter(gw.keys))
    assert paired["url"] == gw.url
    assert paired["server_name"] == "fake superagent"
    assert paired["trust"] == "pinned"
    assert gw.certs is not None
    assert paired["certificate_sha256"] == gw.certs.cert_sha256.hex()
    assert paired["key_storage"] == "file"
    assert paired["key_file"] == str(endpointd.key_file)
    assert paired["allowed_roots"] == [str(endpointd.root.parent)]
    assert paired["policy"] == str(endpointd.config_dir / "policy.toml")
    # Where the key is, never the key.
    assert "PRIVATE KEY" not in proc.stdout
    assert endpointd.key_file.read_text().split("-----")[2].strip() not in proc.stdout

    proc = endpointd.cli("unpair", "--json")
    assert proc.returncode == 0, proc.stderr
    unpaired = json.loads(proc.stdout)
    assert unpaired == {
        "unpaired": True,
        "device_id": paired["device_id"],
        "url": gw.url,
        "server_name": "fake superagent",
        "key_storage": "file",
        "key_file": str(endpointd.key_file),
        "key_deleted": True,
        "purged": None,
    }
    assert not endpointd.key_file.exists()
    # Errors keep their one line on stderr, with nothing on stdout.
    again = endpointd.cli("unpair", "--json")
    assert "not paired" in _one_line_error(again)
    assert again.stdout == ""
