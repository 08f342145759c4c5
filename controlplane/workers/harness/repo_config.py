"""A repository's own settings for its tickets: ``.superagent/config`` at its top, TOML.

```toml
[harness]
default = "qwen"            # the coding-agent CLI its tickets use, where the device has it
[checks]
test = "python -m unittest" # what must pass before a harness's work is pushed
[push]
credential = "acme-push"    # the device credential a push uses (git_helper delivery)
```

The file is the repository's, so anyone who can change the repository can change it: it
chooses among what the device's owner allowed, and names things the device still judges (a
credential is delivered only where the device's policy scopes it; the test command runs in
the sandbox like any command). It grants nothing. A file that is not valid TOML, or a key of
the wrong type, is ignored with the reason kept for the ticket's report, never fatal.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from typing import Any

PATH = ".superagent/config"
MAX_BYTES = 64_000


@dataclass(frozen=True)
class RepoConfig:
    harness: str | None = None
    test: str | None = None
    push_credential: str | None = None
    problem: str | None = None  # why (part of) the file was ignored


def parse(text: str | None) -> RepoConfig:
    """The settings in ``text`` (None: no file)."""
    if not text or not text.strip():
        return RepoConfig()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return RepoConfig(problem=f"{PATH} is not valid TOML ({exc}); ignored")
    problems: list[str] = []

    def text_at(section: str, key: str) -> str | None:
        table: Any = data.get(section)
        if table is None:
            return None
        if not isinstance(table, dict):
            problems.append(f"[{section}] is not a table")
            return None
        value = table.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            problems.append(f"[{section}] {key} is not a non-empty string")
            return None
        return value.strip()

    found = RepoConfig(
        harness=text_at("harness", "default"),
        test=text_at("checks", "test"),
        push_credential=text_at("push", "credential"),
    )
    if problems:
        return RepoConfig(
            found.harness,
            found.test,
            found.push_credential,
            f"{PATH}: " + "; ".join(problems) + " (ignored)",
        )
    return found
