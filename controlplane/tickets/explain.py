""" "Why is tkt_x stuck?": an answer grounded in recorded state, not in a model's guess.

:func:`facts` gathers what the database says about a ticket (its state and why, its
device, its current round and last activity, jobs still running, its last report, the
watchdog's open findings and actions). The router's ``explain`` tool hands these to the
model to phrase; rules-only mode's ``/why`` renders them with :func:`render`.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from controlplane.domain import TERMINAL_COMMAND_STATES
from controlplane.findings import open_findings
from controlplane.gateway import authorization as access
from controlplane.gateway.devices import ONLINE_WINDOW


async def facts(pool: asyncpg.Pool, ticket_id: str) -> dict[str, Any] | None:
    ticket = await pool.fetchrow(
        "SELECT t.id, t.title, t.state, t.hold, t.wait_until, t.pr_url, t.tokens_used, "
        "t.updated_at, t.device_grant, d.name AS device, d.last_seen_at, "
        "d.connected_replica IS NOT NULL AND d.last_seen_at > now() - $2::interval AS online "
        "FROM tickets t LEFT JOIN devices d ON d.id = t.device_id WHERE t.id = $1",
        ticket_id,
        ONLINE_WINDOW,
    )
    if ticket is None:
        return None
    out: dict[str, Any] = {
        "ticket": ticket["id"],
        "title": ticket["title"],
        "state": ticket["state"],
        "why": ticket["hold"],
        "device": ticket["device"],
        "device_online": bool(ticket["online"]),
        "device_last_seen": _iso(ticket["last_seen_at"]),
        "waits_until": _iso(ticket["wait_until"]),
        "pull_request": ticket["pr_url"],
        "tokens": ticket["tokens_used"],
        # Why its requester may use the device, or whose approval it waits for.
        "device_access": access.loads(ticket["device_grant"]),
    }
    round_ = await pool.fetchrow(
        "SELECT a.id, a.created_at, a.lease_owner, a.lease_expires_at, a.turns, a.woken_by, "
        "(SELECT max(m.created_at) FROM session_messages m WHERE m.session_id = a.session_id) "
        "  AS last_message "
        "FROM assignments a WHERE a.ticket_id = $1 ORDER BY a.created_at DESC LIMIT 1",
        ticket_id,
    )
    if round_ is not None:
        out["round"] = {
            "id": round_["id"],
            "started": _iso(round_["created_at"]),
            "woken_by": round_["woken_by"],
            "model_calls": round_["turns"],
            "held_by": round_["lease_owner"],
            "lease_until": _iso(round_["lease_expires_at"]),
            "last_activity": _iso(round_["last_message"]),
        }
    jobs = await pool.fetch(
        "SELECT c.id, c.state, j.script, c.created_at FROM jobs j "
        "JOIN commands c ON c.id = j.command_id "
        "WHERE j.ticket_id = $1 AND c.state <> ALL($2::text[]) ORDER BY c.seq",
        ticket_id,
        list(TERMINAL_COMMAND_STATES),
    )
    out["unfinished_commands"] = [
        {
            "job": j["id"],
            "state": j["state"],
            "command": j["script"][:200],
            "since": _iso(j["created_at"]),
        }
        for j in jobs
    ]
    report = await pool.fetchrow(
        "SELECT status, summary, question, created_at FROM reports WHERE ticket_id = $1 "
        "ORDER BY created_at DESC LIMIT 1",
        ticket_id,
    )
    if report is not None:
        out["last_report"] = {
            "status": report["status"],
            "summary": report["summary"][:1000],
            "question": report["question"],
            "at": _iso(report["created_at"]),
        }
    out["watchdog"] = [
        {
            "finding": f["kind"],
            "summary": f["summary"],
            "since": _iso(f["first_seen_at"]),
            "actions": list(f["actions"]),
        }
        for f in await open_findings(pool, ticket_id)
    ]
    return out


def _iso(value: Any) -> str | None:
    return None if value is None else f"{value:%Y-%m-%d %H:%M:%S} UTC"


def render(found: dict[str, Any]) -> str:
    """The facts as a short answer (rules-only mode, the CLI)."""
    lines = [
        f'{found["ticket"]} "{found["title"]}" is {found["state"]}'
        + (f" ({found['why']})" if found.get("why") else "")
        + "."
    ]
    if found.get("device"):
        where = (
            "online"
            if found["device_online"]
            else f"offline (last seen {found['device_last_seen']})"
        )
        lines.append(f"Device {found['device']}: {where}.")
    grant = found.get("device_access") or {}
    if grant.get("rule") == access.PENDING:
        lines.append(
            f"It waits for {grant.get('owner')}, the device's owner, to approve "
            f"{grant.get('approval')}: nothing runs before."
        )
    if found.get("waits_until"):
        lines.append(f"It waits for its device until {found['waits_until']}.")
    round_ = found.get("round")
    if round_:
        lines.append(
            f"Latest round {round_['id']} (woken by {round_['woken_by']}) started "
            f"{round_['started']}, {round_['model_calls']} model calls, last activity "
            f"{round_['last_activity'] or 'none'}."
        )
    for job in found.get("unfinished_commands", []):
        lines.append(
            f"Command {job['job']} is {job['state']} since {job['since']}: {job['command']}"
        )
    report = found.get("last_report")
    if report:
        lines.append(f"Last report ({report['at']}): {report['status']}: {report['summary']}")
        if report.get("question"):
            lines.append(f"It asked: {report['question']}")
    for finding in found.get("watchdog", []):
        done = "; done: " + ", ".join(finding["actions"]) if finding["actions"] else ""
        lines.append(f"Watchdog: {finding['summary']} (since {finding['since']}){done}.")
    return "\n".join(lines)
