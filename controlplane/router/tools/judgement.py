"""The router's judgements of triggers: ``ignore`` one that needs nothing, and ``assess``
an inferred candidate against every enabled rule of its source
(:mod:`controlplane.ingest.admission`).

An explicit request (an allowlisted person addressing the agent), or a worker's report,
cannot be ignored in silence: ``ignore`` refuses it until the turn has replied on its
thread. Found with a real small model (issue 32), which ignored "add a CONTRIBUTORS file"
and nobody answered."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from controlplane.ingest import admission
from controlplane.ingest.routing import REPORT_VERDICT
from controlplane.router.tools.core import Call, Done, RouterTools, trigger
from controlplane.tools.fields import NON_BLANK, Arguments, TriggerId
from controlplane.tools.registry import Refused

tools = RouterTools()


class Ignore(Arguments):
    trigger: TriggerId
    reason: Annotated[str, Field(max_length=2000), NON_BLANK]


@tools.tool(
    "ignore",
    "Decide that a trigger needs nothing. An explicit request is answered instead: a "
    "ticket, or a reply on its thread.",
)
async def ignore(call: Call, args: Ignore) -> Done:
    found = await trigger(call.conn, args.trigger)
    answered = call.replies.made(call.turn.key, found["thread_id"])
    if found["verdict"] == "explicit" and not answered:
        # A person who asked the agent hears back, whatever the model thinks of the ask.
        raise Refused(
            f"{args.trigger} is an explicit request from {found['actor_name']}, who must hear "
            f"back: create a ticket for it, or reply on {found['thread_id']} (a reply decides "
            "it; say in a line why nothing will be done)"
        )
    if found["verdict"] == REPORT_VERDICT and not answered:
        # How a ticket ended (or what it asks) is the asker's to hear.
        raise Refused(
            f"{args.trigger} is a report by the {found['actor_name']} for the people on "
            f"{found['thread_id']}: pass it on with reply on {found['thread_id']} (a reply "
            "decides it)"
        )
    return Done({"ignored": args.trigger}, f"ignored: {args.reason}", [args.trigger])


class Verdict(Arguments):
    rule: str
    matches: bool
    why: str


class Assess(Arguments):
    trigger: TriggerId
    verdicts: list[Verdict]
    intent: Annotated[str, Field(description="What would be done.")]
    target: Annotated[str, Field(description="Where (repository, service...).")]


@tools.tool("assess", "Judge an inferred candidate against every enabled rule of its source.")
async def assess(call: Call, args: Assess) -> Done:
    candidate = await trigger(call.conn, args.trigger)
    if candidate["verdict"] != "candidate":
        raise Refused(f"{args.trigger} is not an inferred candidate ({candidate['verdict']})")
    assessment = admission.Assessment(
        verdicts=tuple(admission.RuleVerdict(v.rule, v.matches, v.why) for v in args.verdicts),
        intent=args.intent,
        target=args.target,
    )
    _, current = await call.policy.current()
    source = current.for_source(candidate["source"])
    accepts, why = admission.assessment_accepts(source, assessment)
    content: dict[str, Any]
    if source.inferred == "auto":
        outcome = "accepted" if accepts else "rejected"
        content = {"accepted": accepts, "why": why}
    else:
        # observe (or since turned off): on record, and nothing may come of it.
        outcome = "would accept" if accepts else "would not accept"
        content = {
            "accepted": False,
            "why": f"{why}; this source only observes inferred candidates",
        }
    return Done(content, outcome, [args.trigger])
