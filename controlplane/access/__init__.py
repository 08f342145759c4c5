"""Who may reach the control plane over HTTP: the one place for it (docs/security.md).

Two words, each with one meaning:

* **authentication** is who the caller is. Every holder of the admin token is one
  principal, the admin, proven by the token itself or by a sign-in session made from it:
  :mod:`.authentication` (the verified caller), :mod:`.admin_token` (the token, configured
  or generated), :mod:`.sessions` (browser sign-ins and one-time sign-in links),
  :mod:`.signin` (signing a browser in with the token), :mod:`.throttle` (failed sign-ins
  counted per peer).
* **access** is what a caller may reach. :mod:`.middleware` is the rule in front of every
  route (default-deny: public paths are listed with their reasons); :mod:`.browsers` keeps
  a browser from being made to reach it from another site's page or a rebinding name;
  :mod:`.console` and :mod:`.chat` are each surface's own rule, worded for it.

Who may direct work to which device is a different question, asked of a ticket's requester
rather than of an HTTP caller, and answered with the devices (docs/security.md). Nothing
here imports the API, channels or console packages: the console's sign-in page reaches the
middleware as a function the application hands in.
"""
