"""The device gateway: the gRPC port that endpointd daemons connect out to (DESIGN.md §5)."""
