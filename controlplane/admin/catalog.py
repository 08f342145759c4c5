"""Every operation, registered by importing the modules that declare them."""

from __future__ import annotations

from controlplane.admin import devices, effects, ops, triggers, users, versioned  # noqa: F401 - each registers its own

__all__ = ["ops"]
