"""The root of the `endpointd` command line: the group every command module registers with,
the one place an expected failure (:class:`EndpointdError`) becomes one line and exit 1, and
the `--json` every command takes (:func:`json_option`, :func:`echo_json`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from endpointd import __version__
from endpointd.errors import EndpointdError
from superagent_shared.protocol import PROTOCOL_VERSION

_F = TypeVar("_F", bound=Callable[..., Any])

JSON_HELP = "Machine-readable output."


def json_option(text: str = JSON_HELP) -> Callable[[_F], _F]:
    """The `--json` flag of every command (tests/endpointd/cli/test_json_output.py holds
    each command to it): its outcome as one JSON document on stdout, nothing else there."""
    return click.option("--json", "as_json", is_flag=True, help=text)


def echo_json(document: Any) -> None:
    """Print ``document`` as the command's one JSON document (never a secret in it)."""
    click.echo(json.dumps(document, indent=2))


class _Group(click.Group):
    """Turns EndpointdError into click's one-line error and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EndpointdError as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    __version__,
    prog_name="endpointd",
    message=f"%(prog)s %(version)s (protocol {PROTOCOL_VERSION})",
)
def cli() -> None:
    """endpointd: the super-agent device daemon.

    endpointd lets your team's coding agent work in this machine's real environment: it
    runs the commands and file operations the control plane sends, hands them credentials
    from your OS keyring without ever sending the secret values upstream, and enforces a
    local policy file that only you can change. It only ever connects out to the control
    plane, over a single TLS-protected gRPC stream; it never listens for or accepts inbound
    connections, so it needs no open ports and works behind NAT and firewalls.

    Start with `endpointd pair URL CODE`, then `endpointd run` (or `endpointd service
    install --now` to start it at every login), and check on it with `endpointd status`.
    `endpointd sandbox check` tries to escape the sandbox its commands run in, here, under
    your policy, and says what held.
    """
