"""The daemon's command lifecycle: receiving, starting, finishing and sending results."""
