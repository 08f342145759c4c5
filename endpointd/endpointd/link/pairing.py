"""`endpointd pair`: trade a one-time code for a device identity and a pinned server.

Order matters for safety and for not wasting the single-use code:

1. validate the URL and refuse if already paired;
2. probe TLS and settle trust (and the admin's fingerprint) before the code is sent;
3. create and store the key (so a keyring failure aborts before the code is spent);
4. call Pair over a channel that trusts only what step 2 accepted;
5. check the response describes the same certificate, then write the local policy's
   allowed roots (asked for by the CLI before anything else) and ``config.json``.

A failure after step 3 removes the new key (and a policy file it created) again, leaving
nothing half-paired behind.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from endpointd import __version__
from endpointd.config import DeviceConfig, TrustConfig, config_path, save_config
from endpointd.errors import ConfigError, PairingError, TrustError
from endpointd.keys import create_key, discard_new_key
from endpointd.link.trust import (
    channel_credentials,
    channel_options,
    check_fingerprint,
    parse_server_url,
    probe_server,
)
from endpointd.rules.terms import NetworkMode
from superagent_shared.gateway_tls import certificate_der
from superagent_shared.protocol import PROTOCOL_MAX_VERSION, PROTOCOL_MIN_VERSION

PAIR_TIMEOUT_SECONDS = 30.0


def check_not_paired(config_directory: Path) -> None:
    existing = config_path(config_directory)
    if existing.exists():
        raise ConfigError(
            f"already paired ({existing}); run `endpointd unpair` first to pair again"
        )


def pair(
    *,
    url: str,
    code: str,
    device_name: str | None,
    key_file: Path | None,
    fingerprint: bytes | None,
    config_directory: Path,
    allowed_roots: Sequence[Path] | None = None,
    network: NetworkMode | None = None,
) -> DeviceConfig:
    """Pair; ``allowed_roots`` (when given) are written into the local policy on success,
    and ``network`` into a policy file pairing creates."""
    import grpc

    from endpointd import wire

    addr = parse_server_url(url)
    check_not_paired(config_directory)
    if not code.strip():
        raise PairingError("the pairing code is empty")

    if addr.scheme == "https":
        probe = probe_server(addr)
        check_fingerprint(probe, fingerprint)
        trust = TrustConfig(
            mode=probe.mode, ca_pem=probe.ca_pem, leaf_sha256=probe.leaf_sha256.hex()
        )
    else:
        if fingerprint is not None:
            raise TrustError("--fingerprint needs an https:// server URL")
        probe = None
        trust = TrustConfig(mode="plaintext")

    key, where, created = create_key(key_file)
    created_policy: Path | None = None
    hostname = socket.gethostname()
    name = device_name or hostname
    try:
        creds = channel_credentials(trust)
        options = channel_options(trust)
        channel = (
            grpc.secure_channel(addr.target, creds, options=options)
            if creds is not None
            else grpc.insecure_channel(addr.target, options=options)
        )
        with channel:
            try:
                response = wire.pair(
                    channel,
                    pairing_code=code.strip(),
                    device_name=name,
                    public_key=key.public_raw,
                    daemon_version=__version__,
                    min_protocol_version=PROTOCOL_MIN_VERSION,
                    max_protocol_version=PROTOCOL_MAX_VERSION,
                    platform=sys.platform,
                    hostname=hostname,
                    timeout=PAIR_TIMEOUT_SECONDS,
                )
            except grpc.RpcError as exc:
                code_name = exc.code().name if exc.code() is not None else "UNKNOWN"
                detail = exc.details() or "no detail"
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    # The server's own line (e.g. which versions, and what to upgrade):
                    # the status name would only add noise to it.
                    raise PairingError(f"pairing refused by {addr.url}: {detail}") from None
                raise PairingError(
                    f"pairing refused by {addr.url}: {code_name}: {detail}"
                ) from None

        if probe is not None and probe.mode == "pinned":
            if response.server_cert_sha256 != probe.leaf_sha256:
                raise TrustError(
                    "the server's PairResponse names a different certificate than the one it"
                    " presented — possible interception; not pairing"
                )
            try:
                told_ca = certificate_der(response.server_ca_pem.encode("ascii"))
            except ValueError:
                told_ca = b""
            if told_ca != probe.ca_der:
                raise TrustError(
                    "the server's PairResponse names a different CA than the one it presented"
                    " — possible interception; not pairing"
                )
        if not response.device_id:
            raise PairingError("the server's PairResponse has no device_id")

        config = DeviceConfig(
            server_url=addr.url,
            device_id=response.device_id,
            device_name=name,
            server_name=response.server_name,
            trust=trust,
            key=where,
            public_key=key.public_raw.hex(),
            paired_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        )
        if allowed_roots:
            from endpointd.rules.writer import set_allowed_roots

            policy_path, new_file = set_allowed_roots(config_directory, allowed_roots, network)
            created_policy = policy_path if new_file else None
        save_config(config, config_directory)
        return config
    except BaseException:
        if created:
            discard_new_key(key, where)
        if created_policy is not None:
            with contextlib.suppress(OSError):
                os.unlink(created_policy)
        raise
