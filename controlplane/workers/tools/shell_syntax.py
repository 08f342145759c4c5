"""A credentialed command runs as one program, without a shell: what sh would read as more
than one program and its arguments is refused, with what to do instead.

Credential scopes match the program actually run, and ``sh -c "git push"`` runs sh; so a
shell call given credentials must be a program's own argv (:func:`program_argv`).
"""

from __future__ import annotations

import re
import shlex

from controlplane.tools.registry import Refused

__all__ = ["program_argv"]

# What sh would read as more than one program and its arguments: operators, expansions,
# globs, comments. A credentialed command is run without a shell, so it must have none.
_OPERATORS = frozenset("|&;<>()")
_EXPANSIONS = frozenset("$`")
_GLOBS = frozenset("*?[")
_SPECIAL = _OPERATORS | _EXPANSIONS | _GLOBS
_WORD_START = frozenset("~#")  # a home directory or a comment, at the start of a word
# Words sh runs itself (keywords and builtins): not programs the device can run.
_SHELL_WORDS = frozenset(
    {"!", "{", "}", ".", ":", "alias", "case", "cd", "eval", "exec", "export", "for"}
    | {"function", "if", "pushd", "read", "set", "source", "ulimit", "umask", "unset"}
    | {"until", "while"}
)
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _shell_syntax(command: str) -> str | None:
    """The first thing in ``command`` that only a shell would understand, or None.

    Quotes are read as sh reads them: inside single quotes nothing is special; inside
    double quotes ``$`` and backticks still expand.
    """
    quote = ""
    word_start = True
    i = 0
    while i < len(command):
        c = command[i]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif quote == '"':
            # Only what sh and shlex both read the same way: \" and \\ (sh would also
            # take \$, \` and a continued line, which shlex keeps as written).
            if c == "\\" and command[i + 1 : i + 2] in ('"', "\\"):
                i += 1
            elif c == "\\" and command[i + 1 : i + 2] == "\n":
                return "a line break"
            elif c == '"':
                quote = ""
            elif c in _EXPANSIONS:
                return c
        elif c in " \t":
            word_start = True
            i += 1
            continue
        elif c in "\n\r":
            return "a line break"
        elif c == "\\":
            if command[i + 1 : i + 2] in ("\n", ""):
                return "a line break" if command[i + 1 : i + 2] else "a trailing backslash"
            i += 1
        elif c in "'\"":
            quote = c
        elif c in _SPECIAL or (word_start and c in _WORD_START):
            return c
        word_start = False
        i += 1
    return None


def program_argv(command: str) -> list[str]:
    """``command`` as the argv of one program (a credentialed shell call runs no shell)."""
    rule = (
        "a command given credentials runs as one program with its arguments, not through "
        "sh (the device checks the credential against the program actually run): write a "
        "single program and its arguments, e.g. git push origin HEAD, without pipes, "
        "redirects, &&, ;, $(...), backticks, globs, ~, variables or NAME=value, and use "
        "cwd instead of cd; run any other step in its own shell call without credentials"
    )
    found = _shell_syntax(command)
    if found is not None:
        shown = found if len(found) > 1 else repr(found)
        raise Refused(f"not run: the command contains {shown}; {rule}")
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise Refused(f"not run: the command cannot be split into words ({exc}); {rule}") from None
    if not argv:
        raise Refused(f"not run: the command is empty; {rule}")
    if _ASSIGNMENT.match(argv[0]):
        raise Refused(f"not run: the command starts with an assignment ({argv[0]!r}); {rule}")
    if argv[0] in _SHELL_WORDS:
        raise Refused(f"not run: {argv[0]!r} is part of the shell, not a program; {rule}")
    return argv
