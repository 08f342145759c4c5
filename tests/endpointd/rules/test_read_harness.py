"""The policy's [harness] table (endpointd.rules.read_harness): every error names the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from endpointd.rules.errors import PolicyError
from endpointd.rules.parser import parse_policy


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[harness]\ndefault = 'gemini'\n", "harness.default must be one of"),
        ("[harness]\nallowed = 'qwen'\n", "harness.allowed must be a list"),
        ("[harness]\nallowed = ['qwen', 'aider']\n", "harness.allowed must be a list"),
        ("[harness]\nfoo = 1\n", "unknown key 'foo' in [harness]"),
        ("[harness.aider]\nprogram = '/bin/aider'\n", "unknown harness 'aider'"),
        ("[harness.qwen]\nprogram = 'qwen'\n", "is not an absolute path"),
        ("[harness.qwen]\nmodel = 5\n", "harness.qwen.model must be"),
        ("[harness.qwen]\nmodel = '--yolo'\n", "harness.qwen.model must be"),
        ("[harness.qwen]\nbase_url = 'ftp://x'\n", "must be an http(s) URL"),
        ("[harness.claude]\nbase_url = 'https://x'\n", "has no OpenAI-compatible endpoint"),
        ("[harness.qwen]\ncredential = 'a b'\n", "harness.qwen.credential must be"),
        ("[harness.qwen]\ncredential = 'k1'\ncredential_env = 'LD_PRELOAD'\n", "credential_env"),
        ("[harness.qwen]\ncredential_env = 'OPENAI_API_KEY'\n", "needs harness.qwen.credential"),
        ("[harness.qwen]\nmax_turns = 0\n", "max_turns must be a positive integer"),
        ("[harness.qwen]\nmax_turns = '5'\n", "max_turns must be a positive integer"),
        ("[harness.qwen]\nturns = 5\n", "unknown key 'turns' in [harness.qwen]"),
        ("[harness.qwen]\ncredential = 'k1'\ndelivery = 'file'\n", 'must be "env" or "http"'),
        ("[harness.qwen]\ndelivery = 'http'\n", "delivery needs harness.qwen.credential"),
        (
            "[harness.qwen]\ncredential = 'k1'\ndelivery = 'http'\n",
            "needs [credentials.k1] with hosts",
        ),
        ("harness = 1\n", "harness must be a [harness] table"),
    ],
)
def test_harness_policy_errors_name_the_key(text: str, words: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, Path("/etc/policy.toml"), Path("/home/owner"))
    assert words in str(caught.value)
    assert str(caught.value).startswith("/etc/policy.toml:")
