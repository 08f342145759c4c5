"""Version negotiation between endpointd and the gateway, through real gRPC.

Each side states the protocol versions it speaks and its release; they agree on the highest
version both speak. A daemon too old or too new gets one line naming both versions and the
command that fixes it, the gateway logs which device it refused, and a daemon keeps its
pairing across an upgrade of its own release.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

import controlplane
from controlplane.gateway.server import EndpointGateway
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_proto.v1 import endpoint_pb2_grpc
from superagent_shared.protocol import (
    PROTOCOL_MAX_VERSION,
    PROTOCOL_MIN_VERSION,
    Speaker,
    hello_signing_payload,
    negotiate,
)
from tests.support.daemon import Daemon, daemon_beside
from tests.support.gateway_harness import (  # noqa: F401 - fixtures
    FakeDevice,
    Gateway,
    gateway_fixture,
    paired,
)
from tests.support.helpers import assert_eventually

SERVER = controlplane.__version__
NEWER = PROTOCOL_MAX_VERSION + 1  # a version no release speaks yet


def test_the_agreed_version_is_the_highest_both_speak() -> None:
    assert negotiate(Speaker("d", 1, 3), Speaker("s", 2, 5)) == 3
    assert negotiate(Speaker("d", 2, 5), Speaker("s", 1, 3)) == 3
    assert negotiate(Speaker("d", 1, 1), Speaker("s", 1, 4)) == 1
    assert negotiate(Speaker("d", 4, 4), Speaker("s", 1, 4)) == 4
    assert negotiate(Speaker("d", 1, 1), Speaker("s", 2, 3)) is None
    assert negotiate(Speaker("d", 4, 6), Speaker("s", 2, 3)) is None


def _one_line(text: str) -> str:
    assert "\n" not in text, text
    assert "Traceback" not in text, text
    return text


async def test_pairing_a_daemon_too_new_names_both_versions_and_the_fix(
    gateway: Gateway,
) -> None:
    device = FakeDevice(gateway)
    async with gateway.channel() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await endpoint_pb2_grpc.EndpointGatewayStub(channel).Pair(
                pb.PairRequest(
                    pairing_code=await gateway.pairing_code("future"),
                    device_name="future",
                    public_key=device.public_key,
                    daemon_version="9.9.9",
                    protocol_version=NEWER,
                    max_protocol_version=NEWER + 1,
                )
            )
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    line = _one_line(refused.value.details() or "")
    assert f"endpointd 9.9.9 (protocol {NEWER}-{NEWER + 1})" in line
    assert f"control plane {SERVER} (protocol {PROTOCOL_MIN_VERSION}" in line
    assert "upgrade the control plane" in line
    assert f"pip install endpointd=={SERVER}" in line


async def _connect_as(
    device: FakeDevice, *, release: str, low: int, high: int
) -> tuple[pb.Challenge, grpc.StatusCode, str]:
    """Connect speaking ``low``..``high``, as a daemon that found no common version does
    (it still says Hello, naming its newest version, so the server can record why)."""
    async with device.gateway.channel() as channel:
        outgoing: asyncio.Queue[pb.DeviceMessage] = asyncio.Queue()

        async def requests() -> AsyncIterator[pb.DeviceMessage]:
            yield await outgoing.get()

        call = endpoint_pb2_grpc.EndpointGatewayStub(channel).Connect(requests())
        first = await call.read()
        assert isinstance(first, pb.ServerMessage)
        challenge = first.challenge
        signature = device.key.sign(
            hello_signing_payload(
                nonce=challenge.nonce,
                device_id=device.device_id,
                daemon_version=release,
                protocol_version=high,
                policy_hash=b"\x01" * 32,
            )
        )
        hello = pb.Hello(
            device_id=device.device_id,
            daemon_version=release,
            protocol_version=high,
            signature=signature,
            policy_hash=b"\x01" * 32,
            min_protocol_version=low,
            max_protocol_version=high,
        )
        await outgoing.put(pb.DeviceMessage(hello=hello))

        async def until_ended() -> None:
            while await call.read() is not grpc.aio.EOF:
                pass

        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await until_ended()
        return challenge, ended.value.code(), ended.value.details() or ""


async def test_a_daemon_too_new_is_refused_with_one_line_and_the_refusal_is_logged(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    device = await paired(gateway, "future")
    with caplog.at_level(logging.INFO, logger="controlplane.gateway"):
        challenge, code, details = await _connect_as(device, release="9.9.9", low=NEWER, high=NEWER)
    # The Challenge states the server's whole range and its release.
    assert (challenge.protocol_version, challenge.max_protocol_version) == (
        PROTOCOL_MIN_VERSION,
        PROTOCOL_MAX_VERSION,
    )
    assert challenge.server_version == SERVER
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    line = _one_line(details)
    assert f"endpointd 9.9.9 (protocol {NEWER}) is too new for the control plane {SERVER}" in line
    assert f"pip install endpointd=={SERVER}" in line
    # The gateway records which device it refused, and why.
    logged = [r.getMessage() for r in caplog.records if device.device_id in r.getMessage()]
    assert any("9.9.9" in m and f"protocol {NEWER}" in m for m in logged), logged


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_beside(tmp_path) as instance:
        yield instance


async def _pair(gateway: Gateway, daemon: Daemon) -> str:
    code = await gateway.pairing_code("laptop")
    result = await daemon.pair(
        f"https://127.0.0.1:{gateway.port}", code, "--fingerprint", gateway.tls.fingerprint
    )
    assert result.returncode == 0, result.stderr + result.stdout
    config = json.loads((daemon.home / "config" / "config.json").read_text())
    device_id = config["device_id"]
    assert isinstance(device_id, str)
    return device_id


@pytest.mark.slow
async def test_a_daemon_too_old_says_so_once_keeps_retrying_and_connects_after_the_upgrade(
    gateway: Gateway,
    daemon: Daemon,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    device_id = await _pair(gateway, daemon)
    # The control plane is upgraded to a release that no longer speaks this daemon's protocol.
    monkeypatch.setattr(EndpointGateway, "speaks", Speaker("9.0.0", NEWER, NEWER + 1))
    with caplog.at_level(logging.DEBUG, logger="controlplane.gateway"):
        daemon.start()

        def refusals() -> int:
            return sum(
                device_id in r.getMessage() and "too old" in r.getMessage() for r in caplog.records
            )

        # Two refusals: the daemon retried, and it did so with its backoff, not in a spin.
        await assert_eventually(lambda: refusals() >= 2, timeout=30, message=daemon.log())
    assert refusals() <= 3, caplog.text
    status = await daemon.status()
    daemon_status = status["daemon"]
    assert isinstance(daemon_status, dict)
    line = _one_line(str(daemon_status["last_error"]))
    assert line.startswith(f"endpointd {_endpointd_version()} (protocol {PROTOCOL_MAX_VERSION})")
    assert f"is too old for the control plane 9.0.0 (protocol {NEWER}-{NEWER + 1})" in line
    assert "pip install -U endpointd" in line
    assert "pipx upgrade endpointd" in line
    # Said once in the daemon's log for all its retries, with no traceback.
    log = daemon.log()
    assert log.count("is too old for the control plane") == 1, log
    assert "Traceback" not in log

    # The control plane speaks the daemon's version again (among newer ones): it connects,
    # on the highest version both speak, without re-pairing.
    monkeypatch.setattr(EndpointGateway, "speaks", Speaker("9.1.0", PROTOCOL_MAX_VERSION, NEWER))
    await daemon.wait_connected(timeout=30)


def _endpointd_version() -> str:
    from endpointd import __version__

    return __version__


@pytest.mark.slow
async def test_upgrading_the_daemon_keeps_its_pairing(gateway: Gateway, daemon: Daemon) -> None:
    device_id = await _pair(gateway, daemon)
    old = _endpointd_version()
    await gateway.pool.execute("UPDATE devices SET version = $2 WHERE id = $1", device_id, old)
    # The same config, key and state, run by a newer release of the daemon.
    upgraded = "99.0.0"
    program = (
        "import endpointd\n"
        f"endpointd.__version__ = {upgraded!r}\n"
        "import sys\n"
        "from endpointd.cli import main\n"
        "sys.argv = ['endpointd', 'run']\n"
        "main()\n"
    )

    def start_upgraded() -> subprocess.Popen[bytes]:
        log = open(daemon.home / "endpointd.log", "ab")  # noqa: SIM115 - lives with the process
        return subprocess.Popen(
            [sys.executable, "-c", program],
            env=daemon.env,
            cwd=daemon.home,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    daemon.processes.append(start_upgraded())
    await daemon.wait_connected(timeout=30)

    async def recorded() -> bool:
        version = await gateway.pool.fetchval(
            "SELECT version FROM devices WHERE id = $1", device_id
        )
        return bool(version == upgraded)

    await assert_eventually(recorded, timeout=10, message=daemon.log())
