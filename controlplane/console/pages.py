"""The console's HTML: one shell per page (navigation, the page's containers) and the
sign-in page. Data never appears here: ``static/console.js`` fetches it as JSON from
``data-api`` and renders it, and refreshes when the websocket says a ``data-topics`` topic
changed. So every value reaching the page is set as text by the script, never as markup.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from urllib.parse import quote, urlencode

from controlplane import __version__
from controlplane.console.feed import VERDICTS
from controlplane.db.models import TRIGGER_ROUTES

STATIC = "/console/static"


@dataclass(frozen=True)
class Page:
    key: str
    path: str
    title: str
    topics: tuple[str, ...]
    api: str


OVERVIEW = Page(
    "overview",
    "/console",
    "Overview",
    ("status", "tickets", "commands", "findings", "effects", "devices"),
    "/console/api/overview",
)
TICKETS = Page("tickets", "/console/tickets", "Tickets", ("tickets",), "/console/api/tickets")
# One ticket: under Tickets in the navigation, rendered by its own function.
TICKET = Page(
    "ticket", "/console/tickets", "Ticket", ("tickets", "transcript", "commands", "devices"), ""
)
DEVICES = Page(
    "devices", "/console/devices", "Devices", ("devices", "commands"), "/console/api/devices"
)
TRIGGERS = Page(
    "triggers", "/console/triggers", "Trigger feed", ("triggers",), "/console/api/triggers"
)
COSTS = Page("costs", "/console/costs", "Costs", ("costs",), "/console/api/costs")
VERSIONS = Page(
    "versions",
    "/console/versions",
    "Prompts & policies",
    ("versions",),
    "/console/api/versions",
)
CHAT = Page("chat", "/console/chat", "Web chat", (), "")
NAVIGATION = (OVERVIEW, TICKETS, DEVICES, TRIGGERS, COSTS, VERSIONS, CHAT)

_SHELL = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>{title} · Super-agent</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="{static}/console.css">
<script src="{static}/console.js" defer></script>
</head>
<body data-page="{key}" data-topics="{topics}" data-api="{api}">
<header>
<a class="brand" href="/console">Super-agent</a>
<nav>{nav}</nav>
<span id="live" class="live" title="live updates">{live}</span>
<form method="post" action="/console/logout"><button type="submit" class="link">Sign out</button>
</form>
</header>
<main>
<h1>{heading}</h1>
<p id="error" class="error" role="alert" hidden></p>
{body}
</main>
<footer>Super-agent {version}</footer>
</body></html>
"""


def _nav(current: str) -> str:
    return "".join(
        f'<a href="{page.path}"{" aria-current=page" if page.path == current else ""}>'
        f"{escape(page.title)}</a>"
        for page in NAVIGATION
    )


def shell(page: Page, body: str, *, heading: str | None = None, api: str | None = None) -> str:
    return _SHELL.format(
        title=escape(heading or page.title),
        static=STATIC,
        key=page.key,
        topics=",".join(page.topics),
        api=escape(api if api is not None else page.api),
        nav=_nav(page.path),
        live="" if not page.topics else "connecting…",
        heading=escape(heading or page.title),
        body=body,
        version=escape(__version__),
    )


VIEW = '<div id="view" aria-live="polite"><p class="quiet">Loading…</p></div>'


def overview() -> str:
    return shell(OVERVIEW, VIEW)


def tickets(everything: bool) -> str:
    current = ' aria-current="true"'
    toggle = (
        '<p class="tabs">'
        f'<a href="/console/tickets"{"" if everything else current}>Open</a>'
        f'<a href="/console/tickets?all=1"{current if everything else ""}>All</a></p>'
    )
    api = TICKETS.api + ("?all=1" if everything else "")
    return shell(TICKETS, toggle + VIEW, api=api)


# Outside the view, so that a live update never wipes a note being typed; the script
# enables what the ticket's state allows and fills in the devices.
_TICKET_ACTIONS = """<section id="actions" class="card" hidden>
<h2>Actions</h2>
<form id="retry" class="action">
<label>Note for the worker <input name="note" maxlength="4000" size="40"
 placeholder="what changed (optional)" autocomplete="off"></label>
<button type="submit">Retry</button>
<span class="quiet" data-when="retry"></span>
</form>
<form id="reroute" class="action">
<label>Device <select name="device" required></select></label>
<button type="submit">Reroute</button>
<span class="quiet" data-when="reroute"></span>
</form>
<form id="stop" class="action">
<button type="submit" class="danger">Stop this ticket</button>
<span class="quiet" data-when="stop"></span>
</form>
<p id="action-result" role="status" hidden></p>
</section>"""


def ticket(ticket_id: str) -> str:
    api = f"{TICKETS.api}/{quote(ticket_id, safe='')}"
    return shell(
        TICKET,
        '<p><a href="/console/tickets">← all tickets</a></p>' + _TICKET_ACTIONS + VIEW,
        heading=f"Ticket {ticket_id}",
        api=api,
    )


def devices() -> str:
    pair = """<section class="card">
<h2>Pair a device</h2>
<form id="pair">
<label>Name <input name="name" required maxlength="100" placeholder="alice-laptop"
 autocomplete="off"></label>
<label>Owner <input name="owner" maxlength="200" placeholder="alice (default: you)"
 autocomplete="off"></label>
<label>Team device for <input name="shared" maxlength="200" placeholder="slack:S0123 (optional)"
 autocomplete="off"></label>
<button type="submit" class="primary">Create pairing code</button>
</form>
<div id="paired" hidden></div>
</section>"""
    return shell(DEVICES, pair + VIEW)


def _select(name: str, values: tuple[str, ...], chosen: str | None) -> str:
    options = ['<option value="">any</option>']
    for value in values:
        selected = " selected" if value == chosen else ""
        options.append(f'<option value="{escape(value)}"{selected}>{escape(value)}</option>')
    return f'<label>{name} <select name="{name}">{"".join(options)}</select></label>'


def triggers(verdict: str | None, route: str | None, source: str | None) -> str:
    filters = (
        '<form class="filters" method="get" action="/console/triggers">'
        + _select("verdict", VERDICTS, verdict)
        + _select("route", TRIGGER_ROUTES, route)
        + f'<label>source <input name="source" value="{escape(source or "")}" size="10"'
        ' placeholder="github, web…"></label>'
        '<button type="submit">Filter</button> <a href="/console/triggers">clear</a></form>'
    )
    chosen = {"verdict": verdict, "route": route, "source": source}
    query = urlencode({name: value for name, value in chosen.items() if value})
    api = TRIGGERS.api + (f"?{query}" if query else "")
    return shell(TRIGGERS, filters + VIEW, api=api)


def costs() -> str:
    return shell(COSTS, VIEW)


def versions() -> str:
    return shell(VERSIONS, VIEW)


def chat(enabled: bool) -> str:
    if not enabled:
        body = (
            '<p class="note">The web chat is off on this control plane '
            "(SUPERAGENT_WEBCHAT__ENABLED=false).</p>"
        )
    else:
        body = (
            '<p><a href="/chat" target="_blank" rel="noopener">Open the chat in its own tab</a>'
            "</p>"
            '<iframe id="chat" src="/chat" title="Web chat"></iframe>'
        )
    return shell(CHAT, body)


_LOGIN = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign in · Super-agent</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="{static}/console.css">
</head>
<body class="login"><main class="card">
<h1>Super-agent console</h1>
{body}
</main></body></html>
"""


def login(*, next_page: str, error: str | None) -> str:
    problem = f'<p class="error" role="alert">{escape(error)}</p>' if error else ""
    body = (
        "<p>Sign in with the admin token (<code>SUPERAGENT_ADMIN_TOKEN</code>; "
        "<code>superagent up</code> keeps a generated one in <code>admin-token</code> in its "
        "state directory and prints a one-time sign-in link).</p>"
        f"{problem}"
        '<form method="post" action="/console/login">'
        f'<input type="hidden" name="next" value="{escape(next_page)}">'
        '<label>Admin token <input type="password" name="token" required autofocus '
        'autocomplete="current-password"></label>'
        '<button type="submit" class="primary">Sign in</button></form>'
    )
    return _LOGIN.format(static=STATIC, body=body)
