"""Where the daemon's packages come from: the repository's sibling folders, or its own sdist.

The daemon ships three import packages: `endpointd` (beside this file) and the code it
shares with the control plane, `superagent_shared` and `superagent_proto`, which live in the
repository's top-level folders `shared/` and `proto/`, beside this one (the control plane
imports them from there too). Everything else about the distribution is declared in
pyproject.toml; only what depends on where the build runs is here:

* In a checkout, the sibling packages are read from the repository's `shared/` and `proto/`.
* `sdist` copies them into the release tree, beside `endpointd/`, so the sdist is
  self-contained: `pip install endpointd-X.tar.gz` has no repository around it.
* In an unpacked sdist, those in-tree copies exist and are used as they are.

Packages are discovered, never listed: a subpackage added to `endpointd/` ships without
anyone remembering to name it here (a hand-written list once left out
`endpointd.workspaces`, tests/repo/test_distributions.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent

# Import package -> the repository folder that holds it, beside endpointd/.
SIBLINGS = {"superagent_shared": "shared", "superagent_proto": "proto"}


def _source_root(package: str) -> str:
    """The folder, relative to this file, that holds `package` in this build."""
    if (HERE / package / "__init__.py").is_file():
        return "."  # an unpacked sdist: the copy the sdist command made
    return f"../{SIBLINGS[package]}"


def _packages() -> tuple[list[str], dict[str, str]]:
    packages = find_packages(where=str(HERE), include=["endpointd", "endpointd.*"])
    package_dir: dict[str, str] = {}
    for package in SIBLINGS:
        root = _source_root(package)
        found = find_packages(where=str(HERE / root), include=[package, f"{package}.*"])
        if package not in found:
            raise SystemExit(f"error: {package} not found in {HERE / root}")
        packages += found
        if root != ".":
            package_dir[package] = f"{root}/{package}"
    return packages, package_dir


class SelfContainedSdist(sdist):
    """An sdist that carries the sibling packages inside its own tree."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        # The file list names the sibling packages by their `../` paths, which would be
        # created outside the release tree (beside it, in this folder) and never archived.
        inside = [f for f in files if ".." not in Path(f).parts]
        super().make_release_tree(base_dir, inside)
        for package in SIBLINGS:
            root = _source_root(package)
            if root == ".":
                continue  # an sdist made from an unpacked sdist: the file list has them
            shutil.copytree(
                HERE / root / package,
                Path(base_dir) / package,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                dirs_exist_ok=True,
            )


packages, package_dir = _packages()
setup(packages=packages, package_dir=package_dir, cmdclass={"sdist": SelfContainedSdist})
