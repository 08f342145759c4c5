"""The worker's file and finding tools (view, edit, create_file, search, glob) against a
real endpointd: real Postgres, the real gateway over TLS gRPC, the real daemon doing the
reading and writing under its policy; the tools called as the model calls them
(:class:`WorkerToolbox`, arguments as JSON).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.gateway.delivery import CommandDelivery
from controlplane.gateway.queue import CommandQueue
from controlplane.settings import WorkerSettings
from controlplane.workers.tools import fileops
from controlplane.workers.tools import files as file_tools
from controlplane.workers.tools import search as search_tools
from controlplane.workers.tools.toolbox import WorkerToolbox
from controlplane.workers.worker import load_ticket
from tests.support.daemon import Daemon
from tests.support.gateway_harness import pairing_code, running_gateway
from tests.support.worker_harness import LocalDevice, ticket

WORD = "Zanzibar42"


def need_ripgrep() -> None:
    if shutil.which("rg") is None:
        if os.environ.get("CI"):
            pytest.fail("ripgrep (rg) is missing; scripts/bootstrap installs it")
        pytest.skip("ripgrep (rg) is not installed here (scripts/bootstrap installs it)")


def path_without_rg(where: Path) -> str:
    where.mkdir(parents=True, exist_ok=True)
    for tool in ("git", "sh"):
        found = shutil.which(tool)
        if found:
            (where / tool).symlink_to(found)
    return str(where)


@dataclass
class Bench:
    """A ticket's tools on a real device whose working directory is ``work``."""

    toolbox: WorkerToolbox
    work: Path
    daemon: Daemon
    calls: int = 0

    async def call(self, name: str, **args: Any) -> dict[str, Any]:
        self.calls += 1
        return await self.toolbox.call(name, json.dumps(args), f"call_{self.calls}")

    def deny(self, *paths: Path) -> None:
        """The device's owner denies ``paths`` in the local policy."""
        policy = self.daemon.home / "config" / "policy.toml"
        policy.write_text(
            f"allowed_roots = [{json.dumps(str(self.work.parent))}]\n"
            f"denied_paths = {json.dumps([str(p) for p in paths])}\n"
        )
        policy.chmod(0o600)


@contextlib.asynccontextmanager
async def device_bench(
    pool: asyncpg.Pool,
    db: async_sessionmaker[AsyncSession],
    database_url: str,
    tmp_path: Path,
    *,
    ripgrep: bool = True,
) -> AsyncIterator[Bench]:
    if ripgrep:
        need_ripgrep()
    work = tmp_path / "work"
    work.mkdir()
    home = tmp_path.parent / f"{tmp_path.name}.device"
    home.mkdir()
    daemon = Daemon(home, work=tmp_path)
    async with running_gateway(database_url, db, tmp_path.parent / f"{tmp_path.name}.cp") as gw:
        code = await pairing_code(pool, "laptop", owner="web:alice")
        url = f"https://127.0.0.1:{gw.port}"
        paired = await daemon.pair(url, code, "--fingerprint", gw.tls.fingerprint)
        assert paired.returncode == 0, paired.stderr + paired.stdout
        with pytest.MonkeyPatch.context() as patch:
            if not ripgrep:
                patch.setenv("PATH", path_without_rg(home / "bin"))
            daemon.start()
        queue = CommandQueue(pool)
        try:
            await daemon.wait_connected()
            device_id = await pool.fetchval("SELECT id FROM devices WHERE name = 'laptop'")
            device = LocalDevice(pool, CommandDelivery(pool), work, id=device_id)
            ticket_id, _ = await ticket(pool, device, workdir=str(work))
            bench = await load_ticket(pool, ticket_id)
            yield Bench(WorkerToolbox(pool, queue, WorkerSettings(), bench), work, daemon)
        finally:
            await queue.close()
            daemon.stop_all()


@pytest.fixture
async def bench(
    pool: asyncpg.Pool,
    db: async_sessionmaker[AsyncSession],
    database_url: str,
    tmp_path: Path,
) -> AsyncIterator[Bench]:
    async with device_bench(pool, db, database_url, tmp_path) as made:
        yield made


# -- view --------------------------------------------------------------------------------


async def test_view_shows_numbered_windows_clamped_at_the_edges(bench: Bench) -> None:
    (bench.work / "big.txt").write_text("".join(f"line {n}\n" for n in range(1, 451)))
    first = await bench.call("view", path="big.txt")
    assert first["lines"] == "1-200 of 450"
    content = first["content"].split("\n")
    assert (content[0], content[-1], len(content)) == ("     1\tline 1", "   200\tline 200", 200)
    assert "250 lines below: view(path='big.txt', start_line=201)" in first["note"]

    for start in (0, -5):
        clamped = await bench.call("view", path="big.txt", start_line=start)
        assert (clamped["lines"], clamped["content"]) == (first["lines"], first["content"])
        assert "before the first line" in clamped["note"]

    tail = await bench.call("view", path="big.txt", start_line=440)
    assert tail["lines"] == "440-450 of 450"
    assert tail["content"].split("\n")[-1] == "   450\tline 450"
    assert "note" not in tail

    past = await bench.call("view", path="big.txt", start_line=1000)
    assert past["lines"] == "251-450 of 450"
    assert "past the end (450 lines)" in past["note"]

    some = await bench.call("view", path="big.txt", start_line=10, end_line=12)
    assert some["content"] == "    10\tline 10\n    11\tline 11\n    12\tline 12"
    backwards = await bench.call("view", path="big.txt", start_line=10, end_line=3)
    assert backwards["lines"] == "10-209 of 450"
    assert "before start_line" in backwards["note"]
    most = await bench.call("view", path="big.txt", start_line=1, end_line=10_000)
    assert most["lines"] == "1-450 of 450"

    (bench.work / "empty.txt").write_bytes(b"")
    assert await bench.call("view", path="empty.txt") == {
        "path": "empty.txt",
        "lines": "none: the file is empty",
    }
    (bench.work / "open.txt").write_bytes(b"a\nb")
    unterminated = await bench.call("view", path="open.txt")
    assert unterminated["content"] == "     1\ta\n     2\tb"
    assert "no line break at the end" in unterminated["note"]
    (bench.work / "dos.txt").write_bytes(b"a\r\nb\r\n")
    dos = await bench.call("view", path="dos.txt")
    assert dos["content"] == "     1\ta\n     2\tb"
    assert "CRLF" in dos["note"]
    (bench.work / "wide.txt").write_text("x" * 2500 + "\n")
    wide = await bench.call("view", path="wide.txt")
    assert wide["content"].endswith("… [500 more characters on this line]")
    (bench.work / "latin1.txt").write_bytes(b"caf\xe9\n")
    assert "not valid UTF-8" in (await bench.call("view", path="latin1.txt"))["note"]

    (bench.work / "blob.bin").write_bytes(b"\x00\x01" * 100)
    assert "binary file" in (await bench.call("view", path="blob.bin"))["error"]
    assert "no such file" in (await bench.call("view", path="missing.txt"))["error"]


async def test_view_of_a_long_file_reads_only_as_far_as_it_shows(bench: Bench) -> None:
    lines = 40_000  # about 600 KB: more than one read
    (bench.work / "long.txt").write_text("".join(f"line {n:08d}\n" for n in range(1, lines + 1)))
    top = await bench.call("view", path="long.txt", end_line=3)
    assert top["lines"].startswith("1-3 of at least ")
    assert "view(path='long.txt', start_line=4)" in top["note"]
    reads = await bench.toolbox.pool.fetch(
        "SELECT spec FROM commands WHERE kind = 'read_file' ORDER BY created_at"
    )
    assert len(reads) == 1
    assert reads[0]["spec"]["limit"] == file_tools.FIRST_READ

    bottom = await bench.call("view", path="long.txt", start_line=lines - 1)
    assert bottom["lines"] == f"{lines - 1}-{lines} of {lines}"
    assert bottom["content"].endswith(f"\tline {lines:08d}")


# -- edit and create_file ------------------------------------------------------------------

SOURCE = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"


async def test_edit_refuses_and_changes_nothing_when_old_is_missing_ambiguous_or_the_same(
    bench: Bench,
) -> None:
    calc = bench.work / "calc.py"
    calc.write_text(SOURCE)

    missing = await bench.call("edit", path="calc.py", old="return a * b", new="x")
    assert "old was not found in calc.py; nothing was changed" in missing["error"]
    assert "closest line to old's first line is line 2" in missing["error"]
    spaced = await bench.call("edit", path="calc.py", old="def add(a, b):\n  return a - b", new="x")
    assert "lines 1-2 match but for whitespace" in spaced["error"]
    assert "     2\t    return a - b" in spaced["error"]

    twice = await bench.call("edit", path="calc.py", old="    return a - b", new="    return 0")
    assert "occurs 2 times in calc.py (starting on lines 2, 6)" in twice["error"]
    assert "replace_all" in twice["error"]

    same = await bench.call("edit", path="calc.py", old="a - b", new="a - b", replace_all=True)
    assert "the same text" in same["error"]
    blank = await bench.call("edit", path="calc.py", old="", new="x")
    assert "old" in blank["error"]
    assert calc.read_text() == SOURCE

    (bench.work / "blob.bin").write_bytes(b"\x00abc")
    assert "binary" in (await bench.call("edit", path="blob.bin", old="abc", new="x"))["error"]
    (bench.work / "latin1.txt").write_bytes(b"caf\xe9\n")
    latin = await bench.call("edit", path="latin1.txt", old="caf", new="tea")
    assert "not UTF-8" in latin["error"]
    assert (bench.work / "latin1.txt").read_bytes() == b"caf\xe9\n"
    assert "no such file" in (await bench.call("edit", path="nope.py", old="a", new="b"))["error"]


async def test_edit_refuses_a_file_changed_after_it_was_read(
    bench: Bench, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone writes the file between the edit's read and its write: the device's
    compare-and-swap refuses the write, and their change stays."""
    calc = bench.work / "calc.py"
    calc.write_text(SOURCE)
    real_op = fileops.file_op

    async def racing(call: Any, spec: Any) -> Any:
        result = await real_op(call, spec)
        if spec.KIND == "read_file":
            calc.write_text(SOURCE + "# a person's change\n")
        return result

    monkeypatch.setattr(file_tools, "file_op", racing)
    raced = await bench.call("edit", path="calc.py", old="def add", new="def plus")
    assert "changed after it was read" in raced["error"]
    assert "nothing was written" in raced["error"]
    assert calc.read_text() == SOURCE + "# a person's change\n"


async def test_edit_replaces_and_shows_the_lines_around_the_change(bench: Bench) -> None:
    calc = bench.work / "calc.py"
    calc.write_text(SOURCE)
    done = await bench.call(
        "edit",
        path="calc.py",
        old="def add(a, b):\n    return a - b",
        new="def add(a, b):\n    return a + b",
    )
    assert done["replaced"] == 1
    assert done["snippet"].split("\n")[:3] == [
        "     1\tdef add(a, b):",
        "     2\t    return a + b",
        "     3\t",
    ]
    assert calc.read_text() == SOURCE.replace("a - b", "a + b", 1)

    renamed = await bench.call("edit", path="calc.py", old="a, b", new="x, y", replace_all=True)
    assert renamed["replaced"] == 2
    assert "     5\tdef sub(x, y):" in renamed["snippet"]
    deleted = await bench.call(
        "edit", path="calc.py", old="\n\ndef sub(x, y):\n    return a - b\n", new=""
    )
    assert deleted["replaced"] == 1
    assert calc.read_text() == "def add(x, y):\n    return a + b\n"
    assert calc.stat().st_mode & 0o777 == 0o644


async def test_create_file_makes_parents_and_never_clobbers(bench: Bench) -> None:
    made = await bench.call("create_file", path="pkg/sub/new.py", content="x = 1\ny = 2\n")
    assert made == {"path": "pkg/sub/new.py", "created": True, "lines": 2, "bytes": 12}
    assert (bench.work / "pkg" / "sub" / "new.py").read_text() == "x = 1\ny = 2\n"
    again = await bench.call("create_file", path="pkg/sub/new.py", content="overwritten\n")
    assert "already exists; nothing was written" in again["error"]
    assert (bench.work / "pkg" / "sub" / "new.py").read_text() == "x = 1\ny = 2\n"


# -- search and glob -----------------------------------------------------------------------


async def _finding(bench: Bench, *, engine: str) -> None:
    """What both matchers must do alike through the tools: caps with a working recall id,
    files_only, glob ordering, and never a match from a denied path or a link to one."""
    src = bench.work / "src"
    src.mkdir()
    (src / "many.py").write_text("".join(f"hit_{n} = {WORD}\n" for n in range(150)))
    (src / "one.py").write_text(f"x = '{WORD}'\n")
    secrets = bench.work / "secrets"
    secrets.mkdir()
    (secrets / "token.txt").write_text(f"{WORD}\n")
    (src / "token_link").symlink_to(secrets / "token.txt")
    (src / "secrets_link").symlink_to(secrets)
    bench.deny(secrets)

    found = await bench.call("search", pattern=WORD, literal=True)
    assert found["matches"] == 151
    rows = found["results"].split("\n")
    assert len(rows) == search_tools.SHOWN_MATCHES
    assert rows[0] == f"src/many.py:1: hit_0 = {WORD}"
    assert all("secrets" not in row and "link" not in row for row in rows)
    more = found["more"]
    assert more.startswith("51 more matches not shown: recall(id='cmd_")
    recall = re.search(r"recall\(id='(cmd_\w+)', offset=(\d+)\)", more)
    assert recall is not None, more
    rest = await bench.call("recall", id=recall[1], offset=int(recall[2]))
    first_left = json.loads(rest["output"].split("\n")[0])
    assert first_left == {"path": "src/many.py", "line": 101, "text": f"hit_100 = {WORD}"}

    listed = await bench.call("search", pattern=WORD, files_only=True, path="src")
    assert listed["files"] == "src/many.py (150)\nsrc/one.py (1)"
    narrowed = await bench.call("search", pattern=r"hit_1\d\d =", glob="many.*")
    assert narrowed["matches"] == 50
    assert "more" not in narrowed
    none = await bench.call("search", pattern="nowhere to be found")
    assert none["note"] == "no matches"
    bad = await bench.call("search", pattern="(")
    assert "invalid regular expression" in bad["error"]
    denied = await bench.call("search", pattern=WORD, path="secrets")
    assert "denied_paths" in denied["error"]

    for n in range(120):
        path = bench.work / "gen" / f"f{n:03d}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_text("x\n")
        os.utime(path, (1_000_000 + n, 1_000_000 + n))
    globbed = await bench.call("glob", pattern="*.txt", path="gen")
    names = globbed["files"].split("\n")
    assert (globbed["count"], len(names)) == (120, 100)
    assert names[:2] == ["gen/f119.txt", "gen/f118.txt"]  # newest first
    assert globbed["more"].startswith("20 more files not shown: recall(id='cmd_")
    everything = await bench.call("glob", pattern="**")
    assert not [p for p in everything["files"].split("\n") if "secret" in p or "link" in p]

    greek = await bench.call("search", pattern=r"\p{Greek}")
    if engine == "ripgrep":
        assert greek["note"] == "no matches"
    else:
        assert "bad escape" in greek["error"]


async def test_search_and_glob_with_ripgrep(bench: Bench) -> None:
    await _finding(bench, engine="ripgrep")


async def test_search_and_glob_without_ripgrep(
    pool: asyncpg.Pool,
    db: async_sessionmaker[AsyncSession],
    database_url: str,
    tmp_path: Path,
) -> None:
    async with device_bench(pool, db, database_url, tmp_path, ripgrep=False) as bench:
        await _finding(bench, engine="builtin")
