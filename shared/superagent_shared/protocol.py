"""Constants and helpers of the device protocol that both the gateway and endpointd need.

They live here, not in the generated stubs, because protoc cannot express constants, and
both sides must agree on them byte for byte (the Hello signature especially).
"""

from __future__ import annotations

import struct
from typing import Final

# The protobuf package of the wire protocol. A breaking change gets a new package (v2), so
# this string names the protocol exactly; tests check it against the generated descriptor.
PROTOCOL_VERSION: Final = "superagent.endpoint.v1"
# The same version as a number, carried in PairRequest/Challenge/Hello.protocol_version.
PROTOCOL_VERSION_NUMBER: Final = 1

# Upper bound for OutputChunk.data: small enough that heartbeats are never stuck behind a
# large message, large enough that bulk output is not dominated by per-message overhead.
MAX_OUTPUT_CHUNK_BYTES: Final = 64 * 1024

# Domain separation for the Hello signature, so a signature made for this purpose can never
# be valid for any other message the device key might sign in future.
HELLO_SIGNING_CONTEXT: Final = b"superagent.endpoint.v1/hello\x00"


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
