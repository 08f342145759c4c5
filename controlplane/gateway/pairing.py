"""One-time pairing codes: create them, and trade one for a device identity.

A code is 8 characters from an alphabet without look-alikes, shown as ``ABCD-EFGH``. It is
valid for 10 minutes and once. The first half (``lookup``) finds the code's row so that
wrong guesses are counted per code (5 burn it); the stored proof is a hash of the whole
code. Failures are also counted per source address, so one client cannot sweep codes.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.models import Device, PairingCode
from controlplane.errors import SuperagentError

CODE_ALPHABET = "ABCDEFGHJKMNPQRSTVWXYZ23456789"  # no 0/O, 1/I/L, U
CODE_LENGTH = 8
LOOKUP_LENGTH = 4
CODE_TTL = timedelta(minutes=10)
MAX_WRONG_PER_CODE = 5
MAX_FAILURES_PER_SOURCE = 10
SOURCE_WINDOW = timedelta(minutes=10)
ED25519_PUBLIC_KEY_BYTES = 32


class PairingRefused(SuperagentError):
    """The pairing request was refused; ``reason`` is stable for callers, the message human."""

    http_status = 403
    code = "pairing_refused"

    def __init__(self, reason: str, message: str, *, counts: bool = True) -> None:
        super().__init__(message)
        self.reason = reason
        self.counts = counts  # a failed attempt to record with record_failure()


@dataclass(frozen=True)
class IssuedCode:
    code: str  # shown once, never stored
    device_name: str
    expires_at: datetime

    @property
    def display(self) -> str:
        return f"{self.code[:LOOKUP_LENGTH]}-{self.code[LOOKUP_LENGTH:]}"


def normalize(code: str) -> str:
    return "".join(ch for ch in code.upper() if ch not in "- \t")


def _digest(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


def validate_device_name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > 100 or any(ch.isspace() or not ch.isprintable() for ch in name):
        raise PairingRefused(
            "invalid_name", "device names are 1-100 printable characters without spaces"
        )
    return name


async def create_code(
    session: AsyncSession, *, device_name: str, owner: str | None, created_by: str
) -> IssuedCode:
    device_name = validate_device_name(device_name)
    taken = await session.scalar(
        select(Device.id).where(Device.name == device_name, Device.revoked_at.is_(None))
    )
    if taken is not None:
        raise PairingRefused(
            "name_taken",
            f"a device named {device_name!r} is already paired ({taken}); revoke it first "
            "or choose another name",
        )
    code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
    expires_at = datetime.now(UTC) + CODE_TTL
    session.add(
        PairingCode(
            lookup=code[:LOOKUP_LENGTH],
            code_sha256=_digest(code),
            device_name=device_name,
            owner=owner,
            created_by=created_by,
            expires_at=expires_at,
        )
    )
    return IssuedCode(code=code, device_name=device_name, expires_at=expires_at)


async def _count_source_failure(session: AsyncSession, source: str) -> None:
    await session.execute(
        text(
            """
            INSERT INTO pairing_throttle (source, window_start, failures)
            VALUES (:source, now(), 1)
            ON CONFLICT (source) DO UPDATE SET
                failures = CASE
                    WHEN pairing_throttle.window_start < now() - CAST(:window AS interval)
                    THEN 1 ELSE pairing_throttle.failures + 1 END,
                window_start = CASE
                    WHEN pairing_throttle.window_start < now() - CAST(:window AS interval)
                    THEN now() ELSE pairing_throttle.window_start END
            """
        ),
        {"source": source, "window": SOURCE_WINDOW},
    )


async def _source_blocked(session: AsyncSession, source: str) -> bool:
    failures = await session.scalar(
        text(
            "SELECT failures FROM pairing_throttle "
            "WHERE source = :source AND window_start >= now() - CAST(:window AS interval)"
        ),
        {"source": source, "window": SOURCE_WINDOW},
    )
    return failures is not None and failures >= MAX_FAILURES_PER_SOURCE


async def record_failure(session: AsyncSession, *, code: str, source: str) -> None:
    """Count a failed attempt against its source address and against the code it targeted.

    Run in its own transaction after :func:`redeem` refused: the refusal rolls back, the
    count must not.
    """
    await _count_source_failure(session, source)
    normalized = normalize(code)
    if len(normalized) != CODE_LENGTH:
        return
    digest = _digest(normalized)
    rows = (
        await session.scalars(
            select(PairingCode)
            .where(PairingCode.lookup == normalized[:LOOKUP_LENGTH], PairingCode.used_at.is_(None))
            .with_for_update()
        )
    ).all()
    for row in rows:
        if not hmac.compare_digest(row.code_sha256, digest):
            row.failed_attempts += 1
            if row.failed_attempts >= MAX_WRONG_PER_CODE:
                row.used_at = datetime.now(UTC)  # burnt: too many wrong guesses against it


async def redeem(
    session: AsyncSession,
    *,
    code: str,
    public_key: bytes,
    source: str,
    version: str,
    labels: dict[str, str],
    requested_name: str = "",
) -> Device:
    """Trade ``code`` for a new device; raise :class:`PairingRefused` saying why not."""
    if await _source_blocked(session, source):
        raise PairingRefused(
            "throttled",
            "too many failed pairing attempts from this address; wait 10 minutes",
            counts=False,
        )
    if len(public_key) != ED25519_PUBLIC_KEY_BYTES:
        raise PairingRefused(
            "invalid_key", "public_key must be a raw 32-byte Ed25519 key", counts=False
        )
    normalized = normalize(code)
    if len(normalized) != CODE_LENGTH or any(ch not in CODE_ALPHABET for ch in normalized):
        raise PairingRefused(
            "invalid_code", "that is not a pairing code (expected 8 characters like ABCD-EFGH)"
        )
    digest = _digest(normalized)
    row = await session.scalar(
        select(PairingCode)
        .where(PairingCode.lookup == normalized[:LOOKUP_LENGTH], PairingCode.code_sha256 == digest)
        .with_for_update()
    )
    now = datetime.now(UTC)
    if row is None:
        raise PairingRefused("wrong_code", "wrong or unknown pairing code")
    if row.used_at is not None:
        if row.device_id is None:
            raise PairingRefused(
                "code_locked", "this pairing code was locked after too many wrong attempts"
            )
        raise PairingRefused(
            "code_used", "this pairing code was already used; codes are single-use"
        )
    if row.expires_at <= now:
        raise PairingRefused(
            "expired", "this pairing code has expired; ask for a new one (codes last 10 minutes)"
        )
    taken = await session.scalar(
        select(Device.id).where(Device.name == row.device_name, Device.revoked_at.is_(None))
    )
    if taken is not None:
        raise PairingRefused(
            "name_taken", f"a device named {row.device_name!r} was paired meanwhile", counts=False
        )
    device = Device(
        name=row.device_name,
        owner=row.owner,
        public_key=public_key,
        version=version,
        labels={k: v for k, v in labels.items() if v}
        | ({"requested_name": requested_name} if requested_name else {}),
    )
    session.add(device)
    await session.flush()
    row.used_at = now
    row.device_id = device.id
    return device
