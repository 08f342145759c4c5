"""Alerts to the admin channel (``watchdog.admin_thread``), sent through the outbox once each.

Whoever quarantines something (a trigger the router gave up on, a ticket whose rounds keep
failing) or finds something wrong (the watchdog) tells the admins here. Each alert has a
key: the same key is one message, however often it is raised, so a retried transaction or a
second replica never sends it twice. Without an admin channel the alert is only logged; the
quarantined item itself is the record (``superagent status`` lists it).
"""

from __future__ import annotations

import logging

from controlplane.db.pool import Conn
from controlplane.ingest.intake import open_thread
from controlplane.replies import enqueue_reply
from superagent_shared.ids import stable_id

log = logging.getLogger(__name__)

ADMIN_TITLE = "Super-agent admin"


async def alert_admin(conn: Conn, admin_thread: str | None, key: str, text: str) -> bool:
    """Queue ``text`` for the admin channel, once per ``key``; False: none is configured.

    Run it in the transaction that records what the alert is about.
    """
    log.warning("alert: %s", text)
    if not admin_thread or ":" not in admin_thread:
        return False
    source, external_id = admin_thread.split(":", 1)
    thread_id = await open_thread(conn, source, external_id, ADMIN_TITLE)
    # Its own namespace of message ids: an alert about a thread's message never replaces it.
    reply_id = stable_id("msg", f"admin-alert:{key}")
    await enqueue_reply(conn, str(thread_id), f"⚠ {text}", reply_id, clip=False)
    return True
