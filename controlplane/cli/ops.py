"""A command's work as an operation (:mod:`controlplane.admin`): run on the database, or by
the context's deployment over HTTP; either way the answer is the same JSON."""

from __future__ import annotations

from typing import Any

from controlplane.admin.ops import Caller, perform
from controlplane.cli.common import clear_errors, load_settings
from controlplane.cli.dbsession import run_with_pool
from controlplane.cli.remote import remote, segment

BY = "the CLI"  # who acts, on the database (over HTTP: the token's holder)


def call(name: str, /, **params: Any) -> Any:
    """Operation ``name``'s answer, wherever the command works (contexts: cli.contexts).
    (Positional only: an operation may take a parameter called ``name``.)"""
    with clear_errors():
        over = remote()
    if over is not None:
        with clear_errors():
            return over.post(f"/console/api/ops/{segment(name)}", params)["result"]
    settings = load_settings()
    return run_with_pool(
        settings, lambda pool: perform(name, params, Caller(pool, settings, BY, local=True))
    )
