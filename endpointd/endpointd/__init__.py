"""endpointd: the super-agent device daemon.

It runs on a developer's machine, dials out to the control plane, and executes the agent's
commands and file operations locally under a policy the machine's owner controls.
"""

__version__ = "0.1.0"
