"""Tickets: where a ticket changes state, and everything done to one from outside.

``store`` is the only writer of the ``tickets`` table. Around it: ``opening`` (a request
becomes a ticket), ``mandates`` (on whose request it runs) and ``subscriptions`` (the
threads it handles), ``control`` (stop, retry, reroute), ``slots`` (which worker round
holds a ticket), ``reports`` (progress, results and notices back to people and the
router), ``retries``, ``approvals`` (a device owner's answer), ``authority`` (who may steer
a ticket) and ``events`` (what its worker sees next, and its jobs). Each is the one writer
of its own tables (``tests/repo/test_table_writers.py``).
Imported by the router, workers, watchdog, console and CLI; imports none of them.
"""
