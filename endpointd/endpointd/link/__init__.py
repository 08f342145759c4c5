"""The device's link to its control plane: pairing, trust, the connection.

The device key it signs with is :mod:`endpointd.keys`, below this package: the secrets'
redactor and CA use it too.
"""
