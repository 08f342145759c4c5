"""``superagent doctor``: check this configuration end to end, and say how to fix what fails."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

import click

from controlplane.cli.common import setup_logging
from controlplane.doctor import diagnose


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(as_json: bool) -> None:
    """Check the configuration, the database, the gateway certificate, each channel and the
    model; print one line per check, and the fix for each that fails.

    Exits 0 when every check passes, 1 otherwise. Prints whether secrets are set, never
    their values.
    """
    setup_logging("WARNING")
    checks = diagnose()
    ok = all(check.ok for check in checks)
    if as_json:
        click.echo(json.dumps({"ok": ok, "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        width = max(len(check.name) for check in checks)
        for check in checks:
            click.echo(f"{'✓' if check.ok else '✗'} {check.name:<{width}}  {check.detail}")
            if check.fix is not None:
                click.echo(f"  {'':<{width}}  fix: {check.fix}")
        failures = sum(not check.ok for check in checks)
        click.echo("all checks passed" if ok else f"{failures} of {len(checks)} checks failed")
    sys.exit(0 if ok else 1)
