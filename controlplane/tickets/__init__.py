"""Tickets: where a ticket changes state, and everything done to one from outside.

``store`` is the only writer of the ``tickets`` table. Around it: ``control`` (stop, retry,
reroute), ``slots`` (which worker round holds a ticket), ``reports`` (progress, results
and notices back to people and the router), ``retries``, ``approvals`` (a device owner's
answer), ``authority`` (who may steer a ticket) and ``events`` (what its worker sees next).
Imported by the router, workers, watchdog, console and CLI; imports none of them.
"""
