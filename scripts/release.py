"""Build the sdist and wheel of both distributions, then check them before an upload.

Run it as `scripts/release` (the wrapper picks the development venv's Python); `--help`
says what it builds, where, and what it checks. This module is the only place that knows
what a releasable artifact looks like; tests/repo/test_distributions.py checks the same
properties independently, by installing the artifacts.

It never writes into the working tree except the output folder: it builds from a clean copy
of the files git tracks (or would track), so leftovers of an editable install or an old
`build/` folder can neither reach an artifact nor be mistaken for one.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from email.message import Message
from email.parser import Parser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]

DAEMON = "endpointd"
SERVER = "superagent-server"
# What each wheel may hold at its top level: namespaced import packages only, so that a user's
# site-packages never gets a generic `shared`, `proto` or `tests` from us.
TOP_LEVEL = {
    DAEMON: {"endpointd", "superagent_shared", "superagent_proto"},
    SERVER: {"controlplane"},
}
CONSOLE_SCRIPTS = {DAEMON: "endpointd", SERVER: "superagent"}
GENERIC = {"tests", "test", "shared", "proto", "bench", "scripts", "docs", "deploy"}
# The server's dependencies that the daemon may also have: the wire (the stubs need these
# runtimes) and the CLI library. Every other dependency of the server is the control
# plane's, and a laptop that installs the daemon must not get it.
SHARED_WITH_DAEMON = {"grpcio", "protobuf", "click", "cryptography"}
# What the two distributions are built from, relative to the repository root.
SOURCES = ("pyproject.toml", "README.md", "controlplane", "endpointd", "shared", "proto")
LEFTOVERS = shutil.ignore_patterns(
    "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache"
)

HELP = f"""\
Build the sdist and the wheel of both distributions, then check them before an upload.

  {DAEMON:<18} the device daemon, from endpointd/ (`pip install {DAEMON}`)
  {SERVER:<18} the control plane, from the repository root (the `superagent`
                     command); it requires {DAEMON}==its own version

Each sdist is built first, and each wheel from the unpacked sdist alone, as pip builds
one from PyPI. The sources are a clean copy of the files git tracks or would track. It
works offline once scripts/bootstrap has run (this venv's setuptools, --no-isolation).

Checks; each problem is one line on stderr, and any problem exits 1:
  twine check --strict   the metadata is valid and the README renders on PyPI
  metadata               the names above; one version for all four artifacts;
                         Requires-Python, a license and a Markdown README in each
  dependencies           {SERVER} pins {DAEMON}==VERSION; {DAEMON} requires
                         nothing of the control plane's (of the server's
                         dependencies, only {", ".join(sorted(SHARED_WITH_DAEMON))})
  file lists             top-level packages exactly {{endpointd, superagent_shared,
                         superagent_proto}} and {{controlplane}}: no generic tests, shared,
                         proto, bench or scripts; {DAEMON}'s sdist builds the same wheel as
                         its source folder; each wheel has its console script

examples:
  scripts/release            build into dist/ (its old artifacts replaced), then check
  scripts/release --check    build in a temporary folder, check, keep nothing (CI)
  twine upload dist/*        then publish what scripts/release built and checked
"""


class BuildFailed(Exception):
    """A build step failed; its output has been shown."""


@dataclass(frozen=True)
class Artifacts:
    sdist: Path
    wheel: Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/release",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--check",
        action="store_true",
        help="build in a temporary folder and only check (exit 1 on any problem)",
    )
    mode.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="build into DIR instead of dist/ (then check)",
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="superagent-release-") as tmp:
        work = Path(tmp)
        out = work / "dist" if args.check else (args.out or ROOT / "dist")
        _clear_old_artifacts(out)
        try:
            src = copy_sources(work / "src")
            built = {
                DAEMON: build(src / "endpointd", out),
                SERVER: build(src, out),
            }
            from_tree = build_wheel(src / "endpointd", work / "from-tree")
        except BuildFailed as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        problems = list(check(built, from_tree))
    for problem in problems:
        print(f"release: {problem}", file=sys.stderr)
    if problems:
        print(f"release: {len(problems)} problem(s); nothing is fit to upload", file=sys.stderr)
        return 1
    where = "checked" if args.check else f"built into {out}"
    names = ", ".join(p.name for a in built.values() for p in (a.sdist, a.wheel))
    print(f"release: {names}: {where}; all checks passed")
    return 0


def _clear_old_artifacts(out: Path) -> None:
    """Empty `out` of our earlier artifacts (another version's would be uploaded too)."""
    out.mkdir(parents=True, exist_ok=True)
    for stem in (DAEMON, SERVER):
        for old in out.glob(f"{stem.replace('-', '_')}-*"):
            old.unlink()


def copy_sources(dest: Path) -> Path:
    """The files the distributions are built from: what git tracks or would track."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *SOURCES],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    dest.mkdir(parents=True)
    if listed.returncode != 0:
        # Not a git checkout (an unpacked archive): everything but build leftovers.
        for name in SOURCES:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, dest / name, ignore=LEFTOVERS)
            elif source.exists():
                shutil.copy2(source, dest / name)
        return dest
    for name in filter(None, listed.stdout.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not released
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def _run_build(folder: Path, out: Path, *what: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", *what, "--outdir", str(out), str(folder)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise BuildFailed(f"building {folder.name} failed (python -m build; its output is above)")


def build(folder: Path, out: Path) -> Artifacts:
    """The sdist of the project in `folder`, and the wheel built from that sdist."""
    before = set(out.iterdir())
    _run_build(folder, out)  # python -m build: the sdist, then the wheel from it
    new = set(out.iterdir()) - before
    sdists = [p for p in new if p.name.endswith(".tar.gz")]
    wheels = [p for p in new if p.suffix == ".whl"]
    if len(sdists) != 1 or len(wheels) != 1:
        raise BuildFailed(f"building {folder.name} made {sorted(p.name for p in new)}")
    return Artifacts(sdist=sdists[0], wheel=wheels[0])


def build_wheel(folder: Path, out: Path) -> Path:
    """A wheel straight from the source folder, to compare with the one from the sdist."""
    _run_build(folder, out, "--wheel")
    (wheel,) = out.glob("*.whl")
    return wheel


# ---------------------------------------------------------------------------- checks


def check(built: dict[str, Artifacts], daemon_from_tree: Path) -> Iterable[str]:
    """Every problem with the artifacts, one line each."""
    yield from check_twine([p for a in built.values() for p in (a.sdist, a.wheel)])
    metadata = {
        name: {p.name: read_metadata(p) for p in (a.sdist, a.wheel)} for name, a in built.items()
    }
    yield from check_metadata(metadata)
    yield from check_dependencies(
        daemon=requirements(metadata[DAEMON][built[DAEMON].wheel.name]),
        server=requirements(metadata[SERVER][built[SERVER].wheel.name]),
        version=metadata[DAEMON][built[DAEMON].wheel.name]["Version"],
    )
    for name, artifacts in built.items():
        yield from check_wheel_files(name, artifacts.wheel)
    yield from check_same_wheel(built[DAEMON].wheel, daemon_from_tree)


def check_twine(paths: list[Path]) -> Iterable[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, paths)],
        capture_output=True,
        text=True,
    )
    if proc.returncode == 0:
        return
    lines = [line.strip() for line in (proc.stdout + proc.stderr).splitlines()]
    reported = [line for line in lines if line and not line.endswith("PASSED")]
    for line in reported or [f"exited {proc.returncode}"]:
        yield f"twine check --strict: {line}"


def read_metadata(path: Path) -> Message:
    """The core metadata of a wheel (METADATA) or an sdist (PKG-INFO)."""
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as zf:
            (name,) = (n for n in zf.namelist() if n.count("/") == 1 and n.endswith("/METADATA"))
            text = zf.read(name).decode("utf-8")
    else:
        with tarfile.open(path) as tf:
            (member,) = (
                m
                for m in tf.getmembers()
                if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")
            )
            extracted = tf.extractfile(member)
            assert extracted is not None
            text = extracted.read().decode("utf-8")
    return Parser().parsestr(text)


def check_metadata(metadata: dict[str, dict[str, Message]]) -> Iterable[str]:
    versions: dict[str, set[str]] = {}
    for expected, artifacts in metadata.items():
        for artifact, meta in artifacts.items():
            if canonicalize_name(meta["Name"] or "") != expected:
                yield f"{artifact}: named {meta['Name']!r}, expected {expected!r}"
            versions.setdefault(str(meta["Version"]), set()).add(artifact)
            if not meta["Requires-Python"]:
                yield f"{artifact}: no Requires-Python"
            if not (meta["License-Expression"] or meta["License"]):
                yield f"{artifact}: no license (License-Expression)"
            if not (meta["Description-Content-Type"] or "").startswith("text/markdown"):
                yield f"{artifact}: the README is not declared as Markdown"
            body = meta.get_payload()
            if not isinstance(body, str) or not body.strip():
                yield f"{artifact}: no README (empty long description)"
    if len(versions) > 1:
        found = "; ".join(f"{v} in {', '.join(sorted(a))}" for v, a in sorted(versions.items()))
        yield f"version: the artifacts disagree ({found}); both pyproject.toml files must match"


def requirements(meta: Message) -> list[Requirement]:
    parsed = []
    for line in meta.get_all("Requires-Dist") or []:
        try:
            parsed.append(Requirement(line))
        except InvalidRequirement:
            continue  # twine check has reported it
    return parsed


def check_dependencies(
    daemon: list[Requirement], server: list[Requirement], version: str
) -> Iterable[str]:
    pins = [r for r in server if canonicalize_name(r.name) == DAEMON]
    if [str(r.specifier) for r in pins] != [f"=={version}"]:
        found = ", ".join(str(r) for r in pins) or "nothing"
        yield f"{SERVER}: must require {DAEMON}=={version} (its own version), requires {found}"
    control_plane: set[str] = {canonicalize_name(r.name) for r in server}
    control_plane = control_plane - SHARED_WITH_DAEMON - {DAEMON} | {SERVER, "superagent"}
    for req in daemon:
        if canonicalize_name(req.name) in control_plane:
            yield (
                f"{DAEMON}: requires {req.name}, a control-plane dependency (the daemon a"
                " laptop installs must not pull in the control plane)"
            )


def check_wheel_files(name: str, wheel: Path) -> Iterable[str]:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")] or [""]
        scripts = zf.read(entry_points).decode("utf-8") if entry_points else ""
    tops = {n.split("/", 1)[0] for n in names}
    tops = {t for t in tops if not t.endswith((".dist-info", ".data"))}
    for top in sorted(tops & GENERIC):
        yield f"{wheel.name}: ships a generic top-level module {top!r}"
    if tops - GENERIC != TOP_LEVEL[name]:
        yield (
            f"{wheel.name}: top-level packages {sorted(tops)}, expected"
            f" exactly {sorted(TOP_LEVEL[name])}"
        )
    if f"\n{CONSOLE_SCRIPTS[name]} = " not in f"\n{scripts}":
        yield f"{wheel.name}: no `{CONSOLE_SCRIPTS[name]}` console script"


def check_same_wheel(from_sdist: Path, from_tree: Path) -> Iterable[str]:
    with zipfile.ZipFile(from_sdist) as a, zipfile.ZipFile(from_tree) as b:
        sdist_files, tree_files = set(a.namelist()), set(b.namelist())
    # A file the sdist lost (or gained) makes `pip install endpointd` from PyPI differ from
    # what was tested, wherever no wheel fits.
    for missing in sorted(tree_files - sdist_files)[:10]:
        yield f"{from_sdist.name}: built from the sdist, it lacks {missing}"
    for extra in sorted(sdist_files - tree_files)[:10]:
        yield f"{from_sdist.name}: built from the sdist, it has {extra}, unlike the source's"


if __name__ == "__main__":
    sys.exit(main())
