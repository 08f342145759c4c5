"""Who may reach the control plane over HTTP (docs/security.md).

* :mod:`~controlplane.access.admin_token`: the admin token, configured or generated;
* :mod:`~controlplane.access.guard`: the verified caller, the origin and host guards;
* :mod:`~controlplane.access.sessions`: browser sign-ins and one-time sign-in links;
* :mod:`~controlplane.access.throttle`: failed sign-ins counted per peer;
* :mod:`~controlplane.access.headers`: the security headers of every page.

The middleware that applies the rule to every route is :mod:`controlplane.api.access`.
Nothing here imports the API, channels or console packages.
"""
