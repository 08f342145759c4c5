"""The `endpointd` command line: one function per command, one place that prints errors.

Every expected failure is an :class:`EndpointdError`, printed as one line (``Error: ...``)
with exit status 1 and no traceback. Heavy or slow imports (gRPC, keyring probing D-Bus on
Linux) happen inside the commands that need them, so `endpointd --help` and `endpointd
version` stay instant. One module per command group.
"""

from __future__ import annotations

# One module per command group; importing them registers their commands with the root.
from endpointd.cli import (  # noqa: F401
    approvals,
    audit,
    creds,
    device,
    harness,
    policy,
    sandbox,
    service,
    workspaces,
)
from endpointd.cli.root import cli
from endpointd.keys import KeyringStatus, keyring_status
from superagent_shared.cli_errors import run
from superagent_shared.completion import completion

cli.add_command(completion)

__all__ = ["KeyringStatus", "cli", "keyring_status", "main"]


def main() -> None:
    """Console-script entry point (`endpointd = endpointd.cli:main`)."""
    # A fixed prog_name keeps usage lines reading `endpointd …` under `python -m endpointd`.
    run(cli, "endpointd")
