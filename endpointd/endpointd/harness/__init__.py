"""Harnesses: coding-agent CLIs (Qwen Code, Codex CLI, Claude Code) the owner installed and
logged in to, which the control plane may ask this device to run non-interactively in a
ticket's workspace (``RunHarness``).

* :mod:`endpointd.harness.detect`: which are installed here, their versions, whether
  they are logged in (the RepositoryReport and `endpointd harness list`).
* :mod:`endpointd.harness.runs`: a RunHarness turned into the exec the daemon runs, from
  the table and the local policy's ``[harness]`` alone.

What endpointd knows of each harness (how to find it, its login, its session store, how to
build a run's argv) is the harness table, :mod:`endpointd.rules.harnesses`: pure data the
policy parser reads too, so it lives with the policy's words below this package.
"""
