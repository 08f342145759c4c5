"""search and glob: what they may read (the attacker's tests, through a real endpointd,
with ripgrep and with the built-in matcher), what they answer, and how they stop.

The attacker plants the word being searched for where the policy says no search may look
(a denied path, a ``[[files]]`` rule, endpointd's own state) and links to it from inside
the searched tree (a file link, a directory link, a link out of the root). A search of
the whole tree must find the word in the one ordinary file, and nowhere else.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from endpointd.commands import ripgrep, search
from endpointd.commands.fileops import OpResult
from endpointd.commands.globs import IgnoreFile, Ignores, PathGlob
from endpointd.guard.policy import Policy
from endpointd.spool import STREAM_DATA, SpoolWriter, read_all
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared.messages import Glob, Search
from tests.fakes.endpointd_process import Endpointd, start_paired
from tests.fakes.gateway_server import FakeGateway
from tests.support.helpers import assert_eventually

WORD = "Zanzibar42"  # what the attacker wants found
ENGINES = ["ripgrep", "builtin"]


def need_ripgrep() -> str:
    """The rg this machine has; CI must have it (scripts/bootstrap installs it)."""
    found = shutil.which("rg")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("ripgrep (rg) is missing; scripts/bootstrap installs it")
        pytest.skip("ripgrep (rg) is not installed here (scripts/bootstrap installs it)")
    return found


def path_without_rg(tmp: Path) -> str:
    """A PATH with git and sh but no rg: the daemon then uses its built-in matcher."""
    bin_dir = tmp / "no-rg-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in ("git", "sh"):
        found = shutil.which(tool)
        if found and not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def use_engine(engine: str, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if engine == "ripgrep":
        need_ripgrep()
    else:
        monkeypatch.setenv("PATH", path_without_rg(tmp))


# -- through the daemon: the attacker's tests ------------------------------------------------


@pytest.fixture
def gw() -> Iterator[FakeGateway]:
    with FakeGateway(tls=True) as gateway:
        yield gateway


async def _do(gw: FakeGateway, device: str, command: pb.Command) -> tuple[pb.Finished, bytes]:
    sent = gw.send(device, command)
    done = await assert_eventually(
        lambda: gw.finished(sent.command_id) or gw.refused(sent.command_id)
    )
    if isinstance(done, pb.Refused):
        return pb.Finished(exit_code=1, error=done.message), gw.output(sent.command_id)
    return done, gw.output(sent.command_id)


def _plant(tmp: Path, daemon: Endpointd) -> Path:
    """The tree the attacker prepared; returns the directory to search (the allowed root)."""
    root = tmp
    (root / "project").mkdir()
    (root / "project" / "app.py").write_text(f"print('{WORD}')\n")
    (root / "project" / "greek.txt").write_text("αβγ\n")
    (root / "secrets").mkdir()
    (root / "secrets" / "key.txt").write_text(f"{WORD} in a denied path\n")
    (root / "project" / ".env").write_text(f"TOKEN={WORD}\n")  # a [[files]] rule denies it
    outside = tmp.parent / f"{tmp.name}.outside"
    outside.mkdir()
    (outside / "leak.txt").write_text(f"{WORD} outside the root\n")
    (root / "project" / "key_link").symlink_to(root / "secrets" / "key.txt")
    (root / "project" / "secrets_alias").symlink_to(root / "secrets")
    (root / "project" / "out_link").symlink_to(outside / "leak.txt")
    (root / "project" / "out_dir").symlink_to(outside)
    # endpointd's own state lies inside the searched root here, and holds the word too.
    daemon.state_dir.mkdir(parents=True, exist_ok=True)
    (daemon.state_dir / "planted.txt").write_text(f"{WORD} in endpointd's state\n")
    policy = daemon.config_dir / "policy.toml"
    policy.write_text(
        f"allowed_roots = [{json.dumps(str(root))}]\n"
        f"denied_paths = [{json.dumps(str(root / 'secrets'))}]\n"
        '[[files]]\nname = "no-dotenv"\naction = "deny"\nmatch = "*/.env"\nops = ["read"]\n'
    )
    policy.chmod(0o600)
    return root


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_search_never_reads_denied_paths_nor_follows_links_to_them(
    engine: str, gw: FakeGateway, tmp_path: Path
) -> None:
    # endpointd's private files (config, state) beside the box, both inside tmp_path.
    daemon = Endpointd(tmp_path / "box")
    if engine == "ripgrep":
        need_ripgrep()
    else:
        daemon.env["PATH"] = path_without_rg(tmp_path.parent / f"{tmp_path.name}.bin")
    try:
        device = await start_paired(gw, daemon)
        root = _plant(tmp_path, daemon)

        def find(pattern: str, path: Path = root, **kw: object) -> pb.Command:
            return pb.Command(search=pb.Search(pattern=pattern, path=str(path), **kw))  # type: ignore[arg-type]

        finished, data = await _do(gw, device, find(WORD, literal=True))
        assert finished.error == ""
        found = [json.loads(line) for line in data.decode().splitlines()]
        assert found == [{"path": "project/app.py", "line": 1, "text": f"print('{WORD}')"}]

        # Named directly, each way in is refused, and nothing is sent.
        for way in ("key_link", "secrets_alias", "out_link", "out_dir", ".env"):
            finished, data = await _do(gw, device, find(WORD, root / "project" / way))
            assert finished.exit_code != 0, way
            assert data == b"", way
        finished, data = await _do(gw, device, find(WORD, daemon.state_dir))
        assert (finished.exit_code, data) == (1, b"")

        # A glob names nothing inside them either.
        finished, data = await _do(
            gw, device, pb.Command(glob=pb.Glob(pattern="**", path=str(root)))
        )
        assert finished.error == ""
        assert sorted(data.decode().splitlines()) == [
            "box.endpointd/daemon.log",  # the test helper's log: no denied path
            "project/.env",  # listing it is allowed; reading it is not
            "project/app.py",
            "project/greek.txt",
        ]

        # Which matcher ran: \p{Greek} is ripgrep's, and no escape Python's re knows.
        finished, data = await _do(gw, device, find(r"\p{Greek}+", root / "project"))
        if engine == "ripgrep":
            assert finished.error == ""
            assert json.loads(data)["path"] == "greek.txt"
        else:
            assert "bad escape" in finished.error, finished.error
    finally:
        daemon.cleanup()


def test_ripgrep_reads_the_file_the_walk_judged_not_what_its_name_points_at_now(
    tmp_path: Path,
) -> None:
    """The race a path-based search loses: checked, ``notes.txt`` was an ordinary file;
    when ripgrep opens it, the name is a link to a secret. ripgrep gets the descriptor the
    walk opened, so it reads the file that was judged."""
    rg = need_ripgrep()
    notes = tmp_path / "notes.txt"
    notes.write_text("nothing here\n")
    secret = tmp_path / "secret.txt"
    secret.write_text(f"{WORD}\n")
    fd = os.open(notes, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        notes.unlink()
        notes.symlink_to(secret)  # swapped in after the check
        opened = ripgrep.Opened("notes.txt", fd, 13)
        assert list(ripgrep.search(rg, [opened], WORD, literal=True, ignore_case=False)) == []
        found = list(ripgrep.search(rg, [opened], "nothing", literal=True, ignore_case=False))
        assert [(o.rel, n, t) for o, n, t in found] == [("notes.txt", 1, "nothing here\n")]
    finally:
        os.close(fd)


# -- in the daemon's process: answers, caps, and the two matchers agreeing -------------------


class Box:
    """An allowed root, its policy, and search/glob run as the daemon runs them."""

    def __init__(self, tmp: Path, policy_body: str = "") -> None:
        self.tmp = tmp
        self.root = (tmp / "root").resolve()
        self.root.mkdir()
        config = tmp / "config"
        config.mkdir()
        (config / "policy.toml").write_text(
            f"allowed_roots = [{json.dumps(str(self.root))}]\n{policy_body}"
        )
        (config / "policy.toml").chmod(0o600)
        self.policy = Policy(config / "policy.toml", state_dir=tmp / "state", home=tmp / "home")
        self.runs = 0

    def _judge(self, op: str, real: str) -> str | None:
        decision = self.policy.check_path(real, op)  # type: ignore[arg-type]
        return None if decision.action == "allow" else decision.rule

    def _entry(self, real: str) -> str | None:
        decision = self.policy.check_path(real, "list")
        return None if decision.rule == "default_action" else self._judge("list", real)

    def run(self, op: Search | Glob, max_output: int | None = None) -> tuple[OpResult, bytes]:
        self.runs += 1
        spool = self.tmp / "spools" / str(self.runs)
        spool.mkdir(parents=True)
        writer = SpoolWriter(spool)
        result = search.run(
            op,
            writer,
            root=str(self.root),
            denied=self.policy.denied_rule,
            judge=functools.partial(self._judge, "read" if isinstance(op, Search) else "list"),
            entries=self._entry,
            max_output=max_output,
        )
        writer.close()
        return result, b"".join(data for stream, data in read_all(spool) if stream == STREAM_DATA)

    def found(self, pattern: str, **kw: object) -> list[tuple[str, int, str]]:
        result, data = self.run(Search(pattern=pattern, path=str(self.root), **kw))  # type: ignore[arg-type]
        # Stopping at max_matches says so (Finished.output_truncated).
        assert result == OpResult(truncated=bool(kw.get("max_matches"))), result
        return [(m["path"], m["line"], m["text"]) for m in map(json.loads, data.splitlines())]

    def globbed(self, pattern: str, path: Path | None = None, **kw: object) -> list[str]:
        op = Glob(pattern=pattern, path=str(path or self.root), **kw)  # type: ignore[arg-type]
        result, data = self.run(op)
        assert result.exit_code == 0, result
        assert result.error == ""
        return data.decode().splitlines()


def _repository(root: Path) -> None:
    """A small repository: ignored files, a binary, hidden files, nested ignore rules."""
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("needle in git's own files\n")
    (root / ".gitignore").write_text("build/\n*.log\n/top_only.txt\n# a comment\n")
    (root / "top_only.txt").write_text("needle ignored at the top\n")
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "top_only.txt").write_text("needle: the rule is anchored, not here\n")
    (root / "src" / "main.py").write_text("import os\n\ndef needle():\n    return 'Needle'\n")
    (root / "src" / "pkg" / "util.py").write_text("x = 1\r\nneedle = 2\r\n")
    (root / "src" / "pkg" / ".gitignore").write_text("*.gen.py\n!keep.gen.py\n")
    (root / "src" / "pkg" / "a.gen.py").write_text("needle generated\n")
    (root / "src" / "pkg" / "keep.gen.py").write_text("needle kept\n")
    (root / "src" / "blob.bin").write_bytes(b"needle\0\x01\x02")
    (root / "build").mkdir()
    (root / "build" / "out.py").write_text("needle built\n")
    (root / "debug.log").write_text("needle logged\n")
    (root / "src" / "trace.log").write_text("needle traced\n")
    (root / ".github").mkdir()
    (root / ".github" / "ci.yml").write_text("run: find the needle\n")
    (root / "last.txt").write_text("no newline at the end: needle")


EXPECTED = [
    (".github/ci.yml", 1, "run: find the needle"),
    ("last.txt", 1, "no newline at the end: needle"),
    ("src/main.py", 3, "def needle():"),
    ("src/pkg/keep.gen.py", 1, "needle kept"),
    ("src/pkg/util.py", 2, "needle = 2"),
    ("src/top_only.txt", 1, "needle: the rule is anchored, not here"),
]


@pytest.mark.parametrize("engine", ENGINES)
def test_search_skips_ignored_binary_and_git_files_alike_with_either_matcher(
    engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_engine(engine, tmp_path, monkeypatch)
    assert (ripgrep.find() is not None) == (engine == "ripgrep")
    box = Box(tmp_path)
    _repository(box.root)
    assert box.found("needle") == EXPECTED
    assert box.found("needle", literal=True) == EXPECTED
    assert box.found("NEEDLE", ignore_case=True)[2:4] == [
        ("src/main.py", 3, "def needle():"),
        ("src/main.py", 4, "    return 'Needle'"),
    ]
    assert box.found(r"^def \w+\(\):$") == [("src/main.py", 3, "def needle():")]
    assert box.found("needle", glob="*.py") == EXPECTED[2:5]
    assert box.found("needle", glob="src/pkg/*") == EXPECTED[3:5]
    assert box.found("needle", max_matches=2) == EXPECTED[:2]
    assert box.found("needle()", literal=True) == [EXPECTED[2]]  # no group: literal text
    # Below the repository's top, the .gitignore above still applies (*.log)...
    result, data = box.run(Search(pattern="needle", path=str(box.root / "src")))
    assert result == OpResult()
    below = [m["path"] for m in map(json.loads, data.splitlines())]
    assert below == ["main.py", "pkg/keep.gen.py", "pkg/util.py", "top_only.txt"]
    # ...but a directory named explicitly is searched, ignored or not (as ripgrep does).
    result, data = box.run(Search(pattern="needle", path=str(box.root / "build")))
    assert result == OpResult()
    assert json.loads(data) == {"path": "out.py", "line": 1, "text": "needle built"}
    # One file: its path in the answer is "".
    result, data = box.run(Search(pattern="needle", path=str(box.root / "src" / "main.py")))
    assert result == OpResult()
    assert json.loads(data) == {"path": "", "line": 3, "text": "def needle():"}


@pytest.mark.parametrize("engine", ENGINES)
def test_search_refuses_bad_patterns_in_one_line(
    engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_engine(engine, tmp_path, monkeypatch)
    box = Box(tmp_path)
    (box.root / "a.txt").write_text("(\n")
    for op, words in (
        (Search(pattern="(", path=str(box.root)), ("invalid regular expression", "'('")),
        (Search(pattern="a\nb", path=str(box.root)), ("line break",)),
        (Search(pattern="x", path=str(box.root / "nope")), ("no such file",)),
        (Glob(pattern="*", path=str(box.root / "a.txt")), ("not a directory",)),
    ):
        result, data = box.run(op)
        assert result.exit_code == 1
        assert "\n" not in result.error
        assert "Traceback" not in result.error
        for word in words:
            assert word in result.error, (word, result.error)
        assert data == b""


def test_long_lines_are_cut_and_the_policy_max_output_stops_a_search(tmp_path: Path) -> None:
    box = Box(tmp_path)
    (box.root / "long.txt").write_text("needle" + "x" * 5000 + "\n")
    (box.root / "many.txt").write_text("needle\n" * 500)
    ((_, _, text), *_) = box.found("needle", glob="long.txt")
    assert len(text) == search.MAX_TEXT_CHARS + 1
    assert text.endswith("…")
    result, data = box.run(Search(pattern="needle", path=str(box.root)), max_output=2000)
    assert result.exit_code == 1
    assert "max output" in result.error
    assert "stopped after" in result.error
    assert 0 < len(data) <= 2000
    assert all(json.loads(line)["text"] for line in data.splitlines())  # whole records only


def test_glob_lists_newest_first_capped_and_skips_what_is_ignored(tmp_path: Path) -> None:
    box = Box(tmp_path)
    _repository(box.root)
    newest_first = ["src/main.py", "last.txt", "src/pkg/util.py", "src/pkg/keep.gen.py"]
    for age, name in enumerate(newest_first):
        os.utime(box.root / name, (1_000_000 - age * 10, 1_000_000 - age * 10))
    os.utime(box.root / ".github" / "ci.yml", (900_000, 900_000))
    os.utime(box.root / "src" / "top_only.txt", (950_000, 950_000))
    assert box.globbed("**/*.py") == ["src/main.py", "src/pkg/util.py", "src/pkg/keep.gen.py"]
    assert box.globbed("*.py", max_entries=2) == ["src/main.py", "src/pkg/util.py"]
    assert box.run(Glob(pattern="*.py", path=str(box.root), max_entries=2))[0].truncated
    assert not box.run(Glob(pattern="*.py", path=str(box.root), max_entries=99))[0].truncated
    assert box.globbed("src/*.py") == ["src/main.py"]
    assert box.globbed("*.{txt,yml}")[-1] == ".github/ci.yml"  # the oldest
    assert "build/out.py" not in box.globbed("**")
    assert box.globbed("*.py", path=box.root / "src" / "pkg") == ["util.py", "keep.gen.py"]


# -- the patterns ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("*.py", ["a.py", "src/deep/b.py"], ["a.pyc", "a.py/x"]),
        ("src/*.py", ["src/a.py"], ["src/x/a.py", "lib/src/a.py"]),
        ("src/**/*.py", ["src/a.py", "src/x/y/a.py"], ["a.py", "lib/a.py"]),
        ("**/test_*", ["test_a", "t/test_b.py"], ["t/a_test"]),
        ("README*", ["README", "README.md", "docs/README.rst"], ["READ.md"]),
        ("*.{ts,tsx}", ["a.ts", "b/c.tsx"], ["a.js"]),
        ("[ab]?.txt", ["a1.txt", "bb.txt"], ["c1.txt", "a/.txt"]),
        ("[!a]*.txt", ["b.txt"], ["a.txt"]),
    ],
)
def test_globs_match_as_ripgrep_and_git_do(pattern: str, yes: list[str], no: list[str]) -> None:
    glob = PathGlob.parse(pattern)
    assert [p for p in yes if not glob.matches(p)] == []
    assert [p for p in no if glob.matches(p)] == []


def test_gitignore_rules_follow_gitignore_5() -> None:
    top = IgnoreFile.parse(
        "/r", "*.log\n!keep.log\nbuild/\n/only_top\ndocs/*.html\n\\#hash\n  \n# c\nspaced\\ \n"
    )
    deeper = IgnoreFile.parse("/r/sub", "!*.log\n")
    rules = Ignores((top,))
    assert rules.ignored("/r/a.log", False)
    assert rules.ignored("/r/x/a.log", False)
    assert not rules.ignored("/r/keep.log", False)
    assert rules.ignored("/r/x/build", True)
    assert not rules.ignored("/r/x/build", False)
    assert rules.ignored("/r/only_top", False)
    assert not rules.ignored("/r/x/only_top", False)
    assert rules.ignored("/r/docs/a.html", False)
    assert not rules.ignored("/r/x/docs/a.html", False)
    assert rules.ignored("/r/#hash", False)
    assert rules.ignored("/r/spaced ", False)
    assert not rules.ignored("/elsewhere/a.log", False)
    assert not Ignores((top, deeper)).ignored("/r/sub/a.log", False)  # the deeper file wins
