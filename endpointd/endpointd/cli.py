"""The `endpointd` command line.

Only inspection commands exist so far; pairing and the daemon loop arrive with their own
issues. Heavy or slow imports (keyring probes D-Bus on Linux) happen inside the commands
that need them, so `endpointd --help` and `endpointd version` stay instant.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import click

from endpointd import __version__
from endpointd.paths import config_dir
from superagent_shared.protocol import PROTOCOL_VERSION, PROTOCOL_VERSION_NUMBER


@dataclass(frozen=True)
class KeyringStatus:
    """Which keyring backend the daemon would store its device key in, and whether it can."""

    backend: str  # display name, e.g. "SecretService Keyring"
    backend_class: str  # import path, what PYTHON_KEYRING_BACKEND would name
    usable: bool
    detail: str


def keyring_status() -> KeyringStatus:
    """Probe the OS keyring the way pairing will, without reading or writing any secret."""
    import keyring
    from keyring.backends import chainer, fail, null

    try:
        backend = keyring.get_keyring()
    except Exception as exc:
        # `info` is the diagnostic people run when something is wrong, so a broken keyring
        # setup (e.g. PYTHON_KEYRING_BACKEND naming a missing module) is reported, not raised.
        return KeyringStatus(
            backend="(failed to load)",
            backend_class="",
            usable=False,
            detail=f"keyring failed to load: {type(exc).__name__}: {exc}",
        )
    cls = type(backend)
    backend_class = f"{cls.__module__}.{cls.__qualname__}"
    usable, detail = True, "device keys will be stored here"
    if isinstance(backend, fail.Keyring):
        # keyring's answer when it found no backend at all (typical on a headless Linux box
        # without Secret Service): every operation would raise.
        usable, detail = False, "no OS keyring backend is available"
    elif isinstance(backend, null.Keyring):
        usable, detail = False, "the keyring is disabled by configuration (null backend)"
    elif isinstance(backend, chainer.ChainerBackend):
        chained = list(backend.backends)
        if not chained:
            usable, detail = False, "the keyring chain contains no usable backend"
        else:
            detail = "chains: " + ", ".join(str(b.name) for b in chained)
    return KeyringStatus(
        backend=str(backend.name), backend_class=backend_class, usable=usable, detail=detail
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
    """


@cli.command()
def version() -> None:
    """Print the daemon version and the wire protocol it speaks."""
    click.echo(f"endpointd {__version__}")
    click.echo(f"protocol {PROTOCOL_VERSION} (version {PROTOCOL_VERSION_NUMBER})")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def info(as_json: bool) -> None:
    """Show the config directory and whether the OS keyring is usable.

    Pairing stores the device key in the keyring, so check this first. Set
    ENDPOINTD_CONFIG_DIR to use a different config directory.
    """
    cfg = config_dir()
    ring = keyring_status()
    report: dict[str, Any] = {
        "version": __version__,
        "protocol_version": PROTOCOL_VERSION,
        "protocol_version_number": PROTOCOL_VERSION_NUMBER,
        "config_dir": str(cfg.path),
        "config_dir_source": cfg.source,
        "config_dir_exists": cfg.path.is_dir(),
        "keyring": {
            "backend": ring.backend,
            "class": ring.backend_class,
            "usable": ring.usable,
            "detail": ring.detail,
        },
    }
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return

    exists = "exists" if report["config_dir_exists"] else "not created yet"
    click.echo(f"endpointd {__version__} (protocol {PROTOCOL_VERSION})")
    click.echo(f"config dir: {cfg.path}  [{cfg.source}; {exists}]")
    state = "usable" if ring.usable else "NOT usable"
    where = f" ({ring.backend_class})" if ring.backend_class else ""
    click.echo(f"keyring:    {ring.backend}{where}: {state}, {ring.detail}")
    if not ring.usable:
        # Say what to do, not just what is wrong: pairing stores the device's private key in
        # the keyring, so an unusable one blocks pairing.
        click.echo(
            "            install or unlock an OS keyring (Secret Service/KWallet on Linux,"
            " Keychain on macOS, Credential Locker on Windows) before pairing"
        )


def main() -> None:
    """Console-script entry point (`endpointd = endpointd.cli:main`)."""
    # A fixed prog_name keeps usage lines reading `endpointd …` under `python -m endpointd`.
    cli(prog_name="endpointd")
