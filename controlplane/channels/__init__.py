"""Channel adapters: each turns its inbound events into Triggers (and sends replies).

Every channel is a package with the same files, where it has them:

* ``adapter.py``: the :class:`~controlplane.channels.base.ChannelAdapter` (replies, 👀,
  the background services it starts);
* ``client.py``: the channel's API, and the one place its answers become our errors;
* ``events.py``: what the channel sends, parsed into ``IncomingTrigger``\\s (pure code);
* ``routes.py``: its HTTP endpoints (webhooks, callbacks) on ``router``, mounted whether or
  not it is configured;
* ``receiver.py``: the loop that receives without a public endpoint (GitHub polling, Slack
  Socket Mode, Matrix sync, Lark's long connection);
* ``__init__.py``: ``build_adapter(ctx)`` (None when the channel is not configured) and
  ``router``, which ``registry.py`` collects. (Neither is named like a module of the
  package: a package attribute that shadows its submodule breaks ``from pkg import mod``.)

Channel-specific extras sit beside them (GitHub's ``auth.py`` and ``pull_requests.py``,
Slack's ``signing.py``, the web chat's ``hub.py`` and ``connection.py``).
"""
