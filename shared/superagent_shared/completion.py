"""``completion SHELL``: the script that completes a program's commands and options, for
both programs (click's own completion, driven by the program's command tree).

Lazily loaded commands complete too: click asks the root group for its commands by name,
and the groups list them without importing them.
"""

from __future__ import annotations

import json

import click
from click.shell_completion import get_completion_class

SHELLS = ("bash", "zsh", "fish")


def _complete_var(prog: str) -> str:
    """click's variable for ``prog`` (``_SUPERAGENT_COMPLETE``)."""
    return f"_{prog.replace('-', '_').replace('.', '_')}_COMPLETE".upper()


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def completion(ctx: click.Context, shell: str, as_json: bool) -> None:
    """Print the script that completes this program's commands in SHELL.

    \b
    bash:  echo 'eval "$(PROG completion bash)"' >> ~/.bashrc
    zsh:   echo 'eval "$(PROG completion zsh)"' >> ~/.zshrc
    fish:  PROG completion fish > ~/.config/fish/completions/PROG.fish
    """
    root = ctx.find_root()
    prog = root.info_name or "superagent"
    complete_class = get_completion_class(shell)
    assert complete_class is not None  # every SHELLS entry is one of click's
    script = complete_class(root.command, {}, prog, _complete_var(prog)).source()
    if as_json:
        click.echo(json.dumps({"shell": shell, "script": script}))
        return
    click.echo(script)
