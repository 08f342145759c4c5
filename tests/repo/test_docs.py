"""The documentation holds together: README.md stays a landing page, every link and every
`docs/…` path leads somewhere real, every section a file cites by name is there, and the
generated pages (docs/commands.md; docs/configuration.md's settings table, tested with the
settings) match the code that makes them.

A reader who follows a link and lands nowhere stops trusting the docs; a page moved or a
heading renamed breaks links silently, so they are checked here instead.
"""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_LIMIT = 10 * 1024  # bytes: a landing page, not the manual
DOCS = ROOT / "docs"

# `docs/…` paths that name another project's files, not this repository's: a coding agent's
# repository conventions in a test's fixture, and Codex's own exec reference.
NOT_OURS = {"docs/AGENTS.md", "docs/exec.md"}

FENCE = re.compile(r"^ {0,3}(```|~~~)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
DOC_PATH = re.compile(r"(?<![\w/.-])docs/[\w./-]*\.md")
# `docs/<page>.md, *Heading*` or `docs/<page>.md, "Heading"`: a section cited by its name.
CITATION = re.compile(r"(docs/[\w./-]+\.md)`?,? (?:\*([^*]+)\*|\"([^\"]+)\")")


def markdown_pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside its fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


@cache
def headings(path: Path) -> tuple[str, ...]:
    return tuple(
        found[2]
        for line in prose_lines(path.read_text(encoding="utf-8"))
        if (found := HEADING.match(line))
    )


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor GitHub makes for the page's headings (a repeated one gets -1, -2, …)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in headings(path):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
    )
    suffixes = {".py", ".pyi", ".md", ".toml", ".proto", ".yaml", ".yml", ".txt", ""}
    paths = [ROOT / name for name in listed.stdout.split("\0") if name]
    return [p for p in paths if p.suffix in suffixes and p.is_file() and not p.is_symlink()]


def test_the_readme_is_a_landing_page() -> None:
    size = len(README.read_bytes())
    assert size <= README_LIMIT, (
        f"README.md is {size} bytes, over {README_LIMIT}: move the detail to a page under "
        "docs/ and link it (docs/README.md lists the pages)"
    )


def test_the_readme_keeps_its_entry_points() -> None:
    text = README.read_text(encoding="utf-8")
    assert "scripts/test" in text.splitlines()  # .ci/run: grep -qx 'scripts/test' README.md
    for page in ("docs/README.md", "CONTRIBUTING.md", "SECURITY.md", "CHANGELOG.md"):
        assert f"]({page})" in text, f"README.md does not link {page}"


def test_every_relative_link_leads_to_a_file_and_its_heading() -> None:
    broken = []
    for page in markdown_pages():
        for line in prose_lines(page.read_text(encoding="utf-8")):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):
                    continue  # https:, mailto:
                file, _, anchor = target.partition("#")
                dest = (page.parent / file).resolve() if file else page
                where = f"{page.relative_to(ROOT)}: ({target})"
                if not dest.exists():
                    broken.append(f"{where}: no such file")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    broken.append(f"{where}: no heading with that anchor")
    assert not broken, "\n".join(broken)


def test_every_docs_path_named_anywhere_exists() -> None:
    missing = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for named in set(DOC_PATH.findall(text)) - NOT_OURS:
            if not (ROOT / named).exists():
                missing.append(f"{path.relative_to(ROOT)}: {named}")
    assert not missing, "\n".join(sorted(missing))


def test_every_section_cited_by_name_is_on_the_page_cited() -> None:
    wrong = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if path.suffix != ".md":  # a citation wraps onto the comment's next line
            text = re.sub(r"(?m)^\s*(#|//)+", " ", text)
        text = " ".join(text.split())
        for page, starred, quoted in CITATION.findall(text):
            if page in NOT_OURS or not (ROOT / page).exists():
                continue  # a missing page is the test above's
            cited = (starred or quoted).replace("`", "").lower()
            names = [h.replace("`", "").lower() for h in headings(ROOT / page)]
            if not any(cited in name for name in names):
                wrong.append(f"{path.relative_to(ROOT)}: {page}, {cited!r}")
    assert not wrong, "no such section on the page cited:\n" + "\n".join(sorted(set(wrong)))


def test_the_docs_index_lists_every_page() -> None:
    index = DOCS / "README.md"
    text = index.read_text(encoding="utf-8")
    listed = {(DOCS / target.partition("#")[0]).resolve() for target in LINK.findall(text)}
    unlisted = [str(page.relative_to(ROOT)) for page in sorted(DOCS.rglob("*.md")) if page != index]
    unlisted = [name for name in unlisted if (ROOT / name).resolve() not in listed]
    assert not unlisted, f"docs/README.md does not list: {unlisted}"


def test_commands_reference_is_current() -> None:
    # A subprocess, as developers run it: its own argv parsing and exit status.
    done = subprocess.run(
        [sys.executable, "scripts/gen_commands_doc.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Local policy (policy.toml)", "local-policy-policytoml"),
        (
            "Checking the sandbox: `endpointd sandbox check`",
            "checking-the-sandbox-endpointd-sandbox-check",
        ),
        ("Linux: Landlock, a private /proc, seccomp", "linux-landlock-a-private-proc-seccomp"),
        ("What calls cost", "what-calls-cost"),
        ("Which device: the repository", "which-device-the-repository"),
    ],
)
def test_anchors_are_githubs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor
