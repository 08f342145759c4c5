"""The local policy on workspaces: the [workspaces] table, PrepareWorkspace judged like any
operation, the ticket workspaces as places commands and file operations may use, and the
structural checks before it all."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from endpointd.guard.policy import Policy
from endpointd.guard.validation import validate
from endpointd.rules.parser import parse_policy
from endpointd.rules.terms import POLICY_FILE
from endpointd.rules.writer import example_text
from superagent_shared.messages import (
    Command,
    CredentialRef,
    Delivery,
    Exec,
    PrepareWorkspace,
    ReadFile,
    Reason,
    ReleaseWorkspace,
    WorkspaceBase,
    WriteFile,
)

TICKET = "tkt_8f3k2q9m4xw7"


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "home"
        self.root = self.home / "src"
        self.config = tmp_path / "config"
        self.state = tmp_path / "state"
        self.data = tmp_path / "data"
        for d in (self.root, self.config, self.state, self.data / "workspaces" / TICKET):
            d.mkdir(parents=True, exist_ok=True)

    def write(self, body: str = "") -> Policy:
        path = self.config / POLICY_FILE
        path.write_text(f"allowed_roots = [{json.dumps(str(self.root))}]\n" + textwrap.dedent(body))
        path.chmod(0o600)
        return Policy(path, state_dir=self.state, home=self.home, data_dir=self.data)

    def clone(self, name: str, remote: str) -> Path:
        path = self.root / name
        subprocess.run(["git", "init", "-q", str(path)], check=True)
        subprocess.run(["git", "remote", "add", "origin", remote], cwd=path, check=True)
        return path


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def _prepare(repo: str = "", path: str = "", **extra: object) -> Command:
    return Command(
        command_id="cmd_1",
        op=PrepareWorkspace(ticket_id=TICKET, repo=repo, path=path, **extra),  # type: ignore[arg-type]
    )


def test_the_workspaces_table_is_read_with_its_defaults() -> None:
    path = Path("/x/policy.toml")
    rules = parse_policy("allowed_roots = []\n", path).workspaces
    assert (rules.retention_hours, rules.max_disk_mb, rules.deny, dict(rules.setup)) == (
        72,
        20480,
        (),
        {},
    )
    rules = parse_policy(
        textwrap.dedent(
            """
            [workspaces]
            deny = ["github.com/acme/secret*"]
            ask = ["GitHub.com/acme/*"]
            retention_hours = 0
            max_disk_mb = 512

            [workspaces.setup]
            "github.com/Acme/App" = ["make", "bootstrap"]
            "gitlab.com/g/sub/lib" = "npm ci && npm run build"
            """
        ),
        path,
    ).workspaces
    assert rules.ask == ("github.com/acme/*",)
    assert (rules.retention_hours, rules.max_disk_mb) == (0, 512)
    assert rules.setup_for("github.com/acme/app") == ("make", "bootstrap")
    assert rules.setup_for("gitlab.com/g/sub/lib") == ("sh", "-c", "npm ci && npm run build")
    assert rules.setup_for("github.com/acme/other") is None


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("[workspaces]\nretention_hours = -1\n", ("retention_hours", ":3")),
        ("[workspaces]\nretention_hours = 1.5\n", ("retention_hours",)),
        ("[workspaces]\nmax_disk_mb = 0\n", ("max_disk_mb", ":3")),
        ('[workspaces]\ndeny = "github.com/*"\n', ("workspaces.deny", "globs")),
        ("[workspaces]\nkeep = 3\n", ("unknown key 'keep'", "retention_hours")),
        ('[workspaces.setup]\n"app" = ["make"]\n', ("not a repository", "host/owner/name")),
        ('[workspaces.setup]\n"github.com/a/b" = []\n', ("command line", ":3")),
    ],
)
def test_a_bad_workspaces_table_is_one_line_naming_key_and_line(
    env: Env, body: str, words: tuple[str, ...]
) -> None:
    policy = env.write(body)
    assert policy.error is not None
    assert "\n" not in policy.error
    for word in words:
        assert word in policy.error, policy.error
    # And a broken policy refuses the prepare, as every other operation.
    assert policy.check(_prepare("github.com/acme/app")).action == "deny"


def test_a_prepare_is_judged_by_the_repository_rules_then_the_default(env: Env) -> None:
    policy = env.write(
        """
        default_action = "allow"
        [workspaces]
        deny = ["github.com/acme/secret*"]
        ask = ["github.com/acme/*"]
        allow = ["github.com/acme/open"]
        """
    )
    checks = {
        "github.com/acme/secret-sauce": ("deny", 'workspaces.deny "github.com/acme/secret*"'),
        "github.com/Acme/App": ("ask", 'workspaces.ask "github.com/acme/*"'),
        # deny beats ask beats allow, whatever the order of the keys.
        "github.com/acme/open": ("ask", 'workspaces.ask "github.com/acme/*"'),
        "gitlab.com/other/app": ("allow", "default_action"),
    }
    for repo, (action, rule) in checks.items():
        decision = policy.check(_prepare(repo))
        assert (decision.action, decision.rule) == (action, rule), repo
    strict = env.write('default_action = "deny"\n[workspaces]\nallow = ["gitlab.com/*"]\n')
    assert strict.check(_prepare("github.com/acme/app")).action == "deny"
    assert strict.check(_prepare("gitlab.com/a/b")).action == "allow"


def test_a_prepare_of_a_path_needs_an_allowed_root_and_reads_its_remote(
    env: Env, tmp_path: Path
) -> None:
    clone = env.clone("secret", "git@github.com:acme/secret.git")
    policy = env.write('[workspaces]\ndeny = ["github.com/acme/secret"]\n')
    # The path names the clone: the rules see its repository, read from the clone itself.
    decision = policy.check(_prepare(path=str(clone / "sub")))
    assert (decision.action, decision.rule) == ("deny", 'workspaces.deny "github.com/acme/secret"')
    outside = tmp_path / "outside"
    outside.mkdir()
    assert policy.check(_prepare(path=str(outside))).rule == "allowed_roots"
    (env.root / "ssh").symlink_to(env.home / ".ssh", target_is_directory=True)
    (env.home / ".ssh").mkdir()
    assert policy.check(_prepare(path=str(env.root / "ssh"))).rule.startswith("denied_paths")
    # A ticket's workspace is no clone to make a workspace of.
    ws = env.data / "workspaces" / TICKET
    assert policy.check(_prepare(path=str(ws))).rule == "workspaces"


def test_a_prepare_takes_no_credentials_and_a_release_is_always_allowed(env: Env) -> None:
    policy = env.write('default_action = "deny"\n')
    with_credential = Command(
        command_id="cmd_1",
        op=PrepareWorkspace(ticket_id=TICKET, repo="github.com/acme/app"),
        credentials=(CredentialRef("token", Delivery.GIT_HELPER),),
    )
    decision = policy.check(with_credential)
    assert (decision.action, decision.reason) == ("deny", Reason.CREDENTIAL_UNAVAILABLE)
    release = Command(command_id="cmd_2", op=ReleaseWorkspace(ticket_id=TICKET))
    assert policy.check(release).action == "allow"


def test_ticket_workspaces_are_places_to_work_each_on_its_own(env: Env) -> None:
    policy = env.write()
    ws = env.data / "workspaces" / TICKET
    other = env.data / "workspaces" / "tkt_other00000000"
    other.mkdir()
    # A command there works in the ticket's workspace, not a wider root.
    assert policy.workspace_for(str(ws / "src")) == ws
    assert policy.workspace_for(str(env.root / "x")) == env.root
    assert policy.workspace_for(str(env.data / "workspaces")) is None
    assert policy.workspace_for(str(env.data)) is None
    # File operations and working directories inside one are allowed...
    read = Command(command_id="c", op=ReadFile(path=str(ws / "README.md")))
    assert policy.check(read).action == "allow"
    run = Command(command_id="c", op=Exec(argv=("true",), cwd=str(ws)))
    assert policy.check(run).action == "allow"
    # ... confined to that workspace...
    assert policy.operation_roots(str(ws / "a/b")) == [str(ws), str(env.root)]
    assert policy.operation_roots(str(env.root / "a")) == [str(env.root)]
    # ... but not the workspaces' own directory, and never a workspace's .git file.
    listing = Command(command_id="c", op=ReadFile(path=str(env.data / "workspaces" / "x")))
    assert policy.check(listing).action == "allow"  # inside the workspace "x", if it existed
    assert policy.check_path(str(env.data / "workspaces"), "list").rule == "allowed_roots"
    dot_git = Command(command_id="c", op=WriteFile(path=str(ws / ".git"), content=b"gitdir: /"))
    assert policy.check(dot_git).rule == "protected: .git"


@pytest.mark.parametrize(
    ("op", "reason", "words"),
    [
        (PrepareWorkspace(ticket_id="../etc"), Reason.INVALID, "ticket_id"),
        (PrepareWorkspace(ticket_id="tkt_X"), Reason.INVALID, "ticket_id"),
        (ReleaseWorkspace(ticket_id="tkt_a/b"), Reason.INVALID, "ticket_id"),
        (PrepareWorkspace(ticket_id=TICKET), Reason.INVALID, "repo"),
        (PrepareWorkspace(ticket_id=TICKET, repo="github.com/a b/c"), Reason.INVALID, "repo"),
        (PrepareWorkspace(ticket_id=TICKET, repo="-uhttps://x/y/z"), Reason.INVALID, "repo"),
        (PrepareWorkspace(ticket_id=TICKET, path="rel/dir"), Reason.INVALID, "absolute"),
        (PrepareWorkspace(ticket_id=TICKET, repo="a/b", base=9), Reason.UNKNOWN_KIND, "base"),
        (
            PrepareWorkspace(ticket_id=TICKET, repo="a/b", base=WorkspaceBase.PULL_REQUEST),
            Reason.INVALID,
            "head branch",
        ),
        (
            PrepareWorkspace(
                ticket_id=TICKET, repo="a/b", base=WorkspaceBase.PULL_REQUEST, ref="--upload-pack=x"
            ),
            Reason.INVALID,
            "not a branch name",
        ),
        (
            PrepareWorkspace(
                ticket_id=TICKET, repo="a/b", base=WorkspaceBase.PULL_REQUEST, ref="a..b"
            ),
            Reason.INVALID,
            "not a branch name",
        ),
    ],
)
def test_malformed_workspace_operations_are_refused_before_anything(
    op: PrepareWorkspace | ReleaseWorkspace, reason: Reason, words: str
) -> None:
    refusal = validate(Command(command_id="cmd_1", op=op))
    assert refusal is not None
    assert refusal.reason == reason
    assert words in refusal.message


@pytest.mark.parametrize(
    "op",
    [
        PrepareWorkspace(ticket_id=TICKET, repo="github.com/acme/app"),
        PrepareWorkspace(ticket_id=TICKET, repo="acme/app", base=WorkspaceBase.LOCAL_CHANGES),
        PrepareWorkspace(ticket_id=TICKET, path="/home/me/src/app", base=WorkspaceBase.UNSPECIFIED),
        PrepareWorkspace(
            ticket_id=TICKET,
            repo="gitlab.com/g/s/app",
            base=WorkspaceBase.PULL_REQUEST,
            ref="feat/x-1",
        ),
        ReleaseWorkspace(ticket_id=TICKET),
    ],
)
def test_well_formed_workspace_operations_pass(op: PrepareWorkspace | ReleaseWorkspace) -> None:
    assert validate(Command(command_id="cmd_1", op=op)) is None


def test_the_shipped_example_documents_the_workspaces_table() -> None:
    text = example_text()
    rules = parse_policy(text, Path("/x/policy.toml")).workspaces
    assert (rules.retention_hours, rules.max_disk_mb) == (72, 20480)
    for key in ("[workspaces]", "deny", "ask", "allow", "retention_hours", "max_disk_mb"):
        assert key in text
    # Its commented examples are valid as soon as they are uncommented; left commented,
    # appending a [workspaces] table to a policy made from it is fine too.
    block = text[text.index("# [workspaces]\n") :].split("\n\n")[0]
    uncommented = "\n".join(line.removeprefix("#").strip() for line in block.splitlines())
    rules = parse_policy(uncommented, Path("/x/policy.toml")).workspaces
    assert rules.deny == ("github.com/acme/secrets*",)
    assert (rules.retention_hours, rules.max_disk_mb) == (72, 20480)
    assert rules.setup_for("github.com/acme/web") == ("sh", "-c", "npm ci")
