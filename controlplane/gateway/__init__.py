"""The device gateway: the gRPC port that endpointd daemons connect out to.

docs/architecture.md, *Device gateway and endpointd*, is its design; docs/gateway.md its detail.
"""
