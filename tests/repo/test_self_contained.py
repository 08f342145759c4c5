"""The repository carries its own design: no file points at notes that live outside it.

The code once cited a design file that was never part of the repository (by name, by
section number, and through a path that climbs out of the checkout); a reader of the
repository could follow none of those. The design is ``docs/architecture.md``, and code and
docs cite its sections by name (``docs/architecture.md``, *Rules everything relies on*).

Every file git tracks is read as text (binary files are skipped), this one included: the
patterns are assembled from pieces, so this file does not match itself.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_DESIGN = "DESIGN"
# Each pattern with why it points outside the repository.
OUTSIDE = (
    (re.compile(re.escape(_DESIGN + ".md")), "a design file that is not in the repository"),
    (re.compile(_DESIGN + r" §"), "a section of a design file that is not in the repository"),
    (
        re.compile(r"\.\./" + "shared" + r"\b"),
        "a path that climbs out of its folder to shared notes",
    ),
    (re.compile("/work/" + "shared"), "a machine's folder of shared notes"),
)


def tracked_files(root: Path) -> list[str]:
    """The files git tracks under ``root``, as paths relative to it."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True, text=True
    )
    return [name for name in listed.stdout.split("\0") if name]


def offences(root: Path, names: Iterable[str]) -> list[str]:
    """``path:line: what`` for every line of a text file under ``root`` that points outside."""
    found = []
    for name in names:
        path = root / name
        if not path.is_file() or path.is_symlink():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary: an image, a wheel in the test data
        for number, line in enumerate(text.splitlines(), start=1):
            for pattern, why in OUTSIDE:
                if pattern.search(line):
                    found.append(f"{name}:{number}: {why}: {line.strip()[:120]}")
    return found


def test_no_file_points_outside_the_repository() -> None:
    found = offences(ROOT, tracked_files(ROOT))
    assert not found, (
        "cite docs/architecture.md by section instead (it is the project's design):\n"
        + "\n".join(found)
    )


@pytest.mark.parametrize(
    "line",
    [
        f"rule 1 ({_DESIGN}.md §2)",
        f"replies have a style per channel ({_DESIGN} §3.5)",
        "read from the sibling folder `../" + "shared/`",
        "see /work/" + "shared/notes.md",
    ],
)
def test_a_pointer_outside_is_found(tmp_path: Path, line: str) -> None:
    (tmp_path / "module.py").write_text(f'"""A module.\n\n{line}\n"""\n')
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe" + line.encode())
    assert offences(tmp_path, ["module.py", "image.png"]) == [
        f"module.py:3: {why}: {line}" for pattern, why in OUTSIDE if pattern.search(line)
    ]


def test_the_design_has_the_sections_the_code_cites() -> None:
    design = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    headings = set(re.findall(r"^## (.+)$", design, re.MULTILINE))
    cited = set()
    for name in tracked_files(ROOT):
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".yaml", ".toml"} or not path.is_file():
            continue
        text = " ".join(path.read_text(encoding="utf-8").split())  # citations wrap lines
        cited |= set(re.findall(r"docs/architecture\.md`?, \*([^*]+)\*", text))
    assert cited, "nothing cites docs/architecture.md by section any more"
    assert sorted(cited - headings) == []
