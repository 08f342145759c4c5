"""Which program a command really runs, and whether a credential's scope covers it.

A credential scope (``[credentials.NAME] allow = ["git *"]``) names programs, and the
program a command runs is not its ``argv[0]`` text: a script the control plane just wrote
can be called ``git`` too. So scopes compare *resolved absolute paths*: the scope's program
word is looked up on the daemon's own ``PATH`` (the owner's, which no command can change),
the command's ``argv[0]`` on the command's ``PATH`` (the minimal one, see
:mod:`endpointd.rules.environment`), both with symlinks resolved. ``git`` in a scope then
means ``/usr/bin/git``, never ``./git`` or ``/tmp/x/git``.

Some scoped programs can be told to run any other program: ``git -c alias.x='!sh …'``,
``--config-env``, ``--upload-pack``, ``rebase --exec``, an alias or ``git-foo`` on the
PATH. Those are refused for a credentialed command (:func:`code_running_reason`), since
whatever git starts inherits what git was given.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from functools import lru_cache

from endpointd.guard import daemon_programs

_GLOB_CHARS = frozenset("*?[")


def resolve_program(name: str, path_var: str | None, cwd: str = "") -> str | None:
    """The absolute, symlink-free path ``name`` runs as, looked up on ``path_var``; None if
    it is not an executable file there."""
    if not name:
        return None
    if "/" in name:
        candidate = name if os.path.isabs(name) else os.path.join(cwd or os.getcwd(), name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.realpath(candidate)
        return None
    found = shutil.which(name, path=path_var if path_var is not None else os.defpath)
    return os.path.realpath(found) if found else None


def split_glob(glob: str) -> tuple[str, str]:
    """A scope glob's program word and the glob over the rest of the command line."""
    program, _, rest = glob.strip().partition(" ")
    return program, rest.strip()


def scope_program(word: str, trusted_path: str | None) -> str | None:
    """What a scope's program word stands for: an absolute path (resolved), a glob over
    absolute paths (kept as written: the owner chose a pattern), or None when a bare name
    is not found on the daemon's PATH (so it matches nothing)."""
    if any(c in _GLOB_CHARS for c in word):
        return word
    if os.path.isabs(word):
        return os.path.realpath(word)
    return resolve_program(word, trusted_path)


def scope_matches(
    glob: str, program: str | None, argv: Sequence[str], trusted_path: str | None
) -> bool:
    """Does scope ``glob`` cover ``argv`` whose program resolved to ``program``?"""
    if program is None:
        return False
    word, rest = split_glob(glob)
    wanted = scope_program(word, trusted_path)
    if wanted is None:
        return False
    line = " ".join([program, *argv[1:]])
    if not any(c in _GLOB_CHARS for c in wanted):
        # A named program: exactly it, then the rest of the glob over its arguments.
        return program == wanted and fnmatch.fnmatchcase(" ".join(argv[1:]), rest)
    # The owner wrote a pattern for the program (`*`, `*/python3 *`): it is matched with the
    # rest against the whole line, the program's resolved path first.
    return fnmatch.fnmatchcase(line, " ".join(filter(None, [wanted, rest])))


# git options that make git run a program of the caller's choosing (or read config that
# does), by where they may appear.
_GIT_GLOBAL_CODE = ("-c", "--config-env", "--exec-path")
_GIT_SUBCOMMAND_CODE: Mapping[str, tuple[str, ...]] = {
    "clone": ("-u", "--upload-pack", "-c", "--config", "--template"),
    "fetch": ("--upload-pack",),
    "pull": ("--upload-pack",),
    "ls-remote": ("--upload-pack",),
    "archive": ("--exec",),
    "push": ("--receive-pack", "--exec"),
    "send-pack": ("--receive-pack", "--exec"),
    "fetch-pack": ("--upload-pack", "--exec"),
    "rebase": ("-x", "--exec"),
    "difftool": ("-x", "--extcmd", "-t", "--tool"),
    "mergetool": ("-t", "--tool"),
    "submodule": ("foreach",),
    "bisect": ("run",),
    "commit": ("--template",),
}
_GIT_NEVER = ("filter-branch", "filter-repo", "instaweb", "daemon", "web--browse")
# Global options that take a separate value (skipped while looking for the subcommand).
_GIT_VALUE_OPTIONS = ("-C", "--git-dir", "--work-tree", "--namespace", "--super-prefix")


@lru_cache(maxsize=1)
def git_builtins() -> frozenset[str]:
    """The subcommands built into git (anything else is an alias or a ``git-*`` program),
    as the daemon's own git says (:mod:`endpointd.guard.daemon_programs`): the git a
    command runs may be anything a command wrote, and is never run here."""
    trusted = daemon_programs.which("git")
    if trusted is None:
        return frozenset()
    try:
        out = subprocess.run(
            [trusted, "--list-cmds=builtins"],
            capture_output=True,
            text=True,
            timeout=10,
            env={"PATH": os.defpath, "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"},
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(out.split())


def _flag_hits(arg: str, flags: Sequence[str]) -> str | None:
    for flag in flags:
        if arg == flag or (flag.startswith("--") and arg.startswith(flag + "=")):
            return flag
        if not flag.startswith("--") and len(flag) == 2 and arg.startswith(flag) and arg != flag:
            return flag  # -cfoo=bar, -xcmd
    return None


def code_running_reason(program: str, argv: Sequence[str]) -> str | None:
    """Why a credentialed ``argv`` (running ``program``) could start other programs, or None.

    Knows git; other programs are judged by their scope alone.
    """
    if os.path.basename(program) not in ("git", "git.exe"):
        return None
    i = 1
    while i < len(argv):
        arg = argv[i]
        hit = _flag_hits(arg, _GIT_GLOBAL_CODE)
        if hit is not None:
            return f"git {hit} can make git run any program"
        if arg in _GIT_VALUE_OPTIONS:
            i += 2
            continue
        if not arg.startswith("-"):
            break
        i += 1
    if i >= len(argv):
        return None
    sub = argv[i]
    if sub in _GIT_NEVER:
        return f"git {sub} runs programs it is given"
    builtins = git_builtins()
    if builtins and sub not in builtins:
        return (
            f"git {sub!r} is not a built-in git command (an alias or a git-{sub} program"
            " could run anything)"
        )
    for arg in argv[i + 1 :]:
        if arg == "--":
            break
        hit = _flag_hits(arg, _GIT_SUBCOMMAND_CODE.get(sub, ()))
        if hit is not None:
            return f"git {sub} {hit} can make git run any program"
    return None
