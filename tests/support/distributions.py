"""The two distributions built as a release builds them, and fresh venvs to install them in.

``build_distributions`` builds each distribution's sdist and then its wheel *from that
sdist* (what ``python -m build`` does, and what pip does with an sdist from PyPI), from a
clean copy of the repository's source trees: stale ``build/`` or ``*.egg-info`` leftovers in
a working tree can neither leak into the artifacts nor be written by a test, and tests
running side by side never share a build directory.

``fresh_venv`` makes a virtualenv with nothing in it and installs into it offline, from the
wheelhouse ``scripts/bootstrap`` keeps (``.wheelhouse/``: a wheel of every dependency of
both distributions, and setuptools for building an sdist) plus whatever the caller built.
The machine's pip configuration is ignored, so a dependency missing from the wheelhouse
fails the install instead of being fetched from elsewhere.

These do not use ``scripts/release``: the artifacts it checks are built by it, and these
tests check the distributions independently of it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = REPO_ROOT / ".wheelhouse"

DAEMON = "endpointd"
SERVER = "superagent-server"

# What the two distributions are built from, relative to the repository root.
SOURCE_TREES = ("pyproject.toml", "README.md", "controlplane", "endpointd", "shared", "proto")
BUILD_LEFTOVERS = shutil.ignore_patterns(
    "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache"
)


@dataclass(frozen=True)
class Built:
    """One distribution's artifacts: the sdist, and the wheel built from that sdist."""

    sdist: Path
    wheel: Path


@dataclass(frozen=True)
class Distributions:
    daemon: Built
    server: Built
    out: Path
    """The folder holding all four artifacts (a find-links directory for pip)."""


def copy_sources(dest: Path) -> Path:
    """A copy of the trees the distributions build from, without build leftovers."""
    dest.mkdir(parents=True, exist_ok=True)
    for tree in SOURCE_TREES:
        source = REPO_ROOT / tree
        if source.is_dir():
            shutil.copytree(source, dest / tree, ignore=BUILD_LEFTOVERS)
        else:
            shutil.copy2(source, dest / tree)
    return dest


def run(*args: str | Path, cwd: Path | None = None, timeout: float = 600) -> str:
    """Run a command; on failure, raise with its whole output (what a test should show)."""
    proc = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, args))} exited {proc.returncode}\n{proc.stdout}{proc.stderr}"
        )
    return proc.stdout


def clean_environment() -> dict[str, str]:
    """This environment without Python or pip settings that would reach past a fresh venv."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV")) or k == "PYTHONHASHSEED"
    }
    # The machine's pip.conf may name other indexes or find-links: offline means offline.
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def build_distributions(out: Path, work: Path) -> Distributions:
    """Build both sdists, then each wheel from its unpacked sdist alone, into ``out``."""
    src = copy_sources(work / "src")
    built = {}
    for name, folder in ((DAEMON, src / "endpointd"), (SERVER, src)):
        # --no-isolation: this venv's setuptools, so that it works offline.
        run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, folder)
        stem = name.replace("-", "_")
        (sdist,) = out.glob(f"{stem}-*.tar.gz")
        (wheel,) = out.glob(f"{stem}-*.whl")
        built[name] = Built(sdist=sdist, wheel=wheel)
    return Distributions(daemon=built[DAEMON], server=built[SERVER], out=out)


def fresh_venv(path: Path, *requirements: str | Path, find_links: Path | None = None) -> Path:
    """A new venv at ``path`` with ``requirements`` installed offline; returns its bin dir.

    Requirements are anything pip takes: names (``endpointd``, found in ``find_links``, e.g.
    ``Distributions.out``), or paths of an sdist, a wheel or a source directory.
    """
    if not (WHEELHOUSE / ".stamp").is_file():
        raise AssertionError(f"no wheelhouse at {WHEELHOUSE}: run scripts/bootstrap")
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    bin_dir = path / "bin"
    links = ["--find-links", str(WHEELHOUSE)]
    if find_links is not None:
        links += ["--find-links", str(find_links)]
    if requirements:
        run(
            bin_dir / "python",
            "-m",
            "pip",
            "install",
            "--quiet",
            # Byte-compiling every module of every dependency is most of an install's time,
            # and Python compiles what a test imports anyway.
            "--no-compile",
            "--no-index",
            *links,
            *requirements,
        )
    return bin_dir
