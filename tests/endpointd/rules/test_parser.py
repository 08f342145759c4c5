"""The policy parser (endpointd.rules.parser): errors name the file, the line and the key;
the shipped example parses and documents every key."""

from __future__ import annotations

from pathlib import Path

import pytest

from endpointd.rules.errors import PolicyError
from endpointd.rules.parser import parse_policy
from endpointd.rules.terms import POLICY_FILE
from endpointd.rules.writer import example_text


@pytest.mark.parametrize(
    ("body", "line", "words"),
    [
        ('allowed_roots = ["/x"]\nalowed_root = 1\n', 2, ["unknown key 'alowed_root'"]),
        ('allowed_roots = ["/x"\n', 1, ["not valid TOML"]),
        ('default_action = "allow"\n\nlimits = = 1\n', 3, ["not valid TOML"]),
        (
            '\n[[commands]]\naction = "allow"\nmatch = "ls"\n\n[[commands]]\naction = "allow"\n'
            'match = "ls"\npattern = "x"\n',
            9,
            ["unknown key 'pattern' in [commands]"],
        ),
        ('[[commands]]\naction = "maybe"\nmatch = "ls"\n', 2, ["commands[1].action", "'maybe'"]),
        ('[[commands]]\naction = "deny"\n', 1, ["commands[1].match"]),
        ("[limits]\nmax_runtime = 5\n", 2, ["unknown key 'max_runtime' in [limits]"]),
        ("[limits]\nmax_output_bytes = -1\n", 2, ["limits.max_output_bytes", "positive"]),
        ('allowed_roots = ["src"]\n', 1, ["allowed_roots", "'src' is not an absolute path"]),
        ('default_action = "yes"\n', 1, ["default_action must be one of"]),
        ('[credentials.GitHub]\nallow = ["git *"]\n', 1, ["invalid credential name 'GitHub'"]),
        ('[credentials.gh]\nallow = "git *"\n', 2, ["credentials.gh.allow must be a list"]),
        ('[credentials.gh]\nallow = ["git *"]\nscope = 1\n', 3, ["unknown key 'scope'"]),
    ],
)
def test_parse_errors_name_the_file_the_line_and_the_key(
    tmp_path: Path, body: str, line: int, words: list[str]
) -> None:
    path = tmp_path / POLICY_FILE
    with pytest.raises(PolicyError) as caught:
        parse_policy(body, path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}: "), message
    for word in words:
        assert word in message
    assert "\n" not in message


def test_the_shipped_example_parses_and_documents_every_key() -> None:
    text = example_text()
    rules = parse_policy(text, Path("/x/policy.toml"))
    assert rules.allowed_roots == ()  # no default: pairing asks
    assert rules.default_action == "allow"
    assert [r.action for r in rules.commands] == ["deny", "deny", "ask"]
    assert rules.limits.max_runtime_seconds == 3600
    assert rules.limits.max_output_bytes == 64 * 1024 * 1024
    assert rules.limits.ask_timeout_seconds == 300
    for key in (
        "allowed_roots",
        "denied_paths",
        "default_action",
        "[[commands]]",
        "action",
        "match",
        "name",
        "[credentials.",
        "allow",
        "[limits]",
        "max_runtime_seconds",
        "max_output_bytes",
        "ask_timeout_seconds",
    ):
        assert key in text
    # Why one might choose "ask" is explained next to the choice.
    assert 'Choose "ask"' in text


def test_the_example_documents_files_rules_and_the_protected_paths() -> None:
    text = example_text()
    for words in ("[[files]]", "ops", ".git/hooks", "~/.bashrc", "~/Library/LaunchAgents", "0755"):
        assert words in text, words
    # The commented [[files]] examples are valid as soon as they are uncommented.
    examples = text[text.index("# [[files]]") :].split("\n\n")[0]
    block = "\n".join(line.removeprefix("#").strip() for line in examples.splitlines())
    rules = parse_policy(block, Path("/x/policy.toml"), home=Path("/home/u"))
    assert [(r.name, r.action, r.ops) for r in rules.files] == [
        ("my-hooks", "ask", ("write",)),
        ("no-dotenv", "deny", ("read",)),
    ]
