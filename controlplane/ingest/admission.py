"""Admission: who may ask the agent for what, the fast, deterministic first judgement of
every event.

The word is *admission* (whether a request is let in, and as what); "policy" is the
device's own word, endpointd's local rules of what a command may do there. The stored
document keeps its older name where people and data see it: ``superagent admission``, the
``policy_versions`` rows named :data:`POLICY_NAME`.

No model is involved. Who is authorized comes only from what the channel adapter verified
about the event (its source and its actor's immutable id, bot flag and groups, and the
person that id is linked to); the actor's name is for display only, and the event's text is
read for one thing only, whether it addresses the agent, and can never make its author
someone else.

Verdicts:

* ``explicit``: an allowlisted human addressing the agent. May become a ticket.
* ``candidate``: anything else the source lets through. With ``inferred`` = ``observe``
  the router records what it would have done and creates nothing; with ``auto`` a ticket
  needs a complete assessment (:func:`assessment_accepts`); with ``off`` it is ignored.
* ``ignored``: nothing to decide. ``noise`` marks what is dropped even on a thread a
  ticket is subscribed to (an ignored source, a blocklisted bot, the agent's own messages);
  other ignored events still reach subscribed tickets as information (pass-through adds no
  authority).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from controlplane.errors import InvalidInput

POLICY_NAME = "ingest"  # the name of the admission document's versions in policy_versions

SourceMode = Literal["explicit", "candidate", "ignore"]
InferredMode = Literal["off", "observe", "auto"]
VerdictKind = Literal["explicit", "candidate", "ignored"]


WEB_CONSOLE_GROUP = "console"  # the group of every web chat user (authenticated by the console)


class Rule(BaseModel):
    """A condition under which an inferred candidate may become work (judged by the router)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=100, pattern=r"^[a-z0-9][a-z0-9_-]*$")
    description: str = Field(min_length=1, max_length=2000)
    enabled: bool = True


class SourceAdmission(BaseModel):
    """What one source (a channel) admits: whose requests are explicit, what else may be."""

    model_config = ConfigDict(extra="forbid")
    mode: SourceMode = "explicit"
    # Whose requests are explicit: immutable actor ids (controlplane.identities: a GitHub
    # numeric id, a Slack TEAM/USER, a Lark open_id, a Matrix id, web:admin) or the names
    # of people (``superagent users link``). Never display names or handles: a handle given
    # on save is resolved to its id then (controlplane.handles).
    users: list[str] = Field(default_factory=list)
    # Group ids (GitHub teams, Slack user groups, Matrix rooms...) whose members' are.
    groups: list[str] = Field(default_factory=list)
    # Bots whose events are dropped outright, even on subscribed threads (actor ids).
    bots: list[str] = Field(default_factory=list)
    # How people address the agent in text, e.g. "@superagent". Case-insensitive, and only
    # as a whole word: "@superagents" does not count.
    mentions: list[str] = Field(default_factory=lambda: ["@superagent"])
    inferred: InferredMode = "off"
    rules: list[Rule] = Field(default_factory=list)
    # Tickets started from this source's inferred candidates are speculative: their workers
    # quietly try to reproduce and fix, and nothing is said unless they confirm both.
    speculative: bool = False

    @field_validator("rules")
    @classmethod
    def _unique_rule_names(cls, rules: list[Rule]) -> list[Rule]:
        names = [rule.name for rule in rules]
        duplicated = sorted({name for name in names if names.count(name) > 1})
        if duplicated:
            raise ValueError(f"rule names must be unique; repeated: {', '.join(duplicated)}")
        return rules


# Where create_ticket sends work for a repository when the requester's own device that has
# it is offline (controlplane.tickets.placement): to an online device shared with them that
# has it, to asking them, or to waiting for their own device.
OfflineOwnerDevice = Literal["shared", "ask", "wait"]


class DevicePlacement(BaseModel):
    """How tickets find a device when the request names a repository and no device
    (``controlplane.tickets.placement``; stored under the document's key ``routing``)."""

    model_config = ConfigDict(extra="forbid")
    # "shared" by default: someone who asks for work expects it to start, and a device
    # shared with them was shared for that; the answer names the device, so they can move
    # it. "ask" puts the choice to them; "wait" keeps it for their own device.
    offline_owner_device: OfflineOwnerDevice = "shared"


class Admission(BaseModel):
    """The whole admission document as stored (one JSON document per version)."""

    model_config = ConfigDict(extra="forbid")
    # The agent's own actor ids on every channel: its messages are never triggers.
    agent_ids: list[str] = Field(default_factory=list)
    default: SourceAdmission = Field(default_factory=SourceAdmission)
    # The built-in web chat is reached only by console users (the admin token, or loopback
    # in development), whose messages carry the group "console": they are explicit
    # requests out of the box. Other channels allowlist nobody until configured.
    sources: dict[str, SourceAdmission] = Field(
        default_factory=lambda: {"web": SourceAdmission(groups=[WEB_CONSOLE_GROUP])}
    )
    # For people reading the document: the handle each id was resolved from on save
    # (``"583231": "github:octocat"``). Display only: never matched.
    labels: dict[str, str] = Field(default_factory=dict)
    routing: DevicePlacement = Field(default_factory=DevicePlacement)
    # Entries a migration could not turn into ids, with where they were: inert, kept on
    # record until someone resolves them (``superagent admission edit``).
    unresolved: list[str] = Field(default_factory=list)

    def for_source(self, source: str) -> SourceAdmission:
        return self.sources.get(source, self.default)


def parse(body: object) -> Admission:
    """A stored or submitted admission document; InvalidInput naming what is wrong."""
    try:
        return Admission.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'policy'}: {error['msg']}"
            for error in exc.errors()
        )
        raise InvalidInput(f"invalid policy: {problems}") from None


@dataclass(frozen=True)
class Actor:
    """Who sent an event, as verified by the channel adapter (never from the text)."""

    id: str  # the channel's immutable id (controlplane.identities): what authority matches
    name: str  # for display only: a handle or display name anyone may choose or reuse
    is_bot: bool = False
    groups: tuple[str, ...] = ()
    # The person linked to this account (``superagent users link``): allowlists may name
    # people, so one entry covers someone's accounts on every channel.
    person: str | None = None


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    reason: str
    noise: bool = False  # dropped even where a ticket is subscribed
    inferred: InferredMode | None = None  # for candidates: what the router may do with it
    # A human on the source's allowlist, addressing the agent or not: a follow-up on a
    # ticket's thread carries authority in its worker's inbox (controlplane.tickets.events).
    allowlisted: bool = False

    @property
    def needs_router(self) -> bool:
        return self.kind == "explicit" or (
            self.kind == "candidate" and self.inferred in ("observe", "auto")
        )


@dataclass(frozen=True)
class Event:
    source: str
    actor: Actor
    text: str = ""
    # The channel itself addresses the agent (a direct message, the web chat, an issue
    # assigned to the agent), so no mention is needed.
    direct: bool = False


def _mentioned(text: str, mentions: list[str]) -> bool:
    for mention in mentions:
        if mention and re.search(rf"(?<![\w@]){re.escape(mention)}(?![\w-])", text, re.I):
            return True
    return False


def _listed(actor: Actor, entries: list[str], *, people: bool = False) -> bool:
    """Whether ``entries`` name the actor by its immutable id (exactly: ids are the
    channel's, not typed by people) or, with ``people``, name the person it is linked to.
    Never by its name: anyone can choose a display name, and a handle can change hands."""
    if actor.id in entries:
        return True
    return (
        people
        and actor.person is not None
        and actor.person.casefold() in {entry.casefold() for entry in entries}
    )


def evaluate(rules: Admission, event: Event) -> Verdict:
    """Judge ``event`` under ``rules``. Pure: the same inputs always give the same verdict."""
    source = rules.for_source(event.source)
    actor = event.actor
    if source.mode == "ignore":
        return Verdict("ignored", f"source {event.source} is ignored", noise=True)
    if _listed(actor, rules.agent_ids):
        return Verdict("ignored", "the agent's own message", noise=True)
    if actor.is_bot and _listed(actor, source.bots):
        return Verdict("ignored", f"bot {actor.name} is blocklisted", noise=True)
    allowlisted = _listed(actor, source.users, people=True) or bool(
        {g.casefold() for g in actor.groups} & {g.casefold() for g in source.groups}
    )
    addressed = event.direct or _mentioned(event.text, source.mentions)
    if allowlisted and addressed and not actor.is_bot:
        return Verdict(
            "explicit", f"{actor.name} is allowlisted and addressed the agent", allowlisted=True
        )
    heard = allowlisted and not actor.is_bot  # bots never carry authority
    why = (
        "bots never make explicit requests"
        if actor.is_bot
        else f"{actor.name} is not allowlisted"
        if not allowlisted
        else "the agent was not addressed"
    )
    if source.mode == "explicit":
        return Verdict(
            "ignored",
            f"not an explicit request ({why}); source takes only those",
            allowlisted=heard,
        )
    if source.inferred == "off":
        return Verdict(
            "ignored",
            f"inferred candidate ({why}); inferred requests are off",
            allowlisted=heard,
        )
    return Verdict(
        "candidate", f"inferred candidate ({why})", inferred=source.inferred, allowlisted=heard
    )


@dataclass(frozen=True)
class RuleVerdict:
    rule: str
    matches: bool
    why: str = ""


@dataclass(frozen=True)
class Assessment:
    """The router's structured judgement of an inferred candidate (its ``assess`` tool)."""

    verdicts: tuple[RuleVerdict, ...]
    intent: str
    target: str


def assessment_accepts(source: SourceAdmission, assessment: Assessment) -> tuple[bool, str]:
    """Whether ``auto`` mode may act on a candidate: every enabled rule judged exactly once,
    nothing else judged, at least one match, and both intent and target stated."""
    enabled = [rule.name for rule in source.rules if rule.enabled]
    if not enabled:
        return False, "no rules are enabled for this source"
    judged = [verdict.rule for verdict in assessment.verdicts]
    missing = [name for name in enabled if name not in judged]
    if missing:
        return False, f"rules not judged: {', '.join(missing)}"
    twice = sorted({name for name in judged if judged.count(name) > 1})
    if twice:
        return False, f"rules judged more than once: {', '.join(twice)}"
    unknown = [name for name in judged if name not in enabled]
    if unknown:
        return False, f"not an enabled rule: {', '.join(unknown)}"
    if not any(verdict.matches for verdict in assessment.verdicts):
        return False, "no rule matches"
    if not assessment.intent.strip() or not assessment.target.strip():
        return False, "intent and target must both be stated"
    return True, "every enabled rule judged, " + ", ".join(
        verdict.rule for verdict in assessment.verdicts if verdict.matches
    ) + " matched"
