"""The schema of the domain model (docs/architecture.md, *Domain model*) as SQLAlchemy 2 models.

Models hold data only; behaviour lives in plain async functions in each part's package.
States are text columns guarded by CHECK constraints (readable in psql, cheap to extend in a
migration). Every primary key is a prefixed random ID from ``superagent_shared.ids``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal
from typing import Any, ClassVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    PrimaryKeyConstraint,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from controlplane.domain import CLOSED_TICKET_SQL, CommandState, TicketState, sql_list
from superagent_shared.ids import new_id

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

COMMAND_KINDS = (
    "exec",
    "read_file",
    "write_file",
    "list_dir",
    "cancel",
    "prepare_workspace",
    "release_workspace",
    "search",
    "glob",
    "run_harness",
)
SESSION_KINDS = ("router", "worker", "watchdog")
MESSAGE_ROLES = ("system", "user", "assistant", "tool")
MANDATE_KINDS = ("explicit", "inferred")
TRIGGER_ROUTES = ("router", "subscribers", "dropped")
REPORT_STATUSES = ("progress", "ready", "question", "blocked", "failed")
# What came of a model call (controlplane.llm.errors names the classes).
LLM_OUTCOMES = ("ok", "transient", "context", "permanent", "malformed")
# Which slot an assignment holds: one of max_workers, or the one kept for human wake-ups.
SLOT_KINDS = ("regular", "human")
FINDING_SEVERITIES = ("info", "warning", "critical")
APPROVAL_STATES = ("pending", "approved", "denied", "expired", "cancelled")
# Why one item (a router turn, a worker round, an effect...) failed: a model call's class
# (controlplane.llm.errors), or ``internal``: an exception in our own code.
FAILURE_CLASSES = ("transient", "context", "permanent", "malformed", "internal")


# The command states ix_commands_pending covers.
_PENDING_INDEXED = (CommandState.QUEUED, CommandState.DELIVERED, CommandState.RUNNING)


def _one_of(column: str, values: Iterable[str]) -> str:
    return f"{column} IN ({sql_list(values)})"


def _id(prefix: str) -> Mapped[str]:
    return mapped_column(String(16), primary_key=True, default=lambda: new_id(prefix))


def _created() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now())


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSONB,
        datetime: DateTime(timezone=True),
    }


class Blob(Base):
    """Spilled content (full payloads, long outputs), referenced by ID from summaries.

    Small blobs keep their bytes in ``data``; large or streamed ones (command output) keep
    them in ``blob_chunks`` so that no single row, and no single process, holds them whole.
    """

    __tablename__ = "blobs"
    id: Mapped[str] = _id("blb")
    content_type: Mapped[str] = mapped_column(String(100), default="application/octet-stream")
    size: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    sha256: Mapped[str | None] = mapped_column(String(64))
    data: Mapped[bytes | None] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = _created()


class BlobChunk(Base):
    """One slice of a chunked blob, keyed by byte offset (idempotent re-writes)."""

    __tablename__ = "blob_chunks"
    __table_args__ = (PrimaryKeyConstraint("blob_id", "offset"),)
    blob_id: Mapped[str] = mapped_column(ForeignKey("blobs.id", ondelete="CASCADE"))
    offset: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class PolicyVersion(Base):
    """An immutable version of a filtering/authorization policy; edits name their base."""

    __tablename__ = "policy_versions"
    __table_args__ = (UniqueConstraint("name", "version"),)
    id: Mapped[str] = _id("pol")
    name: Mapped[str] = mapped_column(String(100))
    version: Mapped[int] = mapped_column(Integer)
    base_id: Mapped[str | None] = mapped_column(ForeignKey("policy_versions.id"))
    body: Mapped[dict[str, Any]]
    author: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = _created()


class PromptVersion(Base):
    """An immutable version of a system prompt; edits name their base."""

    __tablename__ = "prompt_versions"
    __table_args__ = (UniqueConstraint("name", "version"),)
    id: Mapped[str] = _id("prm")
    name: Mapped[str] = mapped_column(String(100))
    version: Mapped[int] = mapped_column(Integer)
    base_id: Mapped[str | None] = mapped_column(ForeignKey("prompt_versions.id"))
    body: Mapped[str] = mapped_column(Text)
    author: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = _created()


class Thread(Base):
    """A stream of events: one GitHub issue/PR, one chat thread."""

    __tablename__ = "threads"
    __table_args__ = (UniqueConstraint("source", "external_id"),)
    id: Mapped[str] = _id("thr")
    source: Mapped[str] = mapped_column(String(50))
    external_id: Mapped[str] = mapped_column(String(500))
    title: Mapped[str | None] = mapped_column(Text)
    url: Mapped[str | None] = mapped_column(Text)
    meta: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default=text("'{}'"))
    created_at: Mapped[datetime] = _created()
    last_event_at: Mapped[datetime | None]


class Trigger(Base):
    """One incoming event. Dedupe: (source, external_id) is unique."""

    __tablename__ = "triggers"
    __table_args__ = (
        UniqueConstraint("source", "external_id"),
        Index(None, "thread_id", "created_at"),
        Index(None, "created_at"),  # the console's trigger feed, newest first
        # The router's inbox: unrouted triggers, kept small by a partial index.
        Index("ix_triggers_pending", "created_at", postgresql_where=text("routed_at IS NULL")),
        Index(
            "ix_triggers_undigested",
            "created_at",
            postgresql_where=text("route = 'subscribers' AND digested_at IS NULL"),
        ),
        # Messages that may answer an owner's approval (``approve apr_…`` / ``deny apr_…``):
        # the consent sweep reads only these (controlplane.tickets.consent).
        Index(
            "ix_triggers_approval_answers",
            "created_at",
            postgresql_where=text("text LIKE '%apr\\_%'"),
        ),
        CheckConstraint(_one_of("route", TRIGGER_ROUTES), name="route"),
        # What the router gave up on (quarantined): few, listed by status and the console.
        Index(
            "ix_triggers_undecidable",
            "undecidable_at",
            postgresql_where=text("undecidable_at IS NOT NULL"),
        ),
    )
    id: Mapped[str] = _id("trg")
    source: Mapped[str] = mapped_column(String(50))
    external_id: Mapped[str] = mapped_column(String(500))
    thread_id: Mapped[str] = mapped_column(ForeignKey("threads.id"))
    actor_id: Mapped[str] = mapped_column(String(200))
    actor_name: Mapped[str] = mapped_column(String(200))
    actor_is_bot: Mapped[bool] = mapped_column(Boolean, default=False)
    # The actor's groups as the channel reported them (Slack user groups, Matrix rooms...):
    # a device shared with a group is usable by its members (device_shares).
    actor_groups: Mapped[list[str]] = mapped_column(
        ARRAY(String(200)), default=list, server_default=text("'{}'")
    )
    # The person behind the actor's account, when linked (``superagent users link``).
    person_id: Mapped[str | None] = mapped_column(ForeignKey("people.id"))
    kind: Mapped[str] = mapped_column(String(100))
    text: Mapped[str] = mapped_column(Text, default="")
    payload_blob_id: Mapped[str | None] = mapped_column(ForeignKey("blobs.id"))
    verdict: Mapped[str | None] = mapped_column(String(50))
    verdict_reason: Mapped[str | None] = mapped_column(Text)
    policy_version_id: Mapped[str | None] = mapped_column(ForeignKey("policy_versions.id"))
    # The actor is a human on the source's allowlist, whether or not the event addressed the
    # agent (a follow-up's verdict is "ignored"): in a worker's inbox, it carries authority.
    allowlisted: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    # Whether it was said in public (GitHub: not repository.private); None: not known.
    public: Mapped[bool | None] = mapped_column(Boolean)
    # Where ingest sent it: the router's inbox, the subscribed tickets' inboxes, or nowhere.
    route: Mapped[str | None] = mapped_column(String(20))
    created_at: Mapped[datetime] = _created()
    routed_at: Mapped[datetime | None]
    # Passed through to subscribed tickets and not yet in a router turn's digest.
    digested_at: Mapped[datetime | None]
    # Router turns over a batch holding it that failed (not counting an unreachable model),
    # and the last reason; past router.quarantine_after it is undecidable: out of the inbox
    # (routed_at set too) with its reason, until ``superagent triggers retry``.
    route_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    route_error: Mapped[str | None] = mapped_column(Text)
    undecidable_at: Mapped[datetime | None]
    # When its thread was told the model is unreachable and this waits (once per thread).
    model_notice_at: Mapped[datetime | None]


class Device(Base):
    """A paired endpoint. ``next_seq`` numbers its commands in delivery order."""

    __tablename__ = "devices"
    __table_args__ = (
        # Names address devices in chat (`/run alice-laptop ...`); a revoked device frees its.
        Index(
            "uq_devices_active_name",
            "name",
            unique=True,
            postgresql_where=text("revoked_at IS NULL"),
        ),
    )
    id: Mapped[str] = _id("dev")
    name: Mapped[str] = mapped_column(String(100))
    owner: Mapped[str | None] = mapped_column(String(200))
    public_key: Mapped[bytes | None] = mapped_column(LargeBinary)
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default=text("'{}'"))
    version: Mapped[str | None] = mapped_column(String(50))
    policy_hash: Mapped[str | None] = mapped_column(String(128))
    # How the device confines commands, in one line, as its last Hello said (endpointd's
    # sandbox summary); NULL: never reported, from a daemon older than the field.
    sandbox: Mapped[str | None] = mapped_column(Text)
    next_seq: Mapped[int] = mapped_column(BigInteger, default=1, server_default=text("1"))
    created_at: Mapped[datetime] = _created()
    last_seen_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    # Which replica holds the device's stream (NULL: offline). Liveness is judged with
    # last_seen_at too, since a replica killed with SIGKILL cannot clear it.
    connected_replica: Mapped[str | None] = mapped_column(String(200))
    connected_at: Mapped[datetime | None]
    # When its last RepositoryReport arrived (NULL: never, e.g. a daemon older than the
    # report), and whether its scan stopped at its bounds (there may be more).
    repositories_reported_at: Mapped[datetime | None]
    repositories_truncated: Mapped[bool | None]
    # The coding-agent CLIs it reported with them ([{name, version, allowed, logged_in}];
    # NULL: never, a daemon older than harnesses) and its policy's default ('' none).
    harnesses: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    default_harness: Mapped[str | None] = mapped_column(String(30))


class DeviceRepository(Base):
    """A git clone a device reported under its allowed roots; the device's next report
    replaces all of its rows (written only by ``gateway/repositories.py``). ``owner_name``:
    the remote's ``owner/name``, lower case, which tickets are routed by."""

    __tablename__ = "device_repositories"
    __table_args__ = (
        PrimaryKeyConstraint("device_id", "path"),
        Index(
            "ix_device_repositories_owner_name",
            "owner_name",
            postgresql_where=text("owner_name IS NOT NULL"),
        ),
    )
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    path: Mapped[str] = mapped_column(Text)
    remote: Mapped[str | None] = mapped_column(Text)
    owner_name: Mapped[str | None] = mapped_column(Text)
    default_branch: Mapped[str | None] = mapped_column(Text)
    reported_at: Mapped[datetime] = _created()


class PairingCode(Base):
    """A one-time code an admin or owner hands to a new device.

    Only a hash of the code is stored. ``lookup`` (the first half) finds the row so that
    wrong guesses can be counted per code; the whole code is what proves possession.
    """

    __tablename__ = "pairing_codes"
    __table_args__ = (
        Index("ix_pairing_codes_lookup", "lookup", postgresql_where=text("used_at IS NULL")),
    )
    id: Mapped[str] = _id("pcd")
    lookup: Mapped[str] = mapped_column(String(8))
    code_sha256: Mapped[str] = mapped_column(String(64))
    device_name: Mapped[str] = mapped_column(String(100))
    owner: Mapped[str | None] = mapped_column(String(200))
    # A team device: the group (``group:SOURCE:ID``) it is shared with once paired.
    shared_with: Mapped[str | None] = mapped_column(String(200))
    created_by: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[datetime]
    failed_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    used_at: Mapped[datetime | None]
    device_id: Mapped[str | None] = mapped_column(ForeignKey("devices.id"))
    created_at: Mapped[datetime] = _created()


class DeviceShare(Base):
    """The owner's delegation: ``grantee`` (a person, an account ``SOURCE:ID`` or a group
    ``group:SOURCE:ID``) may direct work to the device (``superagent devices share``)."""

    __tablename__ = "device_shares"
    __table_args__ = (PrimaryKeyConstraint("device_id", "grantee"),)
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    grantee: Mapped[str] = mapped_column(String(200))
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = _created()


class DeviceApproval(Base):
    """A request to use someone else's device, waiting for (or decided by) its owner.

    For a ticket (``ticket_id``) or for a rules-only ``/run`` (``run``: the command to queue
    once approved). ``owner`` is who may answer; ``principals`` who asked (their person,
    account and groups), recorded in the ticket's grant once approved.
    """

    __tablename__ = "device_approvals"
    __table_args__ = (
        CheckConstraint(_one_of("state", APPROVAL_STATES), name="state"),
        Index(
            "ix_device_approvals_pending", "created_at", postgresql_where=text("state = 'pending'")
        ),
        Index(None, "ticket_id"),
    )
    id: Mapped[str] = _id("apr")
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id"))
    ticket_id: Mapped[str | None] = mapped_column(ForeignKey("tickets.id"))
    trigger_id: Mapped[str | None] = mapped_column(ForeignKey("triggers.id"))
    thread_id: Mapped[str | None] = mapped_column(ForeignKey("threads.id"))
    owner: Mapped[str] = mapped_column(String(200))
    requester: Mapped[str] = mapped_column(String(200))  # for messages only
    principals: Mapped[list[str]] = mapped_column(
        ARRAY(String(200)), default=list, server_default=text("'{}'")
    )
    what: Mapped[str] = mapped_column(Text)
    run: Mapped[dict[str, Any] | None]
    # The ticket's state once approved: open (never ran) or waiting_device (rerouted).
    resume: Mapped[str | None] = mapped_column(String(20))
    state: Mapped[str] = mapped_column(String(20), default="pending", server_default="pending")
    created_at: Mapped[datetime] = _created()
    asked_at: Mapped[datetime | None]
    expires_at: Mapped[datetime | None]
    decided_at: Mapped[datetime | None]
    decided_by: Mapped[str | None] = mapped_column(String(200))
    decision_trigger_id: Mapped[str | None] = mapped_column(ForeignKey("triggers.id"))


class ApprovalAnswer(Base):
    """Every message read as an answer to an approval, accepted or ignored, and why."""

    __tablename__ = "approval_answers"
    __table_args__ = (PrimaryKeyConstraint("trigger_id", "approval_id"),)
    trigger_id: Mapped[str] = mapped_column(ForeignKey("triggers.id"))
    approval_id: Mapped[str] = mapped_column(String(16))  # as written: it may name nothing
    verb: Mapped[str] = mapped_column(String(10))
    outcome: Mapped[str] = mapped_column(String(10))  # accepted | ignored
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()


class PairingThrottle(Base):
    """Failed pairing attempts in the current window: per peer (``source``: an IPv4 address
    or an IPv6 /64) and, in the row ``*``, from all peers together (gateway/pairing.py)."""

    __tablename__ = "pairing_throttle"
    source: Mapped[str] = mapped_column(String(100), primary_key=True)
    window_start: Mapped[datetime]
    failures: Mapped[int] = mapped_column(Integer, default=0)


class ConsoleSession(Base):
    """A browser's sign-in (``kind`` session) or a one-time login link (``kind`` link).

    Only a SHA-256 of the secret is stored, so a read of this table opens nothing. A
    session ends at ``expires_at`` or when ``revoked_at`` is set (sign-out); a link is
    spent by its first use (``revoked_at``) and turns into a session.
    """

    __tablename__ = "console_sessions"
    __table_args__ = (CheckConstraint("kind IN ('session', 'link')", name="kind"),)
    secret_hash: Mapped[bytes] = mapped_column(LargeBinary, primary_key=True)
    kind: Mapped[str] = mapped_column(String(10))
    # Which admin token made it (a keyed digest, not the token): rotating the token ends
    # every session made from the old one.
    token_tag: Mapped[bytes] = mapped_column(LargeBinary)
    peer: Mapped[str | None] = mapped_column(String(100))
    created_at: Mapped[datetime] = _created()
    expires_at: Mapped[datetime] = mapped_column(index=True)
    revoked_at: Mapped[datetime | None]


class ApiToken(Base):
    """A named token for the HTTP API (``superagent tokens create``): what ``superagent
    login`` stores in a context. Its name is who acts: the audit identity of everything
    done with it. Only a SHA-256 of the secret is stored; revoked, it opens nothing."""

    __tablename__ = "api_tokens"
    __table_args__ = (
        Index(
            "uq_api_tokens_live_name",
            "name",
            unique=True,
            postgresql_where=text("revoked_at IS NULL"),
        ),
    )
    id: Mapped[str] = _id("tok")
    name: Mapped[str] = mapped_column(String(100))
    secret_hash: Mapped[bytes] = mapped_column(LargeBinary, unique=True)
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = _created()
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]


class SignInThrottle(Base):
    """Failed admin-token sign-ins per peer (an IPv4 address or an IPv6 /64) per window."""

    __tablename__ = "signin_throttle"
    peer: Mapped[str] = mapped_column(String(100), primary_key=True)
    window_start: Mapped[datetime]
    failures: Mapped[int] = mapped_column(Integer, default=0)


class Ticket(Base):
    """A unit of promised work."""

    __tablename__ = "tickets"
    __table_args__ = (
        CheckConstraint(_one_of("state", TicketState), name="state"),
        # The worker services' once-a-second look for tickets that need a round reads
        # live tickets only; finished ones pile up outside this index.
        Index(
            "ix_tickets_live",
            "state",
            postgresql_where=text(f"state NOT IN ({CLOSED_TICKET_SQL})"),
        ),
    )
    id: Mapped[str] = _id("tkt")
    title: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(
        String(20), default=TicketState.OPEN, server_default=TicketState.OPEN
    )
    device_id: Mapped[str | None] = mapped_column(ForeignKey("devices.id"))
    # Why the requester may use that device, checked in code when it was chosen: rule
    # (owner | delegated | shared | approved, or pending while the owner is asked), what
    # matched, by whom, when. The gateway queues none of the ticket's commands on a device
    # this does not cover (controlplane.gateway.authorization).
    device_grant: Mapped[dict[str, Any] | None]
    pr_url: Mapped[str | None] = mapped_column(Text)
    # Why it waits (waiting_device, waiting_human) or what it last reported: "question",
    # "blocked", "failed", "device_expired", ...; and until when (waiting_device).
    hold: Mapped[str | None] = mapped_column(String(50))
    wait_until: Mapped[datetime | None]
    # A speculative ticket delivers nothing unless its worker confirms a reproduction and a
    # fix; otherwise it is discarded without a word.
    speculative: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    # Where the work happens: the repository (owner/name), the directory on the device,
    # and the branch. Retries reuse all three.
    repo: Mapped[str | None] = mapped_column(String(300))
    workdir: Mapped[str | None] = mapped_column(Text)
    branch: Mapped[str | None] = mapped_column(String(300))
    # The ticket's own working tree on its device (a git worktree endpointd made, or a plain
    # directory used in place); where it was asked to start; when the device was told the
    # ticket ended (it removes the workspace after its retention).
    workspace: Mapped[str | None] = mapped_column(Text)
    workspace_base: Mapped[str | None] = mapped_column(String(30))
    workspace_released_at: Mapped[datetime | None]
    # The last event without authority (not allowlisted, a bot, CI) the worker read since
    # its last input with authority; NULL once an allowlisted person spoke after it. While
    # set, actions with effects outside the device wait for people (workers.hold_untrusted).
    untrusted_trigger_id: Mapped[str | None] = mapped_column(ForeignKey("triggers.id"))
    # Some of that input was said in public, or where it is not known to be private.
    untrusted_public: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=text("false")
    )
    tokens_used: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    cost_usd: Mapped[Decimal] = mapped_column(
        Numeric(12, 6), default=Decimal(0), server_default=text("0")
    )
    # Rounds that failed in a row (reset by a model step that succeeds), when the next one
    # may start, and why the last failed; past workers.failed_rounds_limit: blocked.
    failed_rounds: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    retry_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    # Rounds its pull request started without a person: by a failed CI result (capped by
    # workers.ci_fix_rounds_limit) and by bot events (workers.bot_rounds_limit), counted
    # since loop_since, the last event from a person (controlplane.tickets.pr_rounds).
    ci_fix_rounds: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    bot_rounds: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    loop_since: Mapped[datetime | None]
    # Who works it: "builtin" (the model loop here) or a harness on its device ("qwen",
    # "codex", "claude"); NULL until chosen (the router, else its first round).
    harness: Mapped[str | None] = mapped_column(String(30))
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class Mandate(Base):
    """Why a ticket exists and how far it may go; revoked when the ticket is stopped."""

    __tablename__ = "mandates"
    __table_args__ = (CheckConstraint(_one_of("kind", MANDATE_KINDS), name="kind"),)
    id: Mapped[str] = _id("mnd")
    ticket_id: Mapped[str] = mapped_column(ForeignKey("tickets.id"), index=True)
    kind: Mapped[str] = mapped_column(String(20))
    initiator_id: Mapped[str] = mapped_column(String(200))
    initiator_name: Mapped[str] = mapped_column(String(200))
    # The person behind the initiator's account, when linked (``superagent users link``).
    person_id: Mapped[str | None] = mapped_column(ForeignKey("people.id"))
    trigger_id: Mapped[str | None] = mapped_column(ForeignKey("triggers.id"))
    policy_version_id: Mapped[str | None] = mapped_column(ForeignKey("policy_versions.id"))
    scope: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()
    revoked_at: Mapped[datetime | None]


class Subscription(Base):
    """Thread ⇄ ticket "handled by": a trigger on the thread goes to the ticket's inbox."""

    __tablename__ = "subscriptions"
    __table_args__ = (PrimaryKeyConstraint("thread_id", "ticket_id"), Index(None, "ticket_id"))
    thread_id: Mapped[str] = mapped_column(ForeignKey("threads.id"))
    ticket_id: Mapped[str] = mapped_column(ForeignKey("tickets.id"))
    created_at: Mapped[datetime] = _created()


class InboxItem(Base):
    """A trigger delivered to a subscribed ticket's inbox (pass-through, no router turn)."""

    __tablename__ = "ticket_inbox"
    __table_args__ = (
        PrimaryKeyConstraint("ticket_id", "trigger_id"),
        Index(None, "trigger_id"),
        Index(
            "ix_ticket_inbox_unread",
            "ticket_id",
            "created_at",
            postgresql_where=text("read_at IS NULL AND handed_back_at IS NULL"),
        ),
    )
    ticket_id: Mapped[str] = mapped_column(ForeignKey("tickets.id"))
    trigger_id: Mapped[str] = mapped_column(ForeignKey("triggers.id"))
    created_at: Mapped[datetime] = _created()
    read_at: Mapped[datetime | None]  # taken by the ticket's worker
    handed_back_at: Mapped[datetime | None]  # the worker said it is not its business


class RouterDecision(Base):
    """One thing the router did (a tool call), with the triggers it concerned and the model
    call that produced it: why every ticket, reply and dismissal exists."""

    __tablename__ = "router_decisions"
    __table_args__ = (Index(None, "created_at"), Index(None, "trigger_ids", postgresql_using="gin"))
    id: Mapped[str] = _id("dec")
    session_id: Mapped[str | None] = mapped_column(ForeignKey("sessions.id"))
    llm_call_id: Mapped[str | None] = mapped_column(ForeignKey("llm_calls.id"))
    tool: Mapped[str] = mapped_column(String(50))
    arguments: Mapped[dict[str, Any]]
    trigger_ids: Mapped[list[str]] = mapped_column(ARRAY(String(16)), default=list)
    # What came of it: "created tkt_…", "refused: …", "would accept", ...
    outcome: Mapped[str] = mapped_column(Text)
    ok: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime] = _created()


class Pause(Base):
    """Present while the agent is paused (``superagent pause``): events are still recorded,
    but nothing is evaluated, dispatched or said until ``superagent resume``."""

    __tablename__ = "pause"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, default=1)
    paused_at: Mapped[datetime] = _created()
    paused_by: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text, default="")


class Lease(Base):
    """A named lease with a TTL (leader election): one holder at a time, taken over once it
    expires. Only single statements touch it, so it works behind PgBouncer too."""

    __tablename__ = "leases"
    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    acquired_at: Mapped[datetime]
    renewed_at: Mapped[datetime]
    expires_at: Mapped[datetime]


class Person(Base):
    """Someone who talks to the agent, on any channel (``superagent users``)."""

    __tablename__ = "people"
    id: Mapped[str] = _id("prs")
    name: Mapped[str] = mapped_column(String(100), unique=True)
    created_at: Mapped[datetime] = _created()


class Account(Base):
    """One of a person's channel accounts. ``handle`` is the channel's immutable actor id
    (controlplane.identities), matched exactly against an event's actor id, never its name.
    """

    __tablename__ = "accounts"
    __table_args__ = (PrimaryKeyConstraint("source", "handle"), Index(None, "person_id"))
    source: Mapped[str] = mapped_column(String(50))
    handle: Mapped[str] = mapped_column(String(200))
    person_id: Mapped[str] = mapped_column(ForeignKey("people.id", ondelete="CASCADE"))
    # The handle it was linked by (``octocat`` for github:583231), for display; never matched.
    label: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = _created()


class SentMessage(Base):
    """A reply a channel adapter posted: one per reply id, whatever the retries."""

    __tablename__ = "sent_messages"
    __table_args__ = (Index(None, "thread_id", "sent_at"),)
    reply_id: Mapped[str] = mapped_column(String(16), primary_key=True)
    source: Mapped[str] = mapped_column(String(50))
    thread_id: Mapped[str] = mapped_column(ForeignKey("threads.id"))
    external_id: Mapped[str] = mapped_column(String(500))  # the channel's message id
    text: Mapped[str] = mapped_column(Text)
    sent_at: Mapped[datetime] = _created()


class ChannelState(Base):
    """Small durable state of a channel's inbound loop: polling cursors, ETags, sync
    tokens. Written in the transaction that ingests what the state covers."""

    __tablename__ = "channel_state"
    __table_args__ = (PrimaryKeyConstraint("source", "key"),)
    source: Mapped[str] = mapped_column(String(50))
    key: Mapped[str] = mapped_column(String(300))
    value: Mapped[dict[str, Any]]
    updated_at: Mapped[datetime] = _created()


class Link(Base):
    """Thread ⇄ ticket "related to": context only, never delivery."""

    __tablename__ = "links"
    __table_args__ = (PrimaryKeyConstraint("thread_id", "ticket_id"), Index(None, "ticket_id"))
    thread_id: Mapped[str] = mapped_column(ForeignKey("threads.id"))
    ticket_id: Mapped[str] = mapped_column(ForeignKey("tickets.id"))
    created_at: Mapped[datetime] = _created()


class Session(Base):
    """An LLM conversation with its token and cost counters."""

    __tablename__ = "sessions"
    __table_args__ = (CheckConstraint(_one_of("kind", SESSION_KINDS), name="kind"),)
    id: Mapped[str] = _id("ses")
    kind: Mapped[str] = mapped_column(String(20))
    ticket_id: Mapped[str | None] = mapped_column(ForeignKey("tickets.id"), index=True)
    model: Mapped[str] = mapped_column(String(200))
    prompt_version_id: Mapped[str | None] = mapped_column(ForeignKey("prompt_versions.id"))
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    cost_usd: Mapped[Decimal] = mapped_column(
        Numeric(12, 6), default=Decimal(0), server_default=text("0")
    )
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class SessionMessage(Base):
    """One message of a session, in order; a resumed session replays these."""

    __tablename__ = "session_messages"
    __table_args__ = (
        UniqueConstraint("session_id", "seq"),
        CheckConstraint(_one_of("role", MESSAGE_ROLES), name="role"),
    )
    id: Mapped[str] = _id("msg")
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"))
    seq: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(20))
    content: Mapped[dict[str, Any]]
    prompt_version_id: Mapped[str | None] = mapped_column(ForeignKey("prompt_versions.id"))
    created_at: Mapped[datetime] = _created()


class Assignment(Base):
    """One execution round of a ticket, leased by one replica at a time."""

    __tablename__ = "assignments"
    __table_args__ = (
        Index(None, "ticket_id"),
        Index(
            "ix_assignments_active", "lease_expires_at", postgresql_where=text("ended_at IS NULL")
        ),
        # One round at a time per ticket.
        Index(
            "uq_assignments_one_active",
            "ticket_id",
            unique=True,
            postgresql_where=text("ended_at IS NULL"),
        ),
        CheckConstraint(_one_of("slot", SLOT_KINDS), name="slot"),
    )
    id: Mapped[str] = _id("asg")
    ticket_id: Mapped[str] = mapped_column(ForeignKey("tickets.id"))
    session_id: Mapped[str | None] = mapped_column(ForeignKey("sessions.id"))
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None]
    turns: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    slot: Mapped[str] = mapped_column(String(20), default="regular", server_default="regular")
    # What started this round: "new", "takeover", "device", "human", "event", "retry".
    woken_by: Mapped[str] = mapped_column(String(50), default="new", server_default="new")
    outcome: Mapped[str | None] = mapped_column(String(50))
    created_at: Mapped[datetime] = _created()
    ended_at: Mapped[datetime | None]


class Command(Base):
    """One operation for a device, delivered in ``seq`` order; credentials by name only."""

    __tablename__ = "commands"
    __table_args__ = (
        UniqueConstraint("device_id", "seq"),
        CheckConstraint(_one_of("state", CommandState), name="state"),
        CheckConstraint(_one_of("kind", COMMAND_KINDS), name="kind"),
        Index(
            "ix_commands_pending",
            "device_id",
            "seq",
            postgresql_where=text(f"state IN ({sql_list(_PENDING_INDEXED)})"),
        ),
    )
    id: Mapped[str] = _id("cmd")
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id"))
    ticket_id: Mapped[str | None] = mapped_column(ForeignKey("tickets.id"), index=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(20))
    spec: Mapped[dict[str, Any]]
    credential_names: Mapped[list[str]] = mapped_column(
        ARRAY(String(200)), default=list, server_default=text("'{}'")
    )
    state: Mapped[str] = mapped_column(
        String(20), default=CommandState.QUEUED, server_default=CommandState.QUEUED
    )
    not_after: Mapped[datetime]
    exit_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    output_head: Mapped[bytes] = mapped_column(
        LargeBinary, default=b"", server_default=text("''::bytea")
    )
    output_tail: Mapped[bytes] = mapped_column(
        LargeBinary, default=b"", server_default=text("''::bytea")
    )
    output_size: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    output_blob_id: Mapped[str | None] = mapped_column(ForeignKey("blobs.id"))
    # Reported by the device's Finished; the result is final only once every byte up to
    # it is stored.
    total_output_bytes: Mapped[int | None] = mapped_column(BigInteger)
    signal: Mapped[int | None] = mapped_column(Integer)
    timed_out: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    output_truncated: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=text("false")
    )
    refusal_reason: Mapped[str | None] = mapped_column(String(50))
    # From the device's AwaitingApproval: the local policy rule that asked for a human, and
    # when the device gives up waiting (REASON_APPROVAL_TIMEOUT). Kept after the decision.
    approval_rule: Mapped[str | None] = mapped_column(Text)
    approval_deadline: Mapped[datetime | None]
    origin: Mapped[str] = mapped_column(Text, default="", server_default="")
    created_at: Mapped[datetime] = _created()
    delivered_at: Mapped[datetime | None]
    accepted_at: Mapped[datetime | None]
    cancel_requested_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class Effect(Base):
    """The outbox (docs/architecture.md, *Rules everything relies on*, rule 1). See
    ``controlplane.effects`` for the protocol.

    ``next_attempt_at`` doubles as the claim lease: claiming pushes it to now + lease, so a
    dead runner's effect becomes ready again by itself and the ready index stays one range.
    """

    __tablename__ = "effects"
    __table_args__ = (
        UniqueConstraint("kind", "key"),
        Index("ix_effects_ready", "next_attempt_at", postgresql_where=text("dead_at IS NULL")),
    )
    id: Mapped[str] = _id("eff")
    kind: Mapped[str] = mapped_column(String(100))
    key: Mapped[str] = mapped_column(String(500))
    payload: Mapped[dict[str, Any]]
    generation: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    # Every claim, never reset (attempts is the failure budget, which starts over).
    claims: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    next_attempt_at: Mapped[datetime] = mapped_column(server_default=func.now())
    locked_by: Mapped[str | None] = mapped_column(String(200))
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()
    dead_at: Mapped[datetime | None]


class ItemFailure(Base):
    """One item that failed while a loop handled it: recorded, then retried or quarantined
    (controlplane.failures). ``/metrics`` counts them by loop and class."""

    __tablename__ = "item_failures"
    __table_args__ = (
        Index(None, "created_at"),
        Index(None, "item_id"),
        CheckConstraint(_one_of("error_class", FAILURE_CLASSES), name="error_class"),
    )
    id: Mapped[str] = _id("ifl")
    loop: Mapped[str] = mapped_column(String(30))  # router, workers, effects, ...
    item_id: Mapped[str] = mapped_column(String(500))  # trg_…, tkt_…, eff_…
    error_class: Mapped[str] = mapped_column(String(20))
    error: Mapped[str] = mapped_column(Text)
    # This failure was the last try: the item is quarantined.
    quarantined: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    created_at: Mapped[datetime] = _created()


class LlmCall(Base):
    """Accounting for one model call: what it cost and how long it took."""

    __tablename__ = "llm_calls"
    __table_args__ = (
        Index(None, "created_at"),
        CheckConstraint(_one_of("outcome", LLM_OUTCOMES), name="outcome"),
    )
    id: Mapped[str] = _id("llm")
    session_id: Mapped[str | None] = mapped_column(ForeignKey("sessions.id"), index=True)
    model: Mapped[str] = mapped_column(String(200))
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    latency_ms: Mapped[int] = mapped_column(Integer)
    batch_size: Mapped[int] = mapped_column(Integer, default=1)
    cost_usd: Mapped[Decimal] = mapped_column(Numeric(12, 6), default=Decimal(0))
    error: Mapped[str | None] = mapped_column(Text)
    outcome: Mapped[str] = mapped_column(String(20), default="ok", server_default="ok")
    # The versions the call was made with (prompts and policies are immutable versions).
    prompt_version_id: Mapped[str | None] = mapped_column(ForeignKey("prompt_versions.id"))
    policy_version_id: Mapped[str | None] = mapped_column(ForeignKey("policy_versions.id"))
    created_at: Mapped[datetime] = _created()


class Report(Base):
    """What a worker reported: ``report(status, summary, question?, pr_url?)``."""

    __tablename__ = "reports"
    __table_args__ = (
        Index(None, "ticket_id", "created_at"),
        CheckConstraint(_one_of("status", REPORT_STATUSES), name="status"),
    )
    id: Mapped[str] = _id("rpt")
    ticket_id: Mapped[str] = mapped_column(ForeignKey("tickets.id"))
    assignment_id: Mapped[str | None] = mapped_column(ForeignKey("assignments.id"))
    status: Mapped[str] = mapped_column(String(20))
    summary: Mapped[str] = mapped_column(Text)
    question: Mapped[str | None] = mapped_column(Text)
    pr_url: Mapped[str | None] = mapped_column(Text)
    # The ticket's totals when it reported (every result states tokens and cost).
    tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    cost_usd: Mapped[Decimal] = mapped_column(
        Numeric(12, 6), default=Decimal(0), server_default=text("0")
    )
    # The router's inbox entry it became (only ready/question/blocked/failed get one).
    trigger_id: Mapped[str | None] = mapped_column(ForeignKey("triggers.id"))
    created_at: Mapped[datetime] = _created()


class Job(Base):
    """A shell command a worker started. One still running when its tool call returned is a
    background job: its completion reaches the worker as an event (``reported_at``)."""

    __tablename__ = "jobs"
    __table_args__ = (
        Index(
            "ix_jobs_unreported",
            "ticket_id",
            postgresql_where=text("background AND reported_at IS NULL"),
        ),
    )
    command_id: Mapped[str] = mapped_column(ForeignKey("commands.id"), primary_key=True)
    ticket_id: Mapped[str] = mapped_column(ForeignKey("tickets.id"))
    tool_call_id: Mapped[str | None] = mapped_column(String(100))
    script: Mapped[str] = mapped_column(Text)
    background: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    created_at: Mapped[datetime] = _created()
    reported_at: Mapped[datetime | None]


class HarnessRun(Base):
    """One run of a coding-agent CLI for a ticket (controlplane.workers.harness): the device
    command, the harness's own session id (a follow-up resumes it), its first and last
    events, and what it reported using. ``events``: how many of its events are recorded in
    the ticket's session (a replica taking over records the rest, each once)."""

    __tablename__ = "harness_runs"
    id: Mapped[str] = _id("hrn")
    ticket_id: Mapped[str] = mapped_column(ForeignKey("tickets.id"), index=True)
    assignment_id: Mapped[str | None] = mapped_column(ForeignKey("assignments.id"))
    command_id: Mapped[str] = mapped_column(ForeignKey("commands.id"))
    harness: Mapped[str] = mapped_column(String(30))
    session_id: Mapped[str | None] = mapped_column(Text)
    resumed: Mapped[str | None] = mapped_column(Text)  # the session id it continued
    events: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    turns: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    cost_usd: Mapped[Decimal | None] = mapped_column(Numeric(12, 6))
    outcome: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()
    first_event_at: Mapped[datetime | None]
    last_event_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]


class WorkerEvent(Base):
    """Something for a ticket's worker that is not a channel event: a retry, a reroute, a
    pull request opened, a delivery of a speculative result."""

    __tablename__ = "worker_events"
    __table_args__ = (
        Index("ix_worker_events_unread", "ticket_id", postgresql_where=text("read_at IS NULL")),
    )
    id: Mapped[str] = _id("wev")
    ticket_id: Mapped[str] = mapped_column(ForeignKey("tickets.id"))
    kind: Mapped[str] = mapped_column(String(50))
    text: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()
    read_at: Mapped[datetime | None]


class Replica(Base):
    """A running control-plane replica, heartbeating (the watchdog notices silence)."""

    __tablename__ = "replicas"
    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(200))
    version: Mapped[str] = mapped_column(String(50))
    started_at: Mapped[datetime] = _created()
    heartbeat_at: Mapped[datetime] = _created()
    stopped_at: Mapped[datetime | None]
    # What it runs with, secrets excluded (controlplane.heartbeat.Record): pid, models,
    # the model endpoint's host, enabled channels. {}: written by a release before 0021.
    runs_with: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default=text("'{}'"))


class Finding(Base):
    """Something the watchdog noticed. One open finding per (kind, subject); seen again,
    it counts up; gone, it is resolved."""

    __tablename__ = "watchdog_findings"
    __table_args__ = (
        Index(
            "uq_watchdog_findings_open",
            "kind",
            "subject",
            unique=True,
            postgresql_where=text("resolved_at IS NULL"),
        ),
        Index(None, "first_seen_at"),
        CheckConstraint(_one_of("severity", FINDING_SEVERITIES), name="severity"),
    )
    id: Mapped[str] = _id("wfd")
    kind: Mapped[str] = mapped_column(String(50))
    subject: Mapped[str] = mapped_column(String(200))  # a tkt_, dev_, replica id, "llm", ...
    severity: Mapped[str] = mapped_column(String(20))
    summary: Mapped[str] = mapped_column(Text)
    details: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default=text("'{}'"))
    times_seen: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    first_seen_at: Mapped[datetime] = _created()
    last_seen_at: Mapped[datetime] = _created()
    resolved_at: Mapped[datetime | None]


class WatchdogAction(Base):
    """What the watchdog did about a finding: nudge, requeue, stop, pause, alert."""

    __tablename__ = "watchdog_actions"
    __table_args__ = (Index(None, "finding_id"), Index(None, "created_at"))
    id: Mapped[str] = _id("wac")
    finding_id: Mapped[str] = mapped_column(ForeignKey("watchdog_findings.id"))
    action: Mapped[str] = mapped_column(String(50))
    detail: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = _created()
