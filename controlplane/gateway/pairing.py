"""One-time pairing codes: create them, and trade one for a device identity.

A code is 8 characters from an alphabet without look-alikes, shown as ``ABCD-EFGH``. It is
valid for 10 minutes and once. The first half (``lookup``) finds the code's row so that
wrong guesses are counted per code (5 burn it); the stored proof is a hash of the whole
code. Every attempt is counted as a failure before its code is compared, in single atomic
statements, per peer (an IPv4 address or an IPv6 /64) and across all peers; a success takes
its count back. So a burst of concurrent guesses gets exactly the limit's worth compared,
one client cannot sweep codes, and many cannot either.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from controlplane.db.pool import Conn, Db, transaction
from controlplane.errors import SuperagentError
from controlplane.gateway import authorization as access
from controlplane.gateway import devices as registry
from controlplane.peers import peer_group
from superagent_shared.ids import new_id

CODE_ALPHABET = "ABCDEFGHJKMNPQRSTVWXYZ23456789"  # no 0/O, 1/I/L, U
CODE_LENGTH = 8
LOOKUP_LENGTH = 4
CODE_TTL = timedelta(minutes=10)
MAX_WRONG_PER_CODE = 5
WINDOW = timedelta(minutes=10)  # of the failure counts per peer and across all peers
EVERYONE = "*"  # the pairing_throttle row of all peers together (never an address)
ED25519_PUBLIC_KEY_BYTES = 32

log = logging.getLogger(__name__)


class PairingRefused(SuperagentError):
    """The pairing request was refused; ``reason`` is stable for callers, the message human."""

    http_status = 403
    code = "pairing_refused"

    def __init__(self, reason: str, message: str, *, counts: bool = True) -> None:
        super().__init__(message)
        self.reason = reason
        self.counts = counts  # False: not a failed guess; its count is taken back (uncount)


@dataclass(frozen=True)
class IssuedCode:
    code: str  # shown once, never stored
    device_name: str
    expires_at: datetime
    owner: str = ""  # who will own the device
    shared_with: str | None = None  # a team device's group

    @property
    def display(self) -> str:
        return f"{self.code[:LOOKUP_LENGTH]}-{self.code[LOOKUP_LENGTH:]}"


@dataclass(frozen=True)
class Paired:
    """The device a pairing code was traded for."""

    id: str
    name: str


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


_TAKEN = "SELECT id FROM devices WHERE name = $1 AND revoked_at IS NULL"


async def create_code(
    db: Db,
    *,
    device_name: str,
    owner: str | None,
    created_by: str,
    shared_with: str | None = None,
) -> IssuedCode:
    """A code for a device that ``owner`` will own (a person or an account ``SOURCE:ID``;
    by default whoever makes the code: the admin, ``web:admin``, from the CLI and the
    console). ``shared_with`` (``SOURCE:GROUP``) makes it a team device, usable by that
    group's members (controlplane.gateway.authorization)."""
    device_name = validate_device_name(device_name)
    owner = access.parse(owner, groups=False) if owner and owner.strip() else access.ADMIN
    team = access.parse_group(shared_with) if shared_with and shared_with.strip() else None
    code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
    expires_at = datetime.now(UTC) + CODE_TTL
    async with transaction(db) as conn:
        taken = await conn.fetchval(_TAKEN, device_name)
        if taken is not None:
            raise PairingRefused(
                "name_taken",
                f"a device named {device_name!r} is already paired ({taken}); revoke it first "
                "or choose another name",
            )
        await conn.execute(
            "INSERT INTO pairing_codes (id, lookup, code_sha256, device_name, owner, "
            "shared_with, created_by, expires_at, failed_attempts) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 0)",
            new_id("pcd"),
            code[:LOOKUP_LENGTH],
            _digest(code),
            device_name,
            owner,
            team,
            created_by,
            expires_at,
        )
    return IssuedCode(
        code=code,
        device_name=device_name,
        expires_at=expires_at,
        owner=owner,
        shared_with=team,
    )


@dataclass(frozen=True)
class Limits:
    """Failed attempts per :data:`WINDOW`: from one peer, and from all peers together."""

    per_peer: int
    everyone: int


@dataclass(frozen=True)
class Attempt:
    """One pairing attempt, counted as a failure before anything about it was compared.

    ``counted`` names the throttle rows it was counted in (with their windows) so that a
    success can take the count back; ``refusal``, when set, is the answer: the attempt was
    over a limit, or its code is malformed.
    """

    code: str
    counted: tuple[tuple[str, datetime], ...]
    refusal: PairingRefused | None = None


# One statement per count, so that concurrent attempts each see the others: a burst cannot
# all read "under the limit" before any of them is written.
_COUNT = """
    INSERT INTO pairing_throttle AS t (source, window_start, failures)
    VALUES ($1, now(), 1)
    ON CONFLICT (source) DO UPDATE SET
        failures = CASE WHEN t.window_start < now() - CAST($2 AS interval)
                        THEN 1 ELSE t.failures + 1 END,
        window_start = CASE WHEN t.window_start < now() - CAST($2 AS interval)
                            THEN now() ELSE t.window_start END
    RETURNING failures, window_start
"""
# A guess counts against every unpaired code that shares its lookup half but not its
# secret, and the one that reaches MAX_WRONG_PER_CODE burns the code; all in the same
# statement, so no guess is compared against a code already burnt.
_GUESS = """
    UPDATE pairing_codes SET
        failed_attempts = failed_attempts + 1,
        used_at = CASE WHEN used_at IS NULL AND failed_attempts + 1 >= $3
                       THEN now() ELSE used_at END
    WHERE lookup = $1 AND code_sha256 <> $2 AND device_id IS NULL
"""
_UNCOUNT = (
    "UPDATE pairing_throttle SET failures = failures - 1 "
    "WHERE source = $1 AND window_start = $2 AND failures > 0"
)


async def _count(conn: Conn, source: str) -> tuple[int, datetime]:
    row = await conn.fetchrow(_COUNT, source, WINDOW)
    assert row is not None
    return int(row["failures"]), row["window_start"]


async def count_attempt(
    conn: Conn, *, code: str, public_key: bytes, source: str, limits: Limits
) -> Attempt:
    """Count a pairing attempt as a failure, before its code is compared; say if it may be.

    Run in a transaction of its own and commit it, whatever comes next: a refusal later
    rolls its own transaction back, the count must stay. :func:`redeem` takes it back on
    success. Over the peer's limit, an attempt counts against its peer only (one peer
    cannot spend the budget of everyone); nothing over a limit reaches a code.
    """
    if len(public_key) != ED25519_PUBLIC_KEY_BYTES:  # the client's mistake, not a guess
        raise PairingRefused(
            "invalid_key", "public_key must be a raw 32-byte Ed25519 key", counts=False
        )
    peer = peer_group(source)
    failures, window = await _count(conn, peer)
    counted: tuple[tuple[str, datetime], ...] = ((peer, window),)
    if failures > limits.per_peer:
        return Attempt(code, counted, _throttled("from this address"))
    failures, window = await _count(conn, EVERYONE)
    counted += ((EVERYONE, window),)
    if failures > limits.everyone:
        if failures == limits.everyone + 1:  # said once per window, not once per attempt
            log.warning(
                "pairing paused: %d failed attempts from all addresses in %s",
                limits.everyone,
                WINDOW,
            )
        return Attempt(code, counted, _throttled("from all addresses"))
    normalized = normalize(code)
    if len(normalized) != CODE_LENGTH or any(ch not in CODE_ALPHABET for ch in normalized):
        refusal = PairingRefused(
            "invalid_code", "that is not a pairing code (expected 8 characters like ABCD-EFGH)"
        )
        return Attempt(code, counted, refusal)
    await conn.execute(_GUESS, normalized[:LOOKUP_LENGTH], _digest(normalized), MAX_WRONG_PER_CODE)
    return Attempt(normalized, counted)


def _throttled(where: str) -> PairingRefused:
    return PairingRefused("throttled", f"too many failed pairing attempts {where}; wait 10 minutes")


async def uncount(conn: Conn, attempt: Attempt) -> None:
    """Take back the counts of an attempt that turned out not to be a failure."""
    for source, window_start in attempt.counted:
        await conn.execute(_UNCOUNT, source, window_start)


async def redeem(
    conn: Conn,
    attempt: Attempt,
    *,
    public_key: bytes,
    version: str,
    labels: dict[str, str],
    requested_name: str = "",
) -> Paired:
    """Trade a counted attempt's code for a new device; raise :class:`PairingRefused` saying
    why not. On success the attempt's counts are taken back, in the same transaction (the
    caller's, around this call)."""
    if attempt.refusal is not None:
        raise attempt.refusal
    row = await conn.fetchrow(
        "SELECT id, device_name, owner, shared_with, created_by, expires_at, used_at, "
        "device_id FROM pairing_codes WHERE lookup = $1 AND code_sha256 = $2 FOR UPDATE",
        attempt.code[:LOOKUP_LENGTH],
        _digest(attempt.code),
    )
    now = datetime.now(UTC)
    if row is None:
        raise PairingRefused("wrong_code", "wrong or unknown pairing code")
    if row["used_at"] is not None:
        if row["device_id"] is None:
            raise PairingRefused(
                "code_locked", "this pairing code was locked after too many wrong attempts"
            )
        raise PairingRefused(
            "code_used", "this pairing code was already used; codes are single-use"
        )
    if row["expires_at"] <= now:
        raise PairingRefused(
            "expired", "this pairing code has expired; ask for a new one (codes last 10 minutes)"
        )
    name = row["device_name"]
    if await conn.fetchval(_TAKEN, name) is not None:
        raise PairingRefused(
            "name_taken", f"a device named {name!r} was paired meanwhile", counts=False
        )
    device = Paired(new_id("dev"), name)
    await registry.add(
        conn,
        device.id,
        name,
        row["owner"] or access.ADMIN,
        public_key,
        version,
        json.dumps(
            {k: v for k, v in labels.items() if v}
            | ({"requested_name": requested_name} if requested_name else {})
        ),
    )
    if row["shared_with"]:
        await access.add_share(conn, device.id, row["shared_with"], by=row["created_by"])
    await conn.execute(
        "UPDATE pairing_codes SET used_at = $2, device_id = $3 WHERE id = $1",
        row["id"],
        now,
        device.id,
    )
    await uncount(conn, attempt)  # a success: not a failure after all
    return device
