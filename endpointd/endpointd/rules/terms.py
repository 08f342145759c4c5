"""The policy's vocabulary: the actions a rule takes, the sandbox and network modes, the
file operations, and where the policy file is."""

from __future__ import annotations

from typing import Literal

POLICY_FILE = "policy.toml"
EXAMPLE_FILE = "policy.example.toml"

Action = Literal["allow", "deny", "ask"]
ACTIONS: tuple[Action, ...] = ("allow", "deny", "ask")
SandboxMode = Literal["required", "best-effort", "off"]
SANDBOX_MODES: tuple[SandboxMode, ...] = ("required", "best-effort", "off")
NetworkMode = Literal["allow", "deny", "proxy"]
NETWORK_MODES: tuple[NetworkMode, ...] = ("allow", "deny", "proxy")
FileOp = Literal["read", "write", "list"]
FILE_OPS: tuple[FileOp, ...] = ("read", "write", "list")
# How an http-delivered credential is added to requests for its hosts ({secret}: the value).
DEFAULT_HEADER = "Authorization: Bearer {secret}"
# How a harness's credential reaches it: in its environment, or added by the device's proxy.
HARNESS_DELIVERIES = ("env", "http")
