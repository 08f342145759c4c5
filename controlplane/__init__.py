"""Super-agent control plane: stateless replicas over Postgres.

One package per part of the design (see docs/architecture.md): ``db`` owns the schema and
connections, ``effects`` the outbox, ``api`` the HTTP surface, ``gateway`` the device gRPC
port, ``cli`` the ``superagent`` command.
"""

__version__ = "0.1.0"
