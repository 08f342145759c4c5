"""endpointd's one error tree.

Every failure a user can cause or fix (bad URL, no keyring, certificate mismatch, server
refused the pairing code) is an :class:`EndpointdError` whose message is one complete line
saying what happened and what to do. The CLI prints that line and exits non-zero; anything
else reaching the top is a bug and keeps its traceback.
"""

from __future__ import annotations


class EndpointdError(Exception):
    """Base of all expected, user-facing failures."""


class ConfigError(EndpointdError):
    """Missing, unreadable or inconsistent local configuration (e.g. not paired)."""


class KeyStorageError(EndpointdError):
    """The device key cannot be created, stored, loaded or deleted."""


class TrustError(EndpointdError):
    """The server's certificate or address cannot be trusted."""


class PairingError(EndpointdError):
    """The server refused or failed the pairing request."""


class ServiceError(EndpointdError):
    """Installing or removing the OS service (systemd user unit, launchd agent) failed."""
