"""Constants and helpers of the device protocol that both the gateway and endpointd need.

They live here, not in the generated stubs, because protoc cannot express constants, and
both sides must agree on them byte for byte (the Hello signature especially).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

# The protobuf package of the wire protocol. A breaking change gets a new package (v2), so
# this string names the protocol exactly; tests check it against the generated descriptor.
PROTOCOL_VERSION: Final = "superagent.endpoint.v1"
# The range of protocol versions this release speaks, both ends included. Each side states
# its range on connect and the two agree on the highest version in both (`negotiate`), so
# a new version can be added at the top and an old one dropped at the bottom one release
# later, without a flag day between daemons and control planes.
PROTOCOL_MIN_VERSION: Final = 1
PROTOCOL_MAX_VERSION: Final = 1
# The newest version as a number (what `endpointd version` shows).
PROTOCOL_VERSION_NUMBER: Final = PROTOCOL_MAX_VERSION

# How a daemon too old for its control plane is upgraded (the distribution is `endpointd`).
UPGRADE_DAEMON: Final = "pip install -U endpointd (or pipx upgrade endpointd)"

# Upper bound for OutputChunk.data: small enough that heartbeats are never stuck behind a
# large message, large enough that bulk output is not dominated by per-message overhead.
MAX_OUTPUT_CHUNK_BYTES: Final = 64 * 1024

# What a device receives at most in one message (endpointd's gRPC receive limit), and the
# largest Command the control plane queues, a little under it for the envelope. A larger
# one could never be read: the device's stream would end on it, and the gateway would
# deliver it again on every new one, working for no ticket on that device.
MAX_DEVICE_RECEIVE_BYTES: Final = 16 * 1024 * 1024
MAX_COMMAND_BYTES: Final = MAX_DEVICE_RECEIVE_BYTES - 64 * 1024

# Domain separation for the Hello signature, so a signature made for this purpose can never
# be valid for any other message the device key might sign in future.
HELLO_SIGNING_CONTEXT: Final = b"superagent.endpoint.v1/hello\x00"


@dataclass(frozen=True, slots=True)
class Speaker:
    """One side of a connection: its release version and the protocol versions it speaks."""

    release: str  # "0.1.0"; empty from a peer older than the field
    low: int
    high: int

    @classmethod
    def stated(cls, release: str, low: int, high: int) -> Speaker:
        """From wire fields, where 0 means "not said" (a peer older than the range fields
        states one version, in the older field, which the caller passes as ``low``)."""
        low = low or PROTOCOL_MIN_VERSION  # 0: so old it predates saying at all; v1
        return cls(release, low, max(high, low))

    def speaks(self, version: int) -> bool:
        return self.low <= version <= self.high

    @property
    def protocols(self) -> str:
        span = str(self.low) if self.low == self.high else f"{self.low}-{self.high}"
        return f"protocol {span}"


def negotiate(daemon: Speaker, server: Speaker) -> int | None:
    """The highest protocol version both sides speak, or None if their ranges do not meet."""
    agreed = min(daemon.high, server.high)
    return agreed if agreed >= max(daemon.low, server.low) else None


def incompatibility(daemon: Speaker, server: Speaker) -> str | None:
    """The one line both programs show when ``daemon`` and ``server`` share no protocol
    version (None when they do): both versions, and what to upgrade, with the command.

    Built here so the daemon (which prints it) and the gateway (which sends it in its
    refusal, for daemons that take the server's word) say the same thing.
    """
    if negotiate(daemon, server) is not None:
        return None
    ours = f"endpointd {daemon.release or '(unknown version)'} ({daemon.protocols})"
    theirs = f"the control plane {server.release or '(older release)'} ({server.protocols})"
    if daemon.high < server.low:
        return f"{ours} is too old for {theirs}: upgrade it with {UPGRADE_DAEMON}"
    pin = (
        f"install the daemon it matches: pip install endpointd=={server.release}"
        if server.release
        else "install an older endpointd"
    )
    return f"{ours} is too new for {theirs}: upgrade the control plane, or {pin}"


def _field(value: bytes) -> bytes:
    # Length-prefix every variable field so that no two different tuples of fields can
    # produce the same byte string (e.g. device_id "ab"+version "c" vs "a"+"bc").
    return struct.pack(">I", len(value)) + value


def hello_signing_payload(
    *,
    nonce: bytes,
    device_id: str,
    daemon_version: str,
    protocol_version: int,
    policy_hash: bytes,
) -> bytes:
    """Return the exact bytes a device signs (and the gateway verifies) for a Hello.

    The layout is documented on `Hello.signature` in endpoint.proto. It is built by hand
    because protobuf serialisation is not canonical, so re-serialising a parsed message on
    the server could yield different bytes than the device signed.

    The layout must stay the same in every protocol version: the gateway checks the
    signature before the versions, so that a version refusal it logs names a device proven
    to be that device.
    """
    return b"".join(
        (
            HELLO_SIGNING_CONTEXT,
            _field(nonce),
            _field(device_id.encode("utf-8")),
            _field(daemon_version.encode("utf-8")),
            struct.pack(">I", protocol_version),
            _field(policy_hash),
        )
    )
