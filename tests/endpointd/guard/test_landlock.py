"""Landlock for real: a confined process writes only where it may, and reaches no one.

Each case runs a fresh Python process that confines itself (``restrict_self``) and then
tries what a hostile command would; the kernel answers, not our code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from endpointd.guard import landlock

ABI = landlock.abi_version()
needs_landlock = pytest.mark.skipif(ABI < 1, reason="this kernel has no Landlock")


def _confined(rules: str, attempt: str) -> dict[str, Any]:
    """Run ``attempt`` (Python; sets ``result``) in a process confined by ``rules``."""
    code = (
        textwrap.dedent(
            f"""
        import json, os, signal, socket
        from endpointd.guard import landlock
        landlock.restrict_self(landlock.Ruleset({rules}))
        result = {{}}
        def trying(name, action):
            try:
                action()
                result[name] = "ok"
            except OSError as exc:
                result[name] = type(exc).__name__
        """
        )
        + textwrap.dedent(attempt)
        + "\nprint(json.dumps(result))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


@needs_landlock
def test_writes_go_only_to_the_workspace_and_symlinks_do_not_leave_it(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("canary")
    os.symlink(outside, workspace / "escape")  # `ln -s / x` inside an allowed root
    through = workspace / "escape" / "new"
    result = _confined(
        f"read=['/'], write=[{str(workspace)!r}]",
        f"""
        trying("write inside", lambda: open({str(workspace / "ok")!r}, "w").write("x"))
        trying("write outside", lambda: open({str(outside / "new")!r}, "w").write("x"))
        trying("write through a symlink", lambda: open({str(through)!r}, "w").write("x"))
        trying("overwrite outside", lambda: open({str(outside / "secret")!r}, "w").write("x"))
        trying("remove outside", lambda: os.unlink({str(outside / "secret")!r}))
        trying("read outside", lambda: open({str(outside / "secret")!r}).read())
        """,
    )
    assert result == {
        "write inside": "ok",
        "write outside": "PermissionError",
        "write through a symlink": "PermissionError",
        "overwrite outside": "PermissionError",
        "remove outside": "PermissionError",
        "read outside": "ok",  # reads are the policy's denied paths' business
    }
    assert (outside / "secret").read_text() == "canary"
    assert not (outside / "new").exists()


@needs_landlock
def test_nothing_outside_the_read_rules_can_be_read(tmp_path: Path) -> None:
    readable = tmp_path / "readable"
    readable.mkdir()
    (readable / "a").write_text("a")
    hidden = tmp_path / "ssh"
    hidden.mkdir()
    (hidden / "id_rsa").write_text("canary-key")
    python = os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))
    roots = [str(readable), "/usr", "/lib", "/lib64", "/etc", python, *sys.path[1:]]
    result = _confined(
        f"read={roots!r}",
        f"""
        trying("read allowed", lambda: open({str(readable / "a")!r}).read())
        trying("read hidden", lambda: open({str(hidden / "id_rsa")!r}).read())
        trying("list hidden", lambda: os.listdir({str(hidden)!r}))
        """,
    )
    assert result == {
        "read allowed": "ok",
        "read hidden": "PermissionError",
        "list hidden": "PermissionError",
    }


@pytest.mark.skipif(ABI < 6, reason="signal scoping needs Landlock ABI 6")
def test_a_confined_process_cannot_signal_outside_its_domain() -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        result = _confined(
            "read=['/']",
            f"""
            trying("signal a bystander", lambda: os.kill({bystander.pid}, signal.SIGTERM))
            trying("signal itself", lambda: os.kill(os.getpid(), 0))
            """,
        )
        assert result == {"signal a bystander": "PermissionError", "signal itself": "ok"}
        assert bystander.poll() is None  # still alive
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait(5)


def test_what_an_old_kernel_cannot_enforce_is_named() -> None:
    rules = landlock.Ruleset(read=["/"], connect_ports=[443])
    assert rules.unenforced(0) == ["Landlock (this kernel has none)"]
    assert rules.unenforced(3) == [
        "TCP port rules (Landlock ABI 4)",
        "signal and abstract-socket scoping (Landlock ABI 6)",
    ]
    assert rules.unenforced(6) == []
