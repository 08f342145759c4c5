"""The committed protocol stubs match endpoint.proto, and the generated module behaves."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from superagent_proto.v1 import endpoint_pb2
from superagent_shared.protocol import (
    HELLO_SIGNING_CONTEXT,
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_NUMBER,
    hello_signing_payload,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_committed_stubs_are_up_to_date() -> None:
    # A subprocess, not an import of the script, so the check runs exactly as CI and
    # developers run it (its own argv parsing, exit code and temp dir).
    proc = subprocess.run(
        [sys.executable, "scripts/gen_proto.py", "--check", "--diff"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "up to date" in proc.stdout


def test_generated_package_is_the_protocol_version() -> None:
    assert endpoint_pb2.DESCRIPTOR.package == "superagent.endpoint.v1"
    assert endpoint_pb2.DESCRIPTOR.package == PROTOCOL_VERSION
    assert PROTOCOL_VERSION.endswith(f".v{PROTOCOL_VERSION_NUMBER}")


def test_service_shape() -> None:
    service = endpoint_pb2.DESCRIPTOR.services_by_name["EndpointGateway"]
    pair = service.methods_by_name["Pair"]
    connect = service.methods_by_name["Connect"]
    assert (pair.client_streaming, pair.server_streaming) == (False, False)
    assert (connect.client_streaming, connect.server_streaming) == (True, True)
    assert connect.input_type.name == "DeviceMessage"
    assert connect.output_type.name == "ServerMessage"


def test_server_message_with_exec_command_round_trips() -> None:
    msg = endpoint_pb2.ServerMessage(
        command=endpoint_pb2.Command(
            command_id="cmd_8f3k2q",
            seq=42,
            origin="ticket tkt_8f3k2q",
            exec=endpoint_pb2.ExecCommand(
                argv=["git", "status", "--short"],
                cwd="/home/dev/repo",
                env={"GIT_PAGER": "cat"},
                timeout_seconds=30,
                stdin=b"",
            ),
            credentials=[
                endpoint_pb2.CredentialRef(
                    name="github-token",
                    delivery=endpoint_pb2.CredentialRef.DELIVERY_ENV,
                    env_var="GH_TOKEN",
                )
            ],
        )
    )
    msg.command.not_after.FromDatetime(datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC))

    parsed = endpoint_pb2.ServerMessage.FromString(msg.SerializeToString())

    assert parsed == msg
    assert parsed.WhichOneof("msg") == "command"
    cmd = parsed.command
    assert cmd.WhichOneof("kind") == "exec"
    assert list(cmd.exec.argv) == ["git", "status", "--short"]
    assert dict(cmd.exec.env) == {"GIT_PAGER": "cat"}
    # `stdin` is proto3 optional: an explicitly empty input survives the trip and is
    # distinguishable from "no stdin".
    assert cmd.exec.HasField("stdin")
    assert not endpoint_pb2.ExecCommand().HasField("stdin")
    assert cmd.not_after.ToDatetime(tzinfo=UTC) == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert cmd.credentials[0].delivery == endpoint_pb2.CredentialRef.DELIVERY_ENV


def test_command_from_a_newer_server_has_no_known_kind() -> None:
    # A kind this build does not know arrives as an unknown field: the oneof reads as unset,
    # which is what the daemon turns into REASON_UNKNOWN_KIND.
    future_kind = bytes([0xFA, 0x01, 0x00])  # field 31, length-delimited, empty
    cmd = endpoint_pb2.Command.FromString(
        endpoint_pb2.Command(command_id="cmd_1").SerializeToString() + future_kind
    )
    assert cmd.command_id == "cmd_1"
    assert cmd.WhichOneof("kind") is None


def test_hello_signature_verifies_over_the_documented_payload() -> None:
    key = Ed25519PrivateKey.generate()
    nonce, policy_hash = b"\x01" * 32, b"\x02" * 32
    payload = hello_signing_payload(
        nonce=nonce,
        device_id="dev_8f3k2q",
        daemon_version="0.1.0",
        protocol_version=PROTOCOL_VERSION_NUMBER,
        policy_hash=policy_hash,
    )
    hello = endpoint_pb2.Hello(
        device_id="dev_8f3k2q",
        daemon_version="0.1.0",
        protocol_version=PROTOCOL_VERSION_NUMBER,
        policy_hash=policy_hash,
        signature=key.sign(payload),
    )
    wire = endpoint_pb2.DeviceMessage(hello=hello).SerializeToString()

    # The server side: parse, rebuild the payload from the received fields, verify.
    got = endpoint_pb2.DeviceMessage.FromString(wire).hello
    rebuilt = hello_signing_payload(
        nonce=nonce,
        device_id=got.device_id,
        daemon_version=got.daemon_version,
        protocol_version=got.protocol_version,
        policy_hash=got.policy_hash,
    )
    key.public_key().verify(got.signature, rebuilt)  # raises on mismatch
    assert rebuilt.startswith(HELLO_SIGNING_CONTEXT)


def test_hello_signing_payload_is_unambiguous() -> None:
    # Length prefixes: moving bytes between adjacent fields must change the payload.
    def payload(device_id: str, daemon_version: str) -> bytes:
        return hello_signing_payload(
            nonce=b"n",
            device_id=device_id,
            daemon_version=daemon_version,
            protocol_version=1,
            policy_hash=b"",
        )

    assert payload("ab", "c") != payload("a", "bc")
