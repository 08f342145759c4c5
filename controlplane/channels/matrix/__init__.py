"""The Matrix channel: a bot account (matrix-nio) in rooms, replying in ``m.thread`` threads.

* :mod:`.events`: room events to Triggers (threads, mentions, direct chats), pure.
* :mod:`.receiver`: the sync loop (a leader service): invitations joined, messages ingested.
* :mod:`.adapter`: replies and 👀 reactions.
* :mod:`.client`: login and the one place nio's results become this project's errors.

matrix-nio is the ``matrix`` extra (``pip install 'superagent-server[matrix]'``): the
package's modules are imported only when Matrix is configured, and without it a configured
Matrix stops the start with that line.

Setup for users: docs/channels/matrix.md.
"""

from __future__ import annotations

from controlplane.channels.base import ChannelAdapter
from controlplane.channels.context import ChannelContext
from controlplane.errors import require_extra

# No routes: Matrix needs no inbound HTTP endpoint, the bot syncs from its homeserver.


def build_adapter(ctx: ChannelContext) -> ChannelAdapter | None:
    """The adapter for these settings, or None when the channel is not configured."""
    settings = ctx.settings.matrix
    if settings.homeserver is None:
        return None
    require_extra("nio", "matrix", "Matrix (SUPERAGENT_MATRIX__HOMESERVER)")
    from controlplane.channels.matrix.adapter import MatrixAdapter

    return MatrixAdapter(settings, ctx.intake, ctx.pool)
