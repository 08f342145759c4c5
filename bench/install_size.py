"""What an install weighs: the control plane, each of its extras and the daemon, each in a
fresh virtualenv, side by side.

Both distributions are built as wheels from the tree (or from a git ref, ``--ref``, taken
with ``git archive`` so no checkout is touched), then each configuration is installed into
a new venv the way a user installs it: ``pip install 'superagent-server[extra]'``, with
pip's defaults (byte-compiled, so the ``.pyc`` files count), the daemon from the built
wheel and everything else from the index (PyPI, or whatever pip is configured with; the
``--find-links .wheelhouse`` that ``scripts/bootstrap`` keeps is offered first, so most
of a run is offline). The size is the apparent size of every file the install added to
the venv (a fresh venv with only pip is the baseline), beside the space it takes on disk
(allocated blocks, what ``du`` shows: many small files cost more), and the heaviest distributions of
each configuration are listed from their ``RECORD`` files.

    .venv/bin/python -m bench.install_size                 # this tree
    .venv/bin/python -m bench.install_size --ref main      # another commit, for a before
    .venv/bin/python -m bench.install_size --extras lark,matrix --top 5 --json sizes.json

Extras measured: every optional-dependency group but the tooling ones (``dev``, ``bench``)
unless ``--extras`` names them; each alone on top of the core, then all of them together.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import venv
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
WHEELHOUSE = REPO_ROOT / ".wheelhouse"
SOURCE_TREES = ("pyproject.toml", "README.md", "controlplane", "endpointd", "shared", "proto")
TOOLING_EXTRAS = ("dev", "bench")
GOAL_CORE_MB = 150.0  # the control plane's core install (issue "a lean install")
MB = 1_000_000


@dataclass
class Measured:
    label: str
    requirement: str
    bytes: int
    disk: int
    files: int
    packages: int
    heaviest: list[tuple[str, int]] = field(default_factory=list)


def sources(ref: str | None, dest: Path) -> Path:
    """The trees the distributions build from: this checkout's, or those of ``ref``."""
    dest.mkdir(parents=True)
    if ref is None:
        ignore = shutil.ignore_patterns(
            "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".mypy_cache"
        )
        for tree in SOURCE_TREES:
            source = REPO_ROOT / tree
            if source.is_dir():
                shutil.copytree(source, dest / tree, ignore=ignore)
            else:
                shutil.copy2(source, dest / tree)
        return dest
    archive = dest.with_suffix(".tar")
    subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", "--output", str(archive), ref, *SOURCE_TREES],
        check=True,
    )
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest


def build_wheels(src: Path, out: Path) -> None:
    for folder in (src / "endpointd", src):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-deps",
                "--no-build-isolation",
                "--wheel-dir",
                str(out),
                str(folder),
            ],
            check=True,
            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        )


def tree_size(root: Path) -> tuple[int, int, int]:
    """Apparent bytes, bytes on disk (allocated blocks, what ``du`` shows) and files."""
    total = disk = files = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            stat = os.lstat(os.path.join(dirpath, name))
            disk += stat.st_blocks * 512
            if not os.path.islink(os.path.join(dirpath, name)):
                total += stat.st_size
                files += 1
    return total, disk, files


def site_packages(env: Path) -> Path:
    (found,) = (env / "lib").glob("python3*/site-packages")
    return found


def distributions(site: Path, skip: set[str]) -> list[tuple[str, int]]:
    """The distributions in ``site`` but ``skip``, with the bytes each RECORD lists, heaviest
    first."""
    sizes = []
    for info in site.glob("*.dist-info"):
        name = info.name.split("-")[0]
        if name in skip:
            continue
        total = 0
        for line in (info / "RECORD").read_text().splitlines():
            path = (site / line.split(",")[0]).resolve()
            if path.is_file():
                total += path.stat().st_size
        sizes.append((name, total))
    return sorted(sizes, key=lambda item: -item[1])


def measure(label: str, requirement: str, wheels: Path, work: Path, top: int) -> Measured:
    env = work / label.replace(" ", "_").replace("[", "-").replace("]", "")
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    baseline, baseline_disk, baseline_files = tree_size(env)
    # What a fresh venv already has (pip; setuptools too before Python 3.12).
    preinstalled = {name for name, _ in distributions(site_packages(env), set())}
    links = ["--find-links", str(wheels)]
    if (WHEELHOUSE / ".stamp").is_file():
        links += ["--find-links", str(WHEELHOUSE)]
    subprocess.run(
        [str(env / "bin" / "python"), "-m", "pip", "install", "--quiet", *links, requirement],
        check=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    size, disk, files = tree_size(env)
    heaviest = distributions(site_packages(env), preinstalled)
    shutil.rmtree(env)
    return Measured(
        label=label,
        requirement=requirement,
        bytes=size - baseline,
        disk=disk - baseline_disk,
        files=files - baseline_files,
        packages=len(heaviest),
        heaviest=heaviest[:top],
    )


def table(results: list[Measured]) -> str:
    by_label = {r.label: r for r in results}
    core = by_label["core"].bytes
    daemon = by_label["endpointd"].bytes
    rows = [
        "| install | MB | MB on disk | files | distributions | ÷ core | ÷ endpointd |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| `{r.requirement}` | {r.bytes / MB:.1f} | {r.disk / MB:.1f} | {r.files:,} "
            f"| {r.packages} "
            f"| {r.bytes / core:.2f}× | {r.bytes / daemon:.2f}× |"
        )
    rows += ["", "| install | heaviest distributions (MB) |", "|---|---|"]
    for r in results:
        heavy = ", ".join(f"{name} {size / MB:.1f}" for name, size in r.heaviest)
        rows.append(f"| `{r.requirement}` | {heavy} |")
    verdict = "met" if core / MB <= GOAL_CORE_MB else "NOT met"
    rows += ["", f"Core install {core / MB:.1f} MB; goal ≤ {GOAL_CORE_MB:.0f} MB: {verdict}."]
    rows += ["(MB: apparent size, 10^6 bytes; ratios of MB.)"]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", help="measure this git ref instead of the working tree")
    parser.add_argument("--extras", help="comma-separated extras (default: all but tooling)")
    parser.add_argument("--top", type=int, default=6, help="heaviest distributions listed")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="install-size-") as tmp:
        work = Path(tmp)
        src = sources(args.ref, work / "src")
        wheels = work / "wheels"
        build_wheels(src, wheels)
        with open(src / "pyproject.toml", "rb") as f:
            declared = tomllib.load(f)["project"].get("optional-dependencies", {})
        if args.extras:
            extras = [e for e in args.extras.split(",") if e]
        else:
            extras = [e for e in declared if e not in TOOLING_EXTRAS]
        plan = [("endpointd", "endpointd"), ("core", "superagent-server")]
        plan += [(f"[{e}]", f"superagent-server[{e}]") for e in extras]
        if len(extras) > 1:
            plan.append(("all extras", f"superagent-server[{','.join(extras)}]"))
        results = []
        for label, requirement in plan:
            print(f"installing {requirement} ...", file=sys.stderr, flush=True)
            results.append(measure(label, requirement, wheels, work, args.top))

    print(f"# Install sizes ({args.ref or 'working tree'}), Python {sys.version.split()[0]}\n")
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
