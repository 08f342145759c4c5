"""exec.env is an allow-list: the control plane cannot set a variable that loads code.

``MAKEFILES``, ``GOFLAGS=-toolexec=…``, ``RUSTC_WRAPPER``, ``CARGO_*``, ``npm_config_*``,
``DOTNET_STARTUP_HOOKS``, ``LUA_INIT``, ``PHPRC``, ``KUBECONFIG`` and ``AWS_CONFIG_FILE``
were accepted: each makes a tool the command runs load code (or a config naming a program)
from a path the caller chose. The class has no end (every tool reads its own variables), so
exec.env accepts only presentation and locale names and what the owner's ``[env] allow``
lists; a harness run's environment, built by the device itself, is not the control plane's
to set and is not judged by it.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from endpointd.guard.policy import Policy
from endpointd.rules import environment
from superagent_shared.messages import Command, Exec, HarnessExec

CODE_LOADING = {
    "MAKEFILES": "/x/evil.mk",
    "MAKEFLAGS": "--eval=$(shell id)",
    "GOFLAGS": "-toolexec=/x/evil",
    "RUSTC_WRAPPER": "/x/evil",
    "CARGO_BUILD_RUSTC_WRAPPER": "/x/evil",
    "CARGO_HOME": "/x/evil",
    "npm_config_node_options": "--require /x/evil.js",
    "NPM_CONFIG_USERCONFIG": "/x/evil.npmrc",
    "DOTNET_STARTUP_HOOKS": "/x/evil.dll",
    "LUA_INIT": "@/x/evil.lua",
    "LUA_INIT_5_4": "@/x/evil.lua",
    "PHPRC": "/x/evil.ini",
    "KUBECONFIG": "/x/evil-kubeconfig",
    "AWS_CONFIG_FILE": "/x/evil-aws-config",
    "PERL5OPT": "-Mevil",
    "RUBYOPT": "-revil",
    "NODE_OPTIONS": "--require /x/evil.js",
    "PYTHONSTARTUP": "/x/evil.py",
    "JAVA_TOOL_OPTIONS": "-javaagent:/x/evil.jar",
    "GIT_CONFIG_GLOBAL": "/x/evil.gitconfig",
    "GEM_HOME": "/x/evil",
    "BUNDLE_GEMFILE": "/x/Gemfile",
    "PIP_INDEX_URL": "https://evil.example/simple",
    "CC": "/x/evil",
    "OPENSSL_CONF": "/x/evil.cnf",
    "CMAKE_TOOLCHAIN_FILE": "/x/evil.cmake",
    "SOME_TOOL_PLUGIN": "/x/evil.so",  # a name no list knows: refused all the same
}


def _policy(tmp_path: Path, extra: str = "") -> Policy:
    root = tmp_path / "work"
    root.mkdir(exist_ok=True)
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "config").mkdir(exist_ok=True)
    path = tmp_path / "config" / "policy.toml"
    path.write_text(
        f"allowed_roots = [{json.dumps(str(root))}]\n"
        'default_action = "allow"\nsandbox = "off"\n' + textwrap.dedent(extra)
    )
    path.chmod(0o600)
    return Policy(path, state_dir=tmp_path / "state", home=tmp_path)


def _exec(tmp_path: Path, env: dict[str, str]) -> Command:
    return Command(command_id="c1", op=Exec(argv=("make",), cwd=str(tmp_path / "work"), env=env))


@pytest.mark.parametrize("name", sorted(CODE_LOADING))
def test_a_code_loading_name_in_exec_env_is_refused(tmp_path: Path, name: str) -> None:
    policy = _policy(tmp_path)
    decision = policy.check(_exec(tmp_path, {name: CODE_LOADING[name]}))
    assert decision.action == "deny", (name, decision)
    assert decision.rule == "env.allow"
    assert name in decision.message
    assert "[env] allow" in decision.message


def test_the_owner_may_allow_a_name_and_locale_names_need_no_allowing(tmp_path: Path) -> None:
    policy = _policy(tmp_path, '[env]\nallow = ["MAKEFILES", "BUILD_MODE"]\n')
    allowed = {"MAKEFILES": "/x/ok.mk", "BUILD_MODE": "fast", "LANG": "C.UTF-8", "TZ": "UTC"}
    assert policy.check(_exec(tmp_path, allowed)).action == "allow"
    # Allowed by its exact name only.
    refused = policy.check(_exec(tmp_path, {"makefiles": "/x/ok.mk"}))
    assert refused.action == "deny"
    assert refused.rule == "env.allow"


def test_a_harness_runs_own_environment_is_not_the_control_planes(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    built = HarnessExec(
        argv=("qwen",),
        cwd=str(tmp_path / "work"),
        env={"QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"},
    )
    assert policy.check(Command(command_id="c1", op=built)).action == "allow"


@pytest.mark.parametrize("name", ["MAKEFILES", "GOFLAGS", "RUSTC_WRAPPER", "npm_config_x"])
def test_a_credential_is_never_delivered_in_a_code_loading_variable(name: str) -> None:
    assert environment.reserved(name)
    assert not environment.reserved("NPM_TOKEN")
    assert not environment.reserved("NODE_AUTH_TOKEN")
