"""Who an account is, per channel: the immutable id every adapter gives its actors.

Authority (policy allowlists, bot blocklists, the agent's own ids, account links) matches
these ids only. Names and handles (a Slack handle, a GitHub login, a Lark display name, the
name typed in the web chat) can be chosen, renamed and registered again by someone else, so
they are for display only.

========  ===========================================  ================================
source    actor id                                     e.g.
========  ===========================================  ================================
github    the numeric user id (survives renames)       ``583231``
slack     team id / user id (a user id alone is        ``T0001/U024BE7LH``
          unique only within its own workspace;
          Slack Connect brings in other teams')
lark      the open_id (per app)                        ``ou_7d8a6e6df7621556ce0d2192``
matrix    the user id                                  ``@alice:example.org``
web       ``web:<principal>``; one principal today,    ``web:admin``
          ``web:admin``: every holder of the admin
          token is the same one
========  ===========================================  ================================

The shapes are disjoint (digits; ``T…/U…``; ``ou_…``; ``@…:…``; ``web:…``), so a list
covering several channels (``agent_ids``, the default source policy) cannot mistake one
channel's id for another's. This module is the bottom layer: pure, no I/O (resolving a
handle to its id is :mod:`controlplane.handles`).
"""

from __future__ import annotations

import re

__all__ = [
    "HOW_TO_GIVE",
    "SOURCES",
    "WEB_ADMIN",
    "account_text",
    "is_id",
    "slack_id",
    "source_of",
]

SOURCES = ("github", "slack", "matrix", "lark", "web")
WEB_ADMIN = "web:admin"  # the web chat's one principal: whoever holds the admin token

_FORMS = {
    "github": re.compile(r"^[1-9][0-9]{0,19}$"),
    # Teams are T… (E… for an Enterprise Grid org); users U…/W…, a bot-only message's B….
    "slack": re.compile(r"^[TE][A-Z0-9]{2,30}/[UWB][A-Z0-9]{2,30}$"),
    "lark": re.compile(r"^ou_[0-9a-z]{6,64}$"),
    "matrix": re.compile(r"^@[^\s:]{1,255}:[A-Za-z0-9.\-\[\]:]{1,255}$"),
    "web": re.compile(r"^web:[a-z0-9][a-z0-9._-]{0,63}$"),
}

# How to give each channel's id by hand, for errors that refuse something else.
HOW_TO_GIVE = {
    "github": "the numeric user id (the id field of https://api.github.com/users/LOGIN), "
    "e.g. github:583231",
    "slack": "TEAM/USER ids (e.g. slack:T0001/U024BE7LH: the member's profile, Copy member "
    "ID, and the workspace's team id), or slack:EMAIL",
    "lark": "the user's open_id (ou_…), or lark:EMAIL",
    "matrix": "the Matrix user id, @name:server",
    "web": f"{WEB_ADMIN} (every holder of the admin token is that one principal; names typed "
    "in the chat are labels)",
}


def is_id(source: str, text: str) -> bool:
    """Whether ``text`` has the shape of an actor id of ``source``."""
    form = _FORMS.get(source)
    return form is not None and form.match(text) is not None


def source_of(text: str) -> str | None:
    """The channel whose id shape ``text`` has, if any."""
    for source, form in _FORMS.items():
        if form.match(text):
            return source
    return None


def slack_id(team: str, user: str) -> str:
    return f"{team}/{user}"


def account_text(source: str, actor_id: str) -> str:
    """``source:id`` as people write an account (the web's ids carry their source already)."""
    return actor_id if actor_id.startswith(f"{source}:") else f"{source}:{actor_id}"
