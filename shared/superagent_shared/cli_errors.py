"""How both command lines run: a failure ends as one line on stderr, ``error: …``, with the
exit status click gives it (2 for a usage error, after the usage line; 1 otherwise), and
``NO_COLOR`` turns styles off.

Click's own rendering says ``Error: …`` while the programs' own failures said ``error: …``,
so one run could print both. Both programs' entry points run their root group through
:func:`run`, which renders click's failures the programs' way.
"""

from __future__ import annotations

import errno
import os
import sys

import click


def run(group: click.Command, prog_name: str) -> None:
    """Run ``group`` as the ``prog_name`` program; never returns."""
    try:
        # Outside standalone mode click returns what ``ctx.exit(code)`` asked for (every
        # command's callback returns None: mypy holds them to it).
        code = group.main(
            prog_name=prog_name,
            standalone_mode=False,
            # https://no-color.org: set and not empty, no styles even on a terminal.
            color=False if os.environ.get("NO_COLOR") else None,
        )
    except click.UsageError as exc:
        if exc.ctx is not None:
            flag = max(exc.ctx.help_option_names, key=len)  # --help, not -h: it teaches
            hint = f"Try '{exc.ctx.command_path} {flag}' for help."
            click.echo(f"{exc.ctx.get_usage()}\n{hint}\n", err=True)
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("aborted", err=True)
        sys.exit(1)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
        # The reader went away (`… | head`): nothing more to say, and nowhere to say it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
