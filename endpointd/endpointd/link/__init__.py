"""The device's link to its control plane: pairing, trust, the device key, the connection."""
