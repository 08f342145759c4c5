"""The two distributions as a new user gets them: `pip install endpointd` on a laptop, and
`superagent-server` for the control plane.

The daemon's sdist must be self-contained (it is what pip builds from when no wheel fits),
installing it must not pull in the control plane, and a plain `pip install ./endpointd` from
a checkout must ship every subpackage. `scripts/release --check` checks the same artifacts
before an upload; it is run here too, on this tree and on a broken copy of it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.distributions import (
    DAEMON,
    REPO_ROOT,
    SERVER,
    Distributions,
    clean_environment,
    copy_sources,
    fresh_venv,
    run,
)

# What the daemon must never bring onto a laptop: the control plane and its libraries.
CONTROL_PLANE_MODULES = ("controlplane", "fastapi", "sqlalchemy", "asyncpg", "uvicorn", "openai")


def _metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = (n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(zf.read(name).decode("utf-8"))


def _top_level(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        tops = {n.split("/", 1)[0] for n in zf.namelist()}
    return {t for t in tops if not t.endswith((".dist-info", ".data"))}


def _source_packages() -> list[str]:
    """Every package of the daemon's three source trees, by import name."""
    roots = (REPO_ROOT / "endpointd", REPO_ROOT / "shared", REPO_ROOT / "proto")
    return sorted(
        ".".join(init.parent.relative_to(root).parts)
        for root in roots
        for init in root.glob("*/**/__init__.py")
        if "build" not in init.relative_to(root).parts
    )


def _in_empty_dir(tmp_path: Path, bin_dir: Path, *args: str) -> str:
    """Run a program of a fresh venv from an empty folder (no checkout on sys.path)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    return run(bin_dir / args[0], *args[1:], cwd=cwd)


def _absent(tmp_path: Path, bin_dir: Path, modules: tuple[str, ...]) -> list[str]:
    probe = (
        "import importlib.util, sys;"
        "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m)))"
    )
    found = _in_empty_dir(tmp_path, bin_dir, "python", "-P", "-c", probe, *modules)
    return found.split()


def test_names_and_versions(distributions: Distributions) -> None:
    daemon = _metadata(distributions.daemon.wheel)
    server = _metadata(distributions.server.wheel)
    assert daemon["Name"] == DAEMON
    assert server["Name"] == SERVER
    assert daemon["Version"] == server["Version"]
    pins = [Requirement(r) for r in server.get_all("Requires-Dist") or []]
    (pin,) = (r for r in pins if canonicalize_name(r.name) == DAEMON)
    assert str(pin.specifier) == f"=={daemon['Version']}"


def test_wheels_hold_only_namespaced_top_level_packages(distributions: Distributions) -> None:
    assert _top_level(distributions.daemon.wheel) == {
        "endpointd",
        "superagent_shared",
        "superagent_proto",
    }
    assert _top_level(distributions.server.wheel) == {"controlplane"}


def test_daemon_sdist_builds_the_same_wheel_as_the_tree(
    distributions: Distributions, tmp_path: Path
) -> None:
    src = copy_sources(tmp_path / "src")
    out = tmp_path / "out"
    run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", out, src / DAEMON)
    (from_tree,) = out.glob("endpointd-*.whl")
    with zipfile.ZipFile(from_tree) as a, zipfile.ZipFile(distributions.daemon.wheel) as b:
        assert sorted(a.namelist()) == sorted(b.namelist())
    with tarfile.open(distributions.daemon.sdist) as sdist:
        names = sdist.getnames()
    assert not [n for n in names if ".." in Path(n).parts], "paths outside the release tree"


def test_daemon_sdist_installs_alone_and_runs(distributions: Distributions, tmp_path: Path) -> None:
    bin_dir = fresh_venv(tmp_path / "venv", distributions.daemon.sdist)
    help_text = _in_empty_dir(tmp_path, bin_dir, "endpointd", "--help")
    assert "Commands:" in help_text
    assert "superagent.endpoint.v1" in _in_empty_dir(tmp_path, bin_dir, "endpointd", "version")
    assert _absent(tmp_path, bin_dir, CONTROL_PLANE_MODULES) == []
    installed = _in_empty_dir(tmp_path, bin_dir, "python", "-m", "pip", "list", "--format=freeze")
    names = {canonicalize_name(line.split("==")[0]) for line in installed.split()}
    assert DAEMON in names
    assert not names & {SERVER, "superagent", "fastapi", "sqlalchemy", "pgserver"}


def test_plain_install_of_the_endpointd_folder_ships_every_package(tmp_path: Path) -> None:
    """`pip install ./endpointd` (not editable) from a checkout: no subpackage forgotten."""
    src = copy_sources(tmp_path / "src")
    bin_dir = fresh_venv(tmp_path / "venv", src / DAEMON)
    assert "Commands:" in _in_empty_dir(tmp_path, bin_dir, "endpointd", "--help")
    assert "superagent.endpoint.v1" in _in_empty_dir(tmp_path, bin_dir, "endpointd", "version")
    packages = _source_packages()
    assert "endpointd.workspaces" in packages
    probe = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]"
    _in_empty_dir(tmp_path, bin_dir, "python", "-P", "-c", probe, *packages)


# ------------------------------------------------------------------ scripts/release


def _release(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_environment()
    env["PYTHON"] = sys.executable  # the copy below has no .venv of its own
    return subprocess.run(
        [str(root / "scripts" / "release"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_release_check_passes_on_this_tree() -> None:
    proc = _release(REPO_ROOT, "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_release_check_names_each_problem(tmp_path: Path) -> None:
    root = copy_sources(tmp_path / "repo")
    (root / "scripts").mkdir()
    for script in ("release", "release.py"):
        shutil.copy2(REPO_ROOT / "scripts" / script, root / "scripts" / script)
    daemon_toml = root / "endpointd" / "pyproject.toml"
    text = daemon_toml.read_text(encoding="utf-8")
    # The daemon grows a control-plane dependency, and the two versions drift apart.
    text = text.replace("dependencies = [\n", 'dependencies = [\n    "fastapi>=0.110",\n', 1)
    text = text.replace('version = "', 'version = "9', 1)
    daemon_toml.write_text(text, encoding="utf-8")

    proc = _release(root, "--check")
    assert proc.returncode != 0
    problems = proc.stderr.splitlines()
    assert any("fastapi" in line and "endpointd" in line for line in problems), proc.stderr
    assert any("version" in line for line in problems), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_release_help_teaches() -> None:
    proc = _release(REPO_ROOT, "--help")
    assert proc.returncode == 0
    for word in ("--check", "dist/", "twine", DAEMON, SERVER):
        assert word in proc.stdout, word


def test_built_artifacts_are_never_committed() -> None:
    for path in (".wheelhouse/x.whl", "dist/x.whl"):
        ignored = subprocess.run(
            ["git", "check-ignore", "-q", path], cwd=REPO_ROOT, capture_output=True
        )
        assert ignored.returncode == 0, f"{path} is not in .gitignore"


# The extras (pyproject.toml): what only some installs need, never in the core.
EXTRA_MODULES = ("pgserver", "nio", "lark_oapi")


def test_server_core_install_has_no_extras_and_up_names_the_one_it_needs(
    distributions: Distributions, tmp_path: Path
) -> None:
    """`pip install superagent-server`, as a `serve` image has it: no embedded Postgres, no
    Matrix or Lark SDK; every channel still imports, and `superagent up` (embedded
    defaults) says in one line which extra to install instead of a traceback."""
    bin_dir = fresh_venv(
        tmp_path / "venv", distributions.server.wheel, find_links=distributions.out
    )
    assert _absent(tmp_path, bin_dir, EXTRA_MODULES) == []
    _in_empty_dir(tmp_path, bin_dir, "python", "-P", "-c", "import controlplane.channels.registry")
    env = clean_environment()
    for name in list(env):
        if name.startswith(("SUPERAGENT_", "DATABASE_URL", "OPENAI_")):
            del env[name]
    env["SUPERAGENT_STATE_DIR"] = str(tmp_path / "state")
    proc = subprocess.run(
        [str(bin_dir / "superagent"), "up"],
        cwd=tmp_path / "cwd",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), proc.stderr
    assert "pip install 'superagent-server[embedded]'" in last, proc.stderr
