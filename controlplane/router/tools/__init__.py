"""The router's tools: what the model may do, with authority enforced here, not in the prompt.

The model proposes, this package disposes. A tool call the rules do not allow is refused
with a reason the model can read and act on. Examples: a ticket whose mandate would rest
on an event that is not an explicit request, or an unknown thread. Every call, allowed or
refused, is recorded in ``router_decisions`` with the triggers it concerned and the model
call that made it (:mod:`.toolbox`).

Each tool is a handler beside its pydantic argument model, from which the schema the model
is shown is generated (:mod:`controlplane.tools`):

* :mod:`.tickets`: ``create_ticket(title, scope, threads?, device, mandate_from?, repo?,
  workdir?, speculative?)``: work, resting on one trigger's authority (by default the
  batch's one explicit request; never guessed among several), opened by
  :mod:`controlplane.tickets.opening`; a worker picks it up (:mod:`controlplane.workers`).
  ``explain(ticket)``: the recorded facts behind "why is tkt_x stuck?".
  ``forward(trigger, ticket)``: give an event to a ticket's worker (used when pass-through
  is off). ``stop_ticket(ticket, reason)``.
* :mod:`.threads`: ``reply(thread, text)`` through the outbox; ``subscribe(thread,
  ticket)`` / ``link(thread, ticket)``: "handled by" (its events go to the ticket) versus
  "related to" (context only); ``recall(id)``: an object with summaries and its
  neighbours' IDs (Chain of Recall).
* :mod:`.judgement`: ``ignore(trigger, reason)``, refused for an explicit request whose
  thread the turn has not replied on (the person hears back); ``assess(trigger, verdicts, intent,
  target)``: the structured judgement of an inferred candidate against its source's rules.
* ``subagent(...)``: only in the single-session baseline: create_ticket, then the work
  itself inside the call (:mod:`controlplane.workers.subagent`).
"""
