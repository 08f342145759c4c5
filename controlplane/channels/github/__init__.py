"""The GitHub channel: webhooks or polling in, comments, 👀 and pull requests out.

* :mod:`.events`: a delivery (or a polled object) → Triggers; :mod:`.routes` serves
  ``POST /webhooks/github``.
* :mod:`.receiver`: the leader's poller, for deployments GitHub cannot reach.
* :mod:`.auth`, :mod:`.client`, :mod:`.errors`: credentials (token or App), the REST calls,
  and what each answer means.
* :mod:`.adapter`: replies and reactions; :mod:`.pull_requests`: the ``open_pull_request``
  effect.
"""

from __future__ import annotations

from controlplane.channels.base import ChannelAdapter
from controlplane.channels.context import ChannelContext
from controlplane.channels.github.adapter import build
from controlplane.channels.github.routes import router

__all__ = ["build_adapter", "router"]


def build_adapter(ctx: ChannelContext) -> ChannelAdapter | None:
    """The adapter for these settings, or None when the channel has no credentials."""
    return build(ctx)
