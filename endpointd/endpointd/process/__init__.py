"""How a command runs: the daemon's executor, the pre-forked zygote, the per-command supervisor."""
