"""What a credential may be called, and the stores its value may live in.

The policy names credentials (``[credentials.NAME]``, ``[harness.NAME] credential``) and
chooses a store (``credential_store``); the stores themselves are
:mod:`endpointd.secrets`'s.
"""

from __future__ import annotations

import re
from typing import Literal

NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
NAME_RULE = (
    "1-64 characters: lowercase letters, digits, '.', '_' or '-', starting with a letter or digit"
)

Store = Literal["keyring", "file"]
STORES: tuple[Store, ...] = ("keyring", "file")

# Where the file store keeps one file per credential, below the config dir.
FILES_DIRECTORY = "credentials"


def valid_name(name: str) -> bool:
    return NAME_RE.fullmatch(name) is not None
