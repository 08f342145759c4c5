"""What keeps a command inside its owner's policy: the OS sandbox, first of all."""
