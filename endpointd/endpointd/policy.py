"""The local policy hook: the one place every command passes before it may run.

The policy file (``<config dir>/policy.toml``: allowed roots, denied paths, command rules,
credential scopes) is the machine owner's and no RPC can change it. Its rules arrive with a
later release; today every well-formed command is allowed, but the daemon already:

* calls :meth:`Policy.check` for every command after validation and before journaling it
  as accepted, so adding rules changes this module only;
* reports ``policy_hash`` (SHA-256 of the file's bytes, or of b"" when there is none) in
  every Hello, so admins can see when a device's rules change.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from superagent_proto.v1 import endpoint_pb2

POLICY_FILE = "policy.toml"


@dataclass(frozen=True)
class Refusal:
    reason: endpoint_pb2.Refused.Reason.ValueType
    message: str


class Policy:
    """Allow-all until the policy file format exists; subclass or replace, keep ``check``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def check(self, command: endpoint_pb2.Command) -> Refusal | None:
        if len(command.credentials):
            # Nothing may pretend a secret was delivered when it was not.
            return Refusal(
                endpoint_pb2.Refused.REASON_CREDENTIAL_UNAVAILABLE,
                "credential brokering is not supported by this endpointd version",
            )
        return None

    def hash(self) -> bytes:
        return policy_hash(self.path)


def policy_hash(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    return hashlib.sha256(data).digest()


def load_policy(config_directory: Path) -> Policy:
    return Policy(config_directory / POLICY_FILE)
