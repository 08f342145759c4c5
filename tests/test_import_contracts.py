"""The import contracts (pyproject.toml, [tool.importlinter]) hold, and catch a wrong way.

`lint-imports` runs in .ci/run too; here it is also shown failing: on a copy of the source
with one import that runs the wrong way, it must name that import.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "controlplane": ROOT / "controlplane",
    "endpointd": ROOT / "endpointd" / "endpointd",
    "superagent_shared": ROOT / "shared" / "superagent_shared",
    "superagent_proto": ROOT / "proto" / "superagent_proto",
}
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _copy(tmp_path: Path) -> Path:
    """The four packages side by side, and the contracts: what lint-imports reads."""
    for name, source in PACKAGES.items():
        shutil.copytree(source, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _lint(where: Path) -> subprocess.CompletedProcess[str]:
    # Run from `where`: lint-imports puts the working directory first on sys.path, and from
    # the repository root `endpointd` would be the distribution folder, not the package.
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(where / "pyproject.toml")],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_contracts_hold(tmp_path: Path) -> None:
    done = _lint(_copy(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("module", "wrong_import", "named"),
    [
        ("endpointd/model.py", "import controlplane.settings", "endpointd.model -> controlplane"),
        (
            "endpointd/guard/policy.py",
            "from superagent_proto.v1 import endpoint_pb2",
            "endpointd.guard.policy -> superagent_proto",
        ),
    ],
)
def test_a_wrong_way_import_breaks_them(
    tmp_path: Path, module: str, wrong_import: str, named: str
) -> None:
    copy = _copy(tmp_path)
    target = copy / module
    target.write_text(target.read_text() + f"\n{wrong_import}  # noqa\n")
    done = _lint(copy)
    assert done.returncode != 0
    assert named in done.stdout, done.stdout
