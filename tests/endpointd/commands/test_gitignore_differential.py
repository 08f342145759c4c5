"""The daemon's ``.gitignore`` matching (endpointd/commands/globs.py, on pathspec) against
git itself: a repository with tricky ignore files (negations, directory-only patterns,
anchored patterns, ``**``, nested files, escaped characters, character classes), and for
every file and directory in it, our verdict beside ``git check-ignore``'s.

Our verdict is the walk's (commands/tree.py): a path is ignored when it, or a directory
above it, is ignored by the ``.gitignore`` files in force where it lies (the walk never
enters an ignored directory, as git never re-includes a file below one).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from endpointd.commands.globs import IgnoreFile, Ignores

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

IGNORES = {
    "": "\n".join(
        [
            "# a comment, and a blank line below",
            "",
            "*.log",
            "!important.log",
            "build/",  # directories only
            "/root-only.txt",  # anchored at the top
            "docs/*.html",  # has a slash: anchored too
            "**/cache",  # any depth
            "logs/**",  # everything beneath, not logs itself
            "!logs/keep/",
            "a/**/z.txt",  # zero or more directories between
            r"\#hash.txt",  # an escaped leading #
            r"\!bang.txt",  # an escaped leading !
            "trailing\\ ",  # an escaped trailing space
            "spaces.txt   ",  # unescaped trailing spaces are dropped
            "file[0-9].tmp",
            "[!a]x.dat",
            "*.o",
            "!/keep.o",
            "dironly/",
            "tmp*/",
            "*.swp",
            "nested/**/deep/*.bin",
        ]
    ),
    "src": "\n".join(["*.gen", "!keep.gen", "/local.txt", "generated/", "!*.log"]),
    "src/pkg": "\n".join(["!*.gen", "secret*", "!secret-ok", "sub/*.py", "/build/"]),
    "logs": "!keep/kept.txt\n",
}

FILES = [
    "a.log", "important.log", "x/important.log", "x/y/a.log",
    "build/out.txt", "x/build/out.txt", "build.txt", "y/build",  # a file named build
    "root-only.txt", "x/root-only.txt",
    "docs/index.html", "x/docs/index.html", "docs/sub/page.html",
    "cache/blob", "x/y/cache/blob", "x/cache",  # a file named cache
    "logs/a.txt", "logs/keep/kept.txt", "logs/deep/more.txt",
    "a/z.txt", "a/b/z.txt", "a/b/c/z.txt", "b/a/z.txt",
    "#hash.txt", "x/#hash.txt", "!bang.txt", "trailing ", "trailing", "spaces.txt",
    "file1.tmp", "filex.tmp", "bx.dat", "ax.dat", "x/cx.dat",
    "main.o", "keep.o", "x/keep.o",
    "dironly/f", "x/dironly/f", "tmp1/f", "tmpdir/g", "tmpfile",
    "note.swp", ".hidden.swp",
    "nested/deep/a.bin", "nested/x/y/deep/b.bin", "nested/deep/c.txt",
    "src/a.gen", "src/keep.gen", "src/local.txt", "src/x/local.txt",
    "src/generated/g.py", "src/x/generated/g.py", "src/debug.log",
    "src/pkg/a.gen", "src/pkg/secret.key", "src/pkg/secret-ok", "src/pkg/x/secret2",
    "src/pkg/sub/m.py", "src/pkg/sub/deeper/m.py", "src/pkg/build/o", "src/pkg/x/build/o",
    "plain.txt", "x/plain.txt",
]  # fmt: skip


def _make_repo(root: Path) -> None:
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for rel in FILES:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    for folder, text in IGNORES.items():
        (root / folder / ".gitignore").write_text(text + "\n")


def _all_paths(root: Path) -> list[tuple[str, bool]]:
    found = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel == ".git" or rel.startswith(".git/") or path.name == ".gitignore":
            continue
        found.append((rel, path.is_dir()))
    return found


def _ours(root: Path, rel: str, is_dir: bool) -> bool:
    parts = rel.split("/")
    files: list[IgnoreFile] = []
    for depth in range(len(parts)):
        folder = root.joinpath(*parts[:depth])
        ignore = folder / ".gitignore"
        if ignore.is_file():
            files.append(IgnoreFile.parse(str(folder), ignore.read_text()))
        here = Ignores(tuple(files))
        path_is_dir = is_dir if depth == len(parts) - 1 else True
        if here.ignored(str(root.joinpath(*parts[: depth + 1])), path_is_dir):
            return True
    return False


def _git(root: Path, paths: list[str]) -> set[str]:
    proc = subprocess.run(
        ["git", "-C", str(root), "check-ignore", "--stdin", "-z"],
        input="\0".join(paths) + "\0",
        capture_output=True,
        text=True,
    )
    assert proc.returncode in (0, 1), proc.stderr  # 1: nothing ignored
    return {p for p in proc.stdout.split("\0") if p}


def test_our_verdicts_are_gits(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    _make_repo(root)
    paths = _all_paths(root)
    assert len(paths) > 80
    ignored_by_git = _git(root, [rel for rel, _ in paths])
    differ = [
        (rel, "dir" if is_dir else "file", "git ignores" if rel in ignored_by_git else "git keeps")
        for rel, is_dir in paths
        if _ours(root, rel, is_dir) != (rel in ignored_by_git)
    ]
    assert differ == [], "\n".join(map(str, differ))
    # The set exercises both verdicts, re-inclusions among them.
    assert 20 < len(ignored_by_git) < len(paths) - 20
    for kept in ("important.log", "src/keep.gen", "src/pkg/a.gen", "keep.o", "logs"):
        assert kept not in ignored_by_git
