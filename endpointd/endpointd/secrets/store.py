"""Credentials the agent may use without ever seeing them: values in the OS keyring, or in
0600 files on a machine that has none.

This module owns storing, validating and looking up credential values. Values live in one
of two stores:

* ``keyring`` (the default): the OS keyring, service ``superagent-endpointd``, entry
  ``credential:<name>``;
* ``file``: one 0600 file per credential in ``<config dir>/credentials/`` (0700), for
  headless machines (:mod:`endpointd.secrets.file_store`). Only ever chosen explicitly:
  ``endpointd creds add --store file`` or ``credential_store = "file"`` in the policy
  (:func:`choose_store` says which wins). There the file permissions are the boundary.

The config dir keeps an index of names with the store holding each, when it was added and
last used (``<config dir>/credentials.json``, 0600), never a value. Which commands may
receive a credential is the policy's business (``[credentials.NAME] allow = [...]`` in
policy.toml), not this module's.

Values are refused when they cannot be masked reliably in output (see
:func:`validate_value`): shorter than 8 characters, or structured (JSON, YAML) so that a
program could print one field of it on its own.

Error messages name credentials, never values. ``keyring`` is imported inside the methods
that need it: it probes D-Bus on Linux, and `endpointd creds list` never touches it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from endpointd.errors import EndpointdError
from endpointd.fsutil import atomic_write, exclusive_lock
from endpointd.paths import ensure_private_dir
from endpointd.rules.credentials import NAME_RULE, Store, valid_name
from endpointd.secrets.file_store import BOUNDARY, DIRECTORY, FileStore, FileStoreError

CREDENTIALS_FILE = "credentials.json"
CREDENTIALS_VERSION = 1
KEYRING_SERVICE = "superagent-endpointd"  # the same service as the device key (keys.py)
ENTRY_PREFIX = "credential:"
MIN_VALUE_LENGTH = 8
NO_KEYRING_FIX = (
    "install or unlock an OS keyring backend (gnome-keyring or KWallet on Linux, Keychain on"
    " macOS, Credential Locker on Windows), e.g. by running endpointd from a desktop session;"
    " `endpointd info` shows which backend is in use"
)


def file_store_hint(name: str = "NAME") -> str:
    """The way out on a machine that will never have a keyring, and what taking it means."""
    return (
        "on a machine without one (SSH server, container, WSL) keep credentials in files"
        f' instead: `endpointd creds add {name} --store file`, or credential_store = "file"'
        f" in policy.toml; {BOUNDARY}"
    )


# A line of a YAML block mapping (`key: value`, `key:`) or block sequence (`- item`).
_YAML_MAPPING_LINE = re.compile(r"""^\s*(?:"[^"]*"|'[^']*'|[A-Za-z0-9_.\-]+)\s*:(?:\s|$)""")
_YAML_LIST_LINE = re.compile(r"^\s*-(?:\s|$)")


class CredentialError(EndpointdError):
    """A credential cannot be added, found, read or removed; the message says why and what to do."""


@dataclass(frozen=True)
class CredentialInfo:
    """What may be shown about a credential: never its value."""

    name: str
    added_at: str  # ISO 8601, UTC
    last_used_at: str | None  # ISO 8601, UTC; None until first delivered to a command
    store: Store = "keyring"


def entry_name(name: str) -> str:
    """The keyring entry (user name) under service ``superagent-endpointd``."""
    return ENTRY_PREFIX + name


def check_name(name: str) -> None:
    if not valid_name(name):
        raise CredentialError(f"invalid credential name {name!r}: use {NAME_RULE}")


def choose_store(flag: Store | None, policy: Store | None, policy_file: Path) -> Store:
    """Where ``endpointd creds add`` puts a new value.

    ``--store`` (``flag``) decides for that one command, but may not weaken what the policy
    pins: with ``credential_store = "keyring"`` the file store is refused. Without a flag,
    the policy's ``credential_store``; without either, the keyring. ``policy`` is None when
    the policy sets nothing (or there is no policy file).
    """
    if flag == "file" and policy == "keyring":
        raise CredentialError(
            f'{policy_file} sets credential_store = "keyring", so --store file is refused;'
            ' change it to credential_store = "file" if this machine has no keyring'
        )
    return flag or policy or "keyring"


def validate_value(name: str, value: bytes) -> str:
    """The value as text, or CredentialError saying why it cannot be a credential.

    Why these rules: every byte that leaves the device is masked for each credential value
    (and its encodings). A very short value would mask ordinary text and is guessable, and
    a structured one (JSON, YAML) can be parsed by a program and printed a field at a time,
    which no longer looks like the stored value and so would not be masked.
    """
    if not value:
        raise CredentialError(f"the value for {name} is empty")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        raise CredentialError(
            f"the value for {name} is not UTF-8 text; store binary secrets base64-encoded"
        ) from None
    if "\x00" in text:
        raise CredentialError(f"the value for {name} contains a NUL byte")
    if len(text) < MIN_VALUE_LENGTH:
        raise CredentialError(
            f"the value for {name} is shorter than {MIN_VALUE_LENGTH} characters; such short"
            " values are refused because masking them in output would hide ordinary text"
        )
    kind = _structure(text)
    if kind is not None:
        raise CredentialError(
            f"the value for {name} looks like {kind}; structured values are refused because a"
            " program could print one field on its own, which output masking would not"
            f" recognise: split it into separate credentials, one per secret field (e.g."
            f" `endpointd creds add {name}-user` and `endpointd creds add {name}-password`)"
        )
    return text


def _structure(text: str) -> str | None:
    """'a JSON object', 'YAML', ... when ``text`` is structured data rather than one secret."""
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            parsed = json.loads(stripped)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return "a JSON object"
        if isinstance(parsed, list):
            return "a JSON array"
        closing = {"{": "}", "[": "]"}[stripped[0]]
        if stripped.endswith(closing):
            return "a YAML/JSON flow collection"
    lines = [
        line
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#") and line.strip() != "---"
    ]
    if len(lines) >= 2:
        mapping = sum(1 for line in lines if _YAML_MAPPING_LINE.match(line))
        listing = sum(1 for line in lines if _YAML_LIST_LINE.match(line))
        if mapping >= 2 or listing >= 2:
            return "YAML (several `key: value` or `- item` lines)"
    return None


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class CredentialStore:
    """Credential values in the OS keyring or in files, plus their metadata in
    ``credentials.json``.

    ``credentials.json`` is the index: :meth:`names`, :meth:`info` and :meth:`values` go by
    it, because keyrings cannot portably list their entries; its ``store`` field says where
    each value is (absent: the keyring, as before the file store existed). Concurrent
    writers (the CLI adding, the daemon recording a use) take an exclusive lock on
    ``credentials.json.lock`` around each read-modify-write.
    """

    def __init__(self, config_dir: Path) -> None:
        self.config_dir = config_dir
        self.path = config_dir / CREDENTIALS_FILE
        self.files = FileStore(config_dir / DIRECTORY)

    # ------------------------------------------------------------------ metadata

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise CredentialError(
                f"cannot read {self.path}: {exc}; fix or delete it (values stay in their store)"
            ) from None
        entries = raw.get("credentials") if isinstance(raw, dict) else None
        if not isinstance(entries, dict):
            raise CredentialError(f"{self.path} is malformed: no `credentials` table")
        return {
            str(name): dict(meta) if isinstance(meta, dict) else {}
            for name, meta in entries.items()
        }

    def _write(self, entries: dict[str, dict[str, Any]]) -> None:
        ensure_private_dir(self.config_dir)
        body = {"version": CREDENTIALS_VERSION, "credentials": dict(sorted(entries.items()))}
        atomic_write(self.path, (json.dumps(body, indent=2) + "\n").encode(), mode=0o600)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        ensure_private_dir(self.config_dir)
        with exclusive_lock(self.path.with_name(CREDENTIALS_FILE + ".lock")):
            yield

    @staticmethod
    def _store_of(meta: dict[str, Any]) -> Store:
        return "file" if meta.get("store") == "file" else "keyring"

    # ------------------------------------------------------------------ keyring

    def require_keyring(self, name: str = "NAME") -> None:
        """CredentialError saying how to fix it when no usable keyring backend exists, and
        how to do without one (``name`` is used in the example command)."""
        from endpointd.keys import keyring_status

        status = keyring_status()
        if not status.usable:
            hint = f"; {file_store_hint(name)}"
            raise CredentialError(
                f"no usable OS keyring for credentials: {status.detail} ({status.backend});"
                f" {NO_KEYRING_FIX}{hint}"
            )

    def require_store(self, store: Store, name: str = "NAME") -> None:
        """CredentialError, before any value is asked for, when ``store`` cannot take one."""
        if store == "keyring":
            self.require_keyring(name)
            return
        try:
            self.files.check_writable()
        except FileStoreError as exc:
            raise CredentialError(str(exc)) from None

    def _keyring_delete(self, name: str) -> bool:
        """Delete ``name``'s keyring entry; False when there was none."""
        import keyring
        import keyring.errors

        try:
            keyring.delete_password(KEYRING_SERVICE, entry_name(name))
        except keyring.errors.PasswordDeleteError:
            return False
        except keyring.errors.KeyringError as exc:
            raise CredentialError(
                f"cannot delete credential {name} from the keyring: {type(exc).__name__}"
            ) from None
        return True

    # ------------------------------------------------------------------ public

    def add(
        self, name: str, value: bytes, *, replace: bool = False, store: Store = "keyring"
    ) -> None:
        """Validate and store ``value`` under ``name`` in ``store``; CredentialError with the
        reason. Replacing moves the value between stores when ``store`` differs."""
        check_name(name)
        text = validate_value(name, value)
        with self._locked():
            entries = self._read()
            if name in entries and not replace:
                raise CredentialError(
                    f"credential {name} already exists; `endpointd creds add {name} --replace`"
                    " overwrites it"
                )
            previous = self._store_of(entries[name]) if name in entries else None
            if store == "file":
                try:
                    self.files.write(name, text)
                except FileStoreError as exc:
                    raise CredentialError(str(exc)) from None
            else:
                self.require_keyring(name)
                import keyring
                import keyring.errors

                try:
                    keyring.set_password(KEYRING_SERVICE, entry_name(name), text)
                except keyring.errors.KeyringError as exc:
                    raise CredentialError(
                        f"cannot store credential {name} in the keyring: {type(exc).__name__};"
                        f" {NO_KEYRING_FIX}"
                    ) from None
            entries[name] = {"added_at": _now(), "last_used_at": None, "store": store}
            self._write(entries)
            # The old copy goes once the index points at the new one, so a failure above
            # leaves the credential where it was. A keyring that is gone cannot be cleaned:
            # its entry is unreachable anyway, since only indexed values are delivered.
            if previous == "file" and store != "file":
                with contextlib.suppress(FileStoreError):
                    self.files.delete(name)
            elif previous == "keyring" and store != "keyring":
                with contextlib.suppress(CredentialError, ImportError):
                    self.require_keyring()
                    self._keyring_delete(name)

    def remove(self, name: str) -> None:
        """Delete the value from its store and the name from the index."""
        check_name(name)
        with self._locked():
            entries = self._read()
            indexed = entries.get(name)
            where = self._store_of(indexed) if indexed is not None else None
            found = False
            if where != "keyring":  # a file-store credential, or a stray file
                try:
                    found = self.files.delete(name)
                except FileStoreError as exc:
                    raise CredentialError(str(exc)) from None
            if where == "keyring":
                self.require_keyring()
                found = self._keyring_delete(name)
            elif where is None and not found:
                # Not indexed: clean a stray keyring entry if there is a keyring to ask.
                from endpointd.keys import keyring_status

                if keyring_status().usable:
                    found = self._keyring_delete(name)
            if indexed is None and not found:
                raise CredentialError(
                    f"no credential named {name}; `endpointd creds list` shows them"
                )
            entries.pop(name, None)
            self._write(entries)

    def names(self) -> list[str]:
        return sorted(self._read())

    def info(self) -> list[CredentialInfo]:
        return [
            CredentialInfo(
                name=name,
                added_at=str(meta.get("added_at") or ""),
                last_used_at=str(meta["last_used_at"]) if meta.get("last_used_at") else None,
                store=self._store_of(meta),
            )
            for name, meta in sorted(self._read().items())
        ]

    def get(self, name: str) -> bytes | None:
        """The value, or None when no such credential is stored."""
        if not valid_name(name):
            return None
        meta = self._read().get(name)
        if meta is None:
            # Only indexed values exist for endpointd: the redactor masks exactly those, so
            # a keyring entry or a file set behind the index's back is never handed out.
            return None
        if self._store_of(meta) == "file":
            try:
                text = self.files.read(name)
            except FileStoreError as exc:
                raise CredentialError(f"cannot read credential {name}: {exc}") from None
            return None if text is None else text.encode("utf-8")
        self.require_keyring()
        import keyring
        import keyring.errors

        try:
            value = keyring.get_password(KEYRING_SERVICE, entry_name(name))
        except keyring.errors.KeyringError as exc:
            raise CredentialError(
                f"cannot read credential {name} from the keyring: {type(exc).__name__};"
                " is the keyring unlocked?"
            ) from None
        return None if value is None else str(value).encode("utf-8")

    def values(self) -> dict[str, bytes]:
        """Every stored value by name, for the redactor; names not in their store are skipped."""
        names = self.names()
        if not names:
            return {}
        found: dict[str, bytes] = {}
        for name in names:
            value = self.get(name)
            if value is not None:
                found[name] = value
        return found

    def touch(self, name: str) -> None:
        """Record that ``name`` was just delivered to a command (shown by `creds list`)."""
        with self._locked():
            entries = self._read()
            if name not in entries:
                return
            entries[name]["last_used_at"] = _now()
            self._write(entries)
