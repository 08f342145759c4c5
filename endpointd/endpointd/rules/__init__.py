"""The policy's words, at the bottom of the daemon: what every other package may say.

Standard library only, and nothing here imports a package above it. What lives here:

* :mod:`~endpointd.rules.terms`: the actions, sandbox and network modes, file operations,
  the policy file's name;
* :mod:`~endpointd.rules.tables`: the rule dataclasses (:class:`~endpointd.rules.tables.Rules`
  and the table each key of ``policy.toml`` becomes), the limits, the built-in denied paths;
* :mod:`~endpointd.rules.decisions`: a decision and a refusal, as the checks return them;
* :mod:`~endpointd.rules.errors`: the policy error, naming the file, line and key;
* the parser (:mod:`~endpointd.rules.parser`, reading ``policy.toml`` section by section
  with :mod:`~endpointd.rules.reader`) and the writer (:mod:`~endpointd.rules.writer`,
  `endpointd policy init` and pairing's allowed roots);
* the harness table (:mod:`~endpointd.rules.harnesses`), the remote normalisation
  (:mod:`~endpointd.rules.remotes`), the environment rules
  (:mod:`~endpointd.rules.environment`) and the credential names
  (:mod:`~endpointd.rules.credentials`).

The checks that apply these rules to a command are :mod:`endpointd.guard`'s.
"""
