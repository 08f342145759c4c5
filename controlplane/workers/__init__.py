"""Workers: one session per ticket that executes on a device, steered by its events."""
