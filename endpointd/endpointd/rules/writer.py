"""Writing the policy file: `endpointd policy init` and pairing create it from the shipped
example, and fill in its allowed roots; nothing else ever writes it (the owner edits it)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Literal

from endpointd.errors import ConfigError
from endpointd.fsutil import atomic_write
from endpointd.paths import ensure_private_dir
from endpointd.rules.errors import PolicyError
from endpointd.rules.parser import parse_policy
from endpointd.rules.reader import expand_path
from endpointd.rules.terms import EXAMPLE_FILE, POLICY_FILE, NetworkMode


def example_text() -> str:
    """The shipped, commented example policy (``allowed_roots = []``)."""
    return resources.files("endpointd").joinpath(EXAMPLE_FILE).read_text(encoding="utf-8")


_EMPTY_ROOTS = re.compile(r"^allowed_roots\s*=\s*\[\s*\][ \t]*$", re.M)
_NETWORK = re.compile(r'^network\s*=\s*"[a-z-]+"[ \t]*$', re.M)


def _toml_string(value: str) -> str:
    # A JSON string is a valid TOML basic string (same escapes, \uXXXX included).
    return json.dumps(value, ensure_ascii=False)


def _with_roots(text: str, roots: Sequence[Path], path: Path) -> str:
    found = _EMPTY_ROOTS.findall(text)
    if len(found) != 1:
        raise PolicyError(
            path,
            "cannot fill in allowed_roots automatically (no single `allowed_roots = []` line);"
            " edit allowed_roots in the file",
        )
    listed = "".join(f"    {_toml_string(str(r))},\n" for r in roots)
    new = _EMPTY_ROOTS.sub(lambda _: f"allowed_roots = [\n{listed}]", text, count=1)
    check = parse_policy(new, path)
    if list(check.allowed_roots) != [expand_path(str(r)) for r in roots]:
        raise PolicyError(path, "the allowed roots cannot be written as TOML; edit the file")
    return new


def _with_network(text: str, network: NetworkMode, path: Path) -> str:
    """The example's ``network = ...`` line set to ``network`` (a new file only: the owner's
    choice in an existing one is never changed)."""
    if len(_NETWORK.findall(text)) != 1:
        raise PolicyError(path, "cannot set network automatically; edit network in the file")
    new = _NETWORK.sub(f'network = "{network}"', text, count=1)
    if parse_policy(new, path).network != network:
        raise PolicyError(path, f"network = {network!r} cannot be written; edit the file")
    return new


def allowed_root(raw: str) -> Path:
    """A directory given on the command line or at the prompt, made absolute; ConfigError
    if it is not an existing directory."""
    text = raw.strip()
    if not text:
        raise ConfigError("an allowed root cannot be empty")
    path = expand_path(text)
    if not path.is_absolute():
        path = Path(os.path.abspath(path))
    if not path.is_dir():
        raise ConfigError(f"allowed root {raw!r} is not an existing directory")
    return path


RootsState = Literal["missing", "empty", "set"]


def roots_state(config_directory: Path) -> tuple[RootsState, list[Path]]:
    """Whether the policy file exists and lists allowed roots (PolicyError when broken)."""
    path = config_directory / POLICY_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return "missing", []
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(path, f"cannot read: {exc}") from None
    rules = parse_policy(text, path)
    if not rules.allowed_roots:
        return "empty", []
    return "set", list(rules.allowed_roots)


def write_policy(
    config_directory: Path, roots: Sequence[Path] = (), network: NetworkMode | None = None
) -> Path:
    """Create policy.toml from the example, listing ``roots`` (and with ``network``, when
    given, instead of the example's); ConfigError if it exists."""
    path = config_directory / POLICY_FILE
    if path.exists():
        raise ConfigError(f"{path} already exists; edit it (`endpointd policy show` shows it)")
    text = example_text()
    if roots:
        text = _with_roots(text, roots, path)
    if network is not None:
        text = _with_network(text, network, path)
    ensure_private_dir(config_directory)
    atomic_write(path, text.encode("utf-8"), mode=0o600)
    return path


def set_allowed_roots(
    config_directory: Path, roots: Sequence[Path], network: NetworkMode | None = None
) -> tuple[Path, bool]:
    """Make the policy list ``roots``: a new file from the example (with ``network``, when
    given), or the empty ``allowed_roots = []`` of an existing one filled in. Returns
    (path, created)."""
    path = config_directory / POLICY_FILE
    state, _ = roots_state(config_directory)
    if state == "missing":
        return write_policy(config_directory, roots, network), True
    if state == "set":
        raise PolicyError(path, "allowed_roots is already set; edit the file to change it")
    text = _with_roots(path.read_text(encoding="utf-8"), roots, path)
    atomic_write(path, text.encode("utf-8"), mode=0o600)
    return path, False
