"""One load of the policy file: its rules, the digest of the bytes they came from, the
allowed roots and denied paths resolved, or why the file cannot be used.

:class:`~endpointd.guard.policy.Policy` keeps the latest :class:`Loaded` and loads again
when the file changes. A file that cannot be used still denies the built-in paths, so that
the refusals a broken policy gives name them as a working one would.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from endpointd.guard.files import within as _within
from endpointd.rules.credentials import FILES_DIRECTORY as CREDENTIAL_FILES_DIR
from endpointd.rules.errors import PolicyError
from endpointd.rules.harnesses import HARNESSES, moved_state
from endpointd.rules.parser import parse_policy
from endpointd.rules.reader import expand_path
from endpointd.rules.tables import DEFAULT_DENIED_PATHS, DeniedPath, Rules


@dataclass(frozen=True)
class Root:
    written: Path
    real: str


@dataclass(frozen=True)
class Denied:
    entry: DeniedPath
    forms: tuple[str, ...]  # normalised and resolved


@dataclass
class Loaded:
    rules: Rules | None
    error: str | None
    digest: bytes
    roots: tuple[Root, ...] = ()
    denied: tuple[Denied, ...] = ()


def load(path: Path, st: os.stat_result | None, *, home: Path, state_directory: Path) -> Loaded:
    """The rules of ``path`` (``st``: its stat, None if it is missing), or why not."""
    denied_defaults = default_denied(path.parent, home, state_directory)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return _broken(
            f"{path}: no policy file; create it with `endpointd policy init"
            " --allow-root DIR` (pairing does this)",
            b"",
            denied_defaults,
        )
    except OSError as exc:
        return _broken(f"{path}: cannot read: {exc.strerror}", b"", denied_defaults)
    if st is not None and os.name == "posix" and st.st_mode & 0o022:
        return _broken(
            f"{path}: the policy file is writable by other users (mode"
            f" {st.st_mode & 0o777:o}), so it cannot be trusted; run `chmod 600"
            f" {path}`",
            data,
            denied_defaults,
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return _broken(f"{path}: not UTF-8 text", data, denied_defaults)
    try:
        rules = parse_policy(text, path, home)
    except PolicyError as exc:
        return _broken(str(exc), data, denied_defaults)
    roots = tuple(Root(written=p, real=os.path.realpath(p)) for p in rules.allowed_roots)
    return Loaded(
        rules=rules,
        error=None,
        digest=hashlib.sha256(data).digest(),
        roots=roots,
        denied=_resolved((*denied_defaults, *rules.denied_paths)),
    )


def _broken(error: str, data: bytes, denied: Iterable[DeniedPath]) -> Loaded:
    return Loaded(
        rules=None,
        error=error,
        digest=hashlib.sha256(data).digest(),
        denied=_resolved(denied),
    )


def default_denied(
    config_directory: Path, home: Path, state_directory: Path
) -> tuple[DeniedPath, ...]:
    """The paths denied whatever the file says: keys, keyrings, browser profiles, the
    harnesses' own state (also where their variables moved it), and endpointd's own files
    (its config and state dirs, its credential files, its key file)."""
    out = [
        DeniedPath(label=p, path=expand_path(p, home), default=True) for p in DEFAULT_DENIED_PATHS
    ]
    xdg_data = os.environ.get("XDG_DATA_HOME")
    if xdg_data and os.path.isabs(xdg_data):
        for sub in ("keyrings", "python_keyring"):
            out.append(
                DeniedPath(
                    label=f"$XDG_DATA_HOME/{sub}",
                    path=Path(os.path.normpath(xdg_data)) / sub,
                    default=True,
                )
            )
    for spec in HARNESSES.values():
        # A harness's state moved by its variables (CLAUDE_CONFIG_DIR, …) is as much the
        # owner's as its usual place below home (never the home directory itself, nor /).
        for var, path in moved_state(spec, os.environ):
            if not _within(str(home), str(path)):
                out.append(DeniedPath(label=f"${var}", path=path, default=True))
    config = Path(os.path.abspath(config_directory))
    # Inside the config dir, but named on its own: it holds credential values in plain
    # files (the file store), and a refusal should say that is what was reached for.
    out.append(
        DeniedPath(
            label="endpointd credential files",
            path=config / CREDENTIAL_FILES_DIR,
            default=True,
        )
    )
    out.append(DeniedPath(label="endpointd config dir", path=config, default=True))
    out.append(
        DeniedPath(
            label="endpointd state dir",
            path=Path(os.path.abspath(state_directory)),
            default=True,
        )
    )
    key_file = _key_file(config)
    if key_file is not None:
        out.append(DeniedPath(label="endpointd key file", path=key_file, default=True))
    return tuple(out)


def _resolved(entries: Iterable[DeniedPath]) -> tuple[Denied, ...]:
    out = []
    for entry in entries:
        forms = {str(entry.path), os.path.realpath(entry.path)}
        out.append(Denied(entry=entry, forms=tuple(sorted(forms))))
    return tuple(out)


def _key_file(config_directory: Path) -> Path | None:
    """The device key file named by config.json, if the key lives in a file."""
    try:
        raw = json.loads((config_directory / "config.json").read_text(encoding="utf-8"))
        key = raw.get("key") or {}
        if key.get("storage") == "file" and key.get("path"):
            return Path(os.path.abspath(str(key["path"])))
    except (OSError, ValueError, AttributeError):
        pass
    return None


def denied_in(loaded: Loaded, forms: Iterable[str]) -> Denied | None:
    """The denied path holding one of ``forms`` (a path as written and resolved)."""
    unique = set(forms)
    for denied in loaded.denied:
        for form in unique:
            if any(_within(form, d) for d in denied.forms):
                return denied
    return None


def denied_hit(loaded: Loaded, path: str) -> Denied | None:
    """The denied path holding ``path``, normalised or resolved."""
    return denied_in(loaded, (os.path.normpath(path), os.path.realpath(path)))
