"""Channels whose SDK is an extra (pyproject.toml): configured without it, the start stops
with one line naming the extra; not configured, nothing asks for it.

A module set to None in ``sys.modules`` is one Python cannot import (the import system's
own convention), which is what an install without the extra has.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from controlplane.channels import lark, matrix
from controlplane.channels.context import ChannelContext
from controlplane.errors import MissingExtra
from controlplane.settings import Settings


def _context(**settings: Any) -> ChannelContext:
    return ChannelContext(Settings(**settings), None, None, "", "replica")  # type: ignore[arg-type]


def test_matrix_without_nio_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nio", None)
    ctx = _context(
        matrix={"homeserver": "https://matrix.example.org", "user_id": "@a:b", "access_token": "t"}
    )
    with pytest.raises(MissingExtra) as raised:
        matrix.build_adapter(ctx)
    assert raised.value.extra == "matrix"
    assert "pip install 'superagent-server[matrix]'" in raised.value.message
    assert "\n" not in raised.value.message


def test_lark_long_connection_without_the_sdk_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "lark_oapi", None)
    lark_settings = {"app_id": "cli_x", "app_secret": "s", "long_connection": True}
    with pytest.raises(MissingExtra) as raised:
        lark.build_adapter(_context(lark=lark_settings))
    assert "pip install 'superagent-server[lark]'" in raised.value.message


def test_unconfigured_channels_ask_for_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("nio", "lark_oapi"):
        monkeypatch.setitem(sys.modules, module, None)
    assert matrix.build_adapter(_context()) is None
    assert lark.build_adapter(_context()) is None
