"""Super-agent control plane: stateless replicas over Postgres.

One package per part of the design (see docs/architecture.md): ``db`` owns the schema and
connections, ``effects`` the outbox, ``api`` the HTTP surface, ``gateway`` the device gRPC
port, ``cli`` the ``superagent`` command.
"""

import os

# gRPC's C core writes its own lines straight to stderr, bypassing logging: at its default
# verbosity, one per peer that fails the TLS handshake ("Handshake failed with error
# SSL_ERROR_SSL ..."), i.e. per port scanner, health check speaking plain TCP or HTTP,
# or daemon with the wrong CA. Only errors by default. It is read once, when grpc is first
# imported, so it is set here, before any module of this package can import grpc (the
# quiet-logs e2e test checks a real `superagent serve`). An operator's own setting wins,
# so `GRPC_VERBOSITY=debug GRPC_TRACE=handshaker` still shows the details.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

__version__ = "0.1.0"
