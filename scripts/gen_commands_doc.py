#!/usr/bin/env python3
"""Write docs/commands.md's reference: every `superagent` and `endpointd` command and
subcommand, each with the help its `--help` prints.

The reference is the block between the page's markers; it is generated, never edited: the
click commands are the one source, so it cannot drift from what the programs say. The
overview above it is written by hand. Commands change on their own branches;
after a change, run this once:

    .venv/bin/python scripts/gen_commands_doc.py           # rewrite docs/commands.md
    .venv/bin/python scripts/gen_commands_doc.py --check   # exit 1 if it is stale (a test)

The help is rendered 80 columns wide, whatever the terminal, so the output depends only on
the code. `superagent`'s commands are imported lazily (controlplane/cli/main.py, COMMANDS),
so each is resolved through its group's ``get_command``, as running it would.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterator
from pathlib import Path

import click

REPO_ROOT = Path(__file__).resolve().parent.parent
PAGE = REPO_ROOT / "docs" / "commands.md"
WIDTH = 80

BEGIN = "<!-- BEGIN generated: scripts/gen_commands_doc.py -->\n"
END = "<!-- END generated -->"


def walk(
    command: click.Command, name: str, parent: click.Context | None
) -> Iterator[tuple[str, str]]:
    """(full command name, help text) for ``command`` and every visible subcommand."""
    ctx = click.Context(
        command, info_name=name, parent=parent, terminal_width=WIDTH, max_content_width=WIDTH
    )
    yield ctx.command_path, command.get_help(ctx)
    if isinstance(command, click.Group):
        for sub_name in command.list_commands(ctx):
            sub = command.get_command(ctx, sub_name)
            if sub is None or sub.hidden:
                continue
            yield from walk(sub, sub_name, ctx)


def anchor(path: str) -> str:
    return path.replace(" ", "-")


def render() -> str:
    """The generated block: a contents list, then each command's help."""
    # Imported here, so `--help` of this script needs neither program.
    from controlplane.cli.main import cli as superagent
    from endpointd.cli import cli as endpointd

    programs = {"superagent": superagent, "endpointd": endpointd}
    sections = {program: list(walk(root, program, None)) for program, root in programs.items()}
    out = []
    for program, commands in sections.items():
        names = ", ".join(f"[`{path}`](#{anchor(path)})" for path, _ in commands[1:])
        out.append(f"- [`{program}`](#{program}): {names}")
    out.append("")
    for commands in sections.values():
        for path, text in commands:
            level = "##" if " " not in path else "###"
            out.append(f"{level} {path}\n")
            out.append("```text")
            out.append(text.rstrip())
            out.append("```\n")
    return "\n".join(out).rstrip() + "\n"


def regenerated(current: str) -> str:
    """The page with its generated block replaced; the rest is written by hand."""
    if BEGIN not in current or END not in current:
        raise SystemExit(f"{PAGE.relative_to(REPO_ROOT)} lacks its markers: {BEGIN.strip()}")
    head, rest = current.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    return head + BEGIN + render() + END + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--check", action="store_true", help="exit 1, with the difference, if the page is stale"
    )
    args = parser.parse_args(argv)
    current = PAGE.read_text(encoding="utf-8")
    page = regenerated(current)
    if args.check:
        if current == page:
            print(f"{PAGE.relative_to(REPO_ROOT)} is up to date")
            return 0
        diff = difflib.unified_diff(
            current.splitlines(keepends=True),
            page.splitlines(keepends=True),
            "docs/commands.md (committed)",
            "docs/commands.md (generated)",
        )
        sys.stdout.writelines(diff)
        print(
            "\ndocs/commands.md is stale: run .venv/bin/python scripts/gen_commands_doc.py",
            file=sys.stderr,
        )
        return 1
    if current != page:
        PAGE.write_text(page, encoding="utf-8")
        print(f"wrote {PAGE.relative_to(REPO_ROOT)}")
    else:
        print(f"{PAGE.relative_to(REPO_ROOT)} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
