"""``superagent say``: talk to the agent from the terminal, through the web chat's websocket.

The command and its help only: what it does lives in :mod:`controlplane.cli.conversation`,
imported when it runs, so that ``superagent say --help`` loads nothing but click (the
websocket and HTTP clients and the settings cost most of a second of CPU).
"""

from __future__ import annotations

import sys

import click

DEFAULT_WAIT = 120.0


@click.command()
@click.argument("text", required=False)
@click.option(
    "--conversation",
    "thread",
    metavar="ID",
    help="Continue this conversation (its id is printed after each message).",
)
# The name it had first; one name in the help and the hints.
@click.option("--thread", "thread_alias", hidden=True)
@click.option(
    "--url",
    help="The control plane. [default: http://127.0.0.1:PORT, PORT from SUPERAGENT_HTTP__PORT]",
)
@click.option("--name", default="admin", show_default=True, help="Who is speaking.")
@click.option(
    "--wait",
    "wait_seconds",
    type=click.FloatRange(min=0),
    default=DEFAULT_WAIT,
    show_default=True,
    metavar="SECONDS",
    help="Wait this long for the reply and for the results it promises (a /run's output, "
    "a ticket's first report); 0: do not wait.",
)
@click.option("--no-wait", is_flag=True, help="Return once the message is recorded (--wait 0).")
@click.option(
    "--follow",
    is_flag=True,
    help="Keep printing every later reply on the conversation until Ctrl-C. Without TEXT "
    "(and with --conversation): the replies to its latest message, then what comes.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def say(
    text: str | None,
    thread: str | None,
    thread_alias: str | None,
    url: str | None,
    name: str,
    wait_seconds: float,
    no_wait: bool,
    follow: bool,
    as_json: bool,
) -> None:
    """Say TEXT to the agent and print its replies (TEXT "-" reads standard input).

    This is the web chat from a terminal: the control plane must be running (`superagent
    up`), and the conversation shows in the console's chat page (/chat) too. It talks to
    the context's deployment with its token (superagent login), or else to this machine's
    with the admin token: SUPERAGENT_ADMIN_TOKEN, or the one `superagent up` generated in
    its state directory (STATE_DIR/admin-token).

    It waits, up to --wait seconds, for the replies and for what they promise: a /run's
    output, the first report of a ticket the message opened.

    \b
    Examples:
      superagent say "Why is CI red on main?"
      superagent say "/run laptop make test"            # waits for the output
      superagent say "/run laptop sh -c 'make && make test'"   # /run has no shell of its own
      superagent say --wait 600 "Fix the flaky login test"   # and the ticket's report
      superagent say --conversation chat_4f0c2a9e1b7d3c55 "Go ahead and fix it"
      superagent say --follow --conversation chat_4f0c2a9e1b7d3c55   # what came since
      superagent say --follow "/run laptop ./deploy.sh"      # until Ctrl-C
      git diff | superagent say --no-wait -

    stdout carries only the replies, each ending with a newline; the conversation id and
    hints go to stderr, each on its own line.

    Exit status: 0 when the replies and everything they promised arrived (and on Ctrl-C
    with --follow); 3 when something promised did not arrive within --wait (stderr says
    what, and how to see it later); 1 with one line when the control plane is not
    running, refuses the token, will not act on the message (a /run to a device that does
    not exist), or sends no reply within --wait; 130 on Ctrl-C otherwise.
    """
    thread = thread or thread_alias
    if text is None and not (follow and thread):
        raise click.UsageError("say what? (only --follow --conversation ID needs no TEXT)")
    if follow and as_json:
        raise click.UsageError("--follow streams text; it does not mix with --json")
    if text == "-":
        text = sys.stdin.read()
    from controlplane.cli import conversation

    wait = 0.0 if no_wait else wait_seconds
    conversation.main(text, thread, url, name, wait, follow, as_json)
