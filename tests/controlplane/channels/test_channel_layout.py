"""Every channel package has the same shape (controlplane/channels/__init__.py): the template's
files where the channel has them, a ``build_adapter`` factory, and no package attribute that
hides one of its modules (``from controlplane.channels.github import routes`` must give the
module, whatever the package imported first)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

import controlplane.channels

CHANNELS = Path(controlplane.channels.__file__).parent
PACKAGES = sorted(p.name for p in CHANNELS.iterdir() if (p / "__init__.py").exists())
TEMPLATE = {"adapter", "client", "events", "routes", "receiver"}


def test_every_channel_is_a_package() -> None:
    assert set(PACKAGES) >= {"github", "slack", "matrix", "lark", "webchat"}, PACKAGES


@pytest.mark.parametrize("channel", PACKAGES)
def test_a_channel_follows_the_template(channel: str) -> None:
    package = importlib.import_module(f"controlplane.channels.{channel}")
    modules = {p.stem for p in (CHANNELS / channel).glob("*.py")} - {"__init__"}
    assert {"adapter", "events"} <= modules, sorted(modules)
    assert callable(package.build_adapter)
    for name in sorted(modules):
        module = importlib.import_module(f"controlplane.channels.{channel}.{name}")
        assert getattr(package, name, module) is module, (
            f"controlplane.channels.{channel}.{name} is hidden by a package attribute"
        )
        assert sys.modules[module.__name__] is module
    # The template's names are the only ones for those roles.
    assert not modules & {"api", "web_api", "webhook", "webhooks", "endpoint", "callback_routes"}
    assert modules & TEMPLATE
