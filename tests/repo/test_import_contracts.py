"""The import contracts (pyproject.toml, [tool.importlinter]) hold, and catch a wrong way.

`lint-imports` runs in .ci/run too; here it is also shown failing: on a copy of the source
with one import that runs the wrong way, it must name that import.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
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
        (
            "superagent_shared/messages.py",
            "import controlplane.settings",
            "superagent_shared.messages -> controlplane",
        ),
        (
            "endpointd/guard/policy.py",
            "from superagent_proto.v1 import endpoint_pb2",
            "endpointd.guard.policy -> superagent_proto",
        ),
        # Layers: a ticket operation reaching up into the router...
        (
            "controlplane/tickets/control.py",
            "import controlplane.router.tools",
            "controlplane.tickets.control -> controlplane.router.tools",
        ),
        # ...and the channels reaching back into the API.
        (
            "controlplane/channels/github/routes.py",
            "import controlplane.api.app",
            "controlplane.channels.github.routes -> controlplane.api.app",
        ),
        # The daemon's layers: the policy's words reaching up into the checks...
        (
            "endpointd/rules/parser.py",
            "import endpointd.guard.policy",
            "endpointd.rules.parser -> endpointd.guard.policy",
        ),
        # ...and a command reaching up into the link that delivers it.
        (
            "endpointd/commands/starter.py",
            "import endpointd.link.connection",
            "endpointd.commands.starter -> endpointd.link.connection",
        ),
        # The policy's words taking on a dependency.
        ("endpointd/rules/terms.py", "import click", "endpointd.rules.terms -> click"),
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


@pytest.mark.parametrize("program", ["controlplane", "endpointd"])
def test_a_package_left_out_of_the_layers_breaks_them(tmp_path: Path, program: str) -> None:
    """Every package of either program has a place in its layers: a new one must be given one."""
    copy = _copy(tmp_path)
    (copy / program / "newcomer.py").write_text('"""Not in any layer yet."""\n')
    done = _lint(copy)
    assert done.returncode != 0
    assert f"{program}.newcomer" in done.stdout, done.stdout


@pytest.mark.parametrize("program", ["controlplane", "endpointd"])
def test_the_packages_form_no_import_cycle(program: str) -> None:
    """Layers allow siblings to import each other; a cycle between packages is still not
    allowed, in or across layers, in either program. The graph is grimp's, which
    lint-imports builds on."""
    graph = grimp.build_graph(program)
    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        package = _package(program, module)
        for imported in graph.find_modules_directly_imported_by(module):
            other = _package(program, imported)
            if package and other and package != other:
                edges.setdefault(package, set()).add(other)
    cycles = [sorted(c) for c in _strongly_connected(edges) if len(c) > 1]
    assert not cycles, cycles


def _package(program: str, module: str) -> str | None:
    """The top-level package (or module) of ``program`` that ``module`` belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == program else None


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively: the strongly connected components of ``edges``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    nodes = set(edges) | {n for targets in edges.values() for n in targets}
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components
