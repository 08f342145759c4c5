"""The ``superagent`` command: one module per command group, human output by default."""
