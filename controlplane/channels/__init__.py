"""Channel adapters: each turns its inbound events into Triggers (and sends replies)."""
