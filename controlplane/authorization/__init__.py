"""Per-device authorization: who may direct work to which device (docs/architecture.md,
*Ingest and routing*, whose device).

* :mod:`.devices`: who someone is (principals), the check, the grant a ticket records,
  shares; and the check the gateway repeats below every entry point.
* :mod:`.approvals`: a request to use someone else's device waits for its owner's answer
  in chat; the service that asks, reads the answers and expires what nobody answered.
"""
