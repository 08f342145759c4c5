"""The replica's two listeners (HTTP, the device gateway): sockets bound here, so that a port
that cannot be had is a clear error naming the setting that moves it.

uvicorn binds its own socket and, when that fails, calls ``sys.exit`` from inside the event
loop; gRPC raises a ``RuntimeError`` that does not say why. Either way the replica died with a
stack trace (once, with the gateway's server still up at interpreter exit, of SIGSEGV).
"""

from __future__ import annotations

import errno
import socket

from controlplane.errors import ConfigError

# Hosts that listen on every address: a port on one of them clashes with that port anywhere.
_EVERYWHERE = frozenset({"", "0.0.0.0", "::"})  # noqa: S104


def bind(host: str, port: int, *, what: str, setting: str) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not yet listening); ``what`` and ``setting`` name
    the listener and the setting that moves it, for the error when the port cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # As every server does: a restart must not wait out the old sockets' TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise cannot_listen(host, port, what=what, setting=setting, cause=exc) from None
    return sock


def cannot_listen(
    host: str, port: int, *, what: str, setting: str, cause: OSError | None = None
) -> ConfigError:
    """Why ``what`` cannot listen on ``host:port``: ``cause``, or else found by trying."""
    if cause is None:
        try:
            bind(host, port, what=what, setting=setting).close()
        except ConfigError as exc:
            return exc
        return ConfigError(f"{what} cannot listen on {host}:{port}; check {setting}")
    if cause.errno == errno.EADDRINUSE:
        return ConfigError(
            f"{what}: port {port} is in use on {host}: stop the program that listens there, "
            f"or choose another port with {setting}"
        )
    reason = cause.strerror or str(cause)
    return ConfigError(f"{what} cannot listen on {host}:{port} ({reason}); check {setting}")


def clash(http: tuple[str, int], grpc: tuple[str, int]) -> str | None:
    """Why HTTP and the device gateway cannot both listen as configured, if they cannot."""
    (http_host, http_port), (grpc_host, grpc_port) = http, grpc
    if http_port == 0 or http_port != grpc_port:
        return None
    if http_host != grpc_host and not {http_host, grpc_host} & _EVERYWHERE:
        return None
    return (
        f"HTTP and the device gateway are both set to port {http_port}: give them different "
        "ports (SUPERAGENT_HTTP__PORT or --http-port, SUPERAGENT_GRPC__PORT or --grpc-port)"
    )
