"""read_file, write_file and list_dir through a real endpointd and the fake gateway, and
the walk that keeps them inside their allowed root (called directly, racing it on purpose)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import stat
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from endpointd.commands.fileops import OpResult, list_dir, read_file, write_file
from endpointd.guard import files
from endpointd.guard.files import Checker
from endpointd.guard.policy import Policy
from endpointd.spoolformat import OUTPUT_FILE, SpoolWriter
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared.messages import ListDir, ReadFile, WriteFile
from tests.fakes.endpointd_process import Endpointd, endpointd_in, start_paired
from tests.fakes.gateway_server import FakeGateway
from tests.support.helpers import assert_eventually


@pytest.fixture
def endpointd(tmp_path: Path) -> Iterator[Endpointd]:
    with endpointd_in(tmp_path) as daemon:
        yield daemon


BINARY = bytes(range(256)) * 600  # every byte value, > 128 KiB: several chunks


@pytest.fixture
def gw() -> Iterator[FakeGateway]:
    with FakeGateway(tls=True) as gateway:
        yield gateway


async def _do(gw: FakeGateway, device: str, command: pb.Command) -> tuple[pb.Finished, bytes]:
    sent = gw.send(device, command)
    finished = await assert_eventually(
        lambda: gw.finished(sent.command_id) or gw.refused(sent.command_id)
    )
    assert isinstance(finished, pb.Finished), finished
    return finished, gw.output(sent.command_id)


async def test_write_then_read_binary_round_trip(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    device = await start_paired(gw, endpointd)
    target = tmp_path / "new" / "dir" / "blob.bin"
    finished, _ = await _do(
        gw,
        device,
        pb.Command(write_file=pb.WriteFile(path=str(target), content=BINARY, create_parents=True)),
    )
    assert (finished.exit_code, finished.error) == (0, "")
    assert target.read_bytes() == BINARY
    assert target.stat().st_mode & 0o777 == 0o644
    assert not [p for p in target.parent.iterdir() if p != target]  # no temp file left

    finished, data = await _do(gw, device, pb.Command(read_file=pb.ReadFile(path=str(target))))
    assert data == BINARY
    assert finished.total_output_bytes == len(BINARY)
    chunks = [m.output for m in gw.messages("output") if m.output.data and m.output.stream == 3]
    assert chunks
    assert all(len(c.data) <= 64 * 1024 for c in chunks)

    finished, data = await _do(
        gw, device, pb.Command(read_file=pb.ReadFile(path=str(target), offset=1000, limit=70_000))
    )
    assert data == BINARY[1000:71_000]
    assert not gw.violations


async def test_write_modes_parents_and_compare_and_swap(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    device = await start_paired(gw, endpointd)
    path = tmp_path / "f.txt"

    def write(content: bytes, **kw: object) -> pb.Command:
        return pb.Command(write_file=pb.WriteFile(path=str(path), content=content, **kw))  # type: ignore[arg-type]

    # expected_sha256 = b"" means "must not exist yet".
    finished, _ = await _do(gw, device, write(b"one", expected_sha256=b"", mode=0o600))
    assert finished.error == ""
    assert path.stat().st_mode & 0o777 == 0o600
    finished, _ = await _do(gw, device, write(b"two", expected_sha256=b""))
    assert "already exists" in finished.error
    assert path.read_bytes() == b"one"

    stale = hashlib.sha256(b"something else").digest()
    finished, _ = await _do(gw, device, write(b"two", expected_sha256=stale))
    assert "expected_sha256 mismatch" in finished.error
    assert finished.exit_code != 0
    assert path.read_bytes() == b"one"

    finished, _ = await _do(
        gw, device, write(b"two", expected_sha256=hashlib.sha256(b"one").digest())
    )
    assert finished.error == ""
    assert path.read_bytes() == b"two"
    assert path.stat().st_mode & 0o777 == 0o600  # replacing keeps the mode

    missing_parent = tmp_path / "absent" / "x"
    finished, _ = await _do(
        gw, device, pb.Command(write_file=pb.WriteFile(path=str(missing_parent), content=b"x"))
    )
    assert "parent directory does not exist" in finished.error

    finished, _ = await _do(
        gw, device, pb.Command(read_file=pb.ReadFile(path=str(tmp_path / "nope")))
    )
    assert "no such file" in finished.error


async def test_list_dir_json_lines_with_depth(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    device = await start_paired(gw, endpointd)
    root = tmp_path / "tree"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"12345")
    (root / "sub" / "b.txt").write_bytes(b"")
    (root / "sub" / "deeper" / "c.txt").write_bytes(b"c")
    os.symlink("a.txt", root / "link")

    finished, data = await _do(gw, device, pb.Command(list_dir=pb.ListDir(path=str(root))))
    assert finished.error == ""
    entries = [json.loads(line) for line in data.decode().splitlines()]
    by_path = {e["path"]: e for e in entries}
    assert set(by_path) == {"a.txt", "sub", "link"}
    assert by_path["a.txt"]["type"] == "file"
    assert by_path["a.txt"]["size"] == 5
    assert by_path["sub"]["type"] == "dir"
    assert by_path["link"]["type"] == "symlink"
    assert isinstance(by_path["a.txt"]["mtime"], float)
    assert by_path["a.txt"]["mode"] == (root / "a.txt").stat().st_mode & 0o7777

    _, data = await _do(gw, device, pb.Command(list_dir=pb.ListDir(path=str(root), depth=2)))
    paths = {json.loads(line)["path"] for line in data.decode().splitlines()}
    assert paths == {"a.txt", "sub", "link", "sub/b.txt", "sub/deeper"}

    finished, _ = await _do(gw, device, pb.Command(list_dir=pb.ListDir(path=str(root / "a.txt"))))
    assert "not a directory" in finished.error


async def test_list_dir_through_the_daemon_never_shows_what_is_inside_denied_paths(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    """A denied path inside the allowed root: a listing names it, marked denied, and never
    shows what is inside it; reading it, or listing it, is refused."""
    device = await start_paired(gw, endpointd)
    secrets = tmp_path / "secrets"
    (secrets / "deeper").mkdir(parents=True)
    (secrets / "id_ed25519").write_text("not really a key\n")
    (secrets / "deeper" / "token").write_text("t\n")
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "main.py").write_text("print(1)\n")
    policy_file = endpointd.config_dir / "policy.toml"
    policy_file.write_text(
        f"allowed_roots = [{json.dumps(str(tmp_path))}]\n"
        f"denied_paths = [{json.dumps(str(secrets))}]\n"
    )
    policy_file.chmod(0o600)

    finished, data = await _do(
        gw, device, pb.Command(list_dir=pb.ListDir(path=str(tmp_path), depth=5))
    )
    assert finished.error == ""
    entries = {e["path"]: e for e in map(json.loads, data.decode().splitlines())}
    assert entries["secrets"] == {"path": "secrets", "type": "dir", "denied": True}
    assert [p for p in entries if p.startswith("secrets/")] == []
    assert entries["project/main.py"]["size"] == 9

    for command in (
        pb.Command(list_dir=pb.ListDir(path=str(secrets))),
        pb.Command(read_file=pb.ReadFile(path=str(secrets / "id_ed25519"))),
    ):
        command_id = gw.send(device, command).command_id
        refused = await assert_eventually(functools.partial(gw.refused, command_id))
        assert "denied_paths" in refused.message
        assert gw.output(command_id) == b""


async def test_write_file_through_the_daemon_caps_the_mode(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    device = await start_paired(gw, endpointd)
    target = tmp_path / "run.sh"
    finished, _ = await _do(
        gw,
        device,
        pb.Command(write_file=pb.WriteFile(path=str(target), content=b"#!/bin/sh\n", mode=0o777)),
    )
    assert finished.error == ""
    assert stat.S_IMODE(target.stat().st_mode) == 0o755


# --------------------------------------------------------------------------- the walk

SECRET = b"outside the root: must never be read or written"


def _nothing_denied(path: str) -> str | None:
    return None


class Box:
    """An allowed root and, beside it, a directory outside it holding a secret."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        (tmp_path / "root").mkdir()
        (tmp_path / "outside").mkdir()
        self.root = (tmp_path / "root").resolve()
        self.outside = (tmp_path / "outside").resolve()
        (self.outside / "secret.txt").write_bytes(SECRET)
        self._spools = 0

    def _spool(self) -> Path:
        self._spools += 1
        spool = self.tmp / "spools" / str(self._spools)
        spool.mkdir(parents=True)
        return spool

    def read(self, path: Path, denied: Checker = _nothing_denied) -> tuple[OpResult, bytes]:
        spool = self._spool()
        writer = SpoolWriter(spool)
        result = read_file(ReadFile(path=str(path)), writer, root=str(self.root), denied=denied)
        writer.close()
        return result, _data(spool)

    def list(
        self, path: Path, depth: int = 1, denied: Checker = _nothing_denied
    ) -> tuple[OpResult, dict[str, dict[str, object]]]:
        spool = self._spool()
        writer = SpoolWriter(spool)
        result = list_dir(
            ListDir(path=str(path), depth=depth), writer, root=str(self.root), denied=denied
        )
        writer.close()
        lines = _data(spool).decode().splitlines()
        return result, {e["path"]: e for e in map(json.loads, lines)}

    def write(
        self,
        path: Path,
        content: bytes = b"written",
        denied: Checker = _nothing_denied,
        **fields: object,
    ) -> OpResult:
        op = WriteFile(path=str(path), content=content, **fields)  # type: ignore[arg-type]
        return write_file(op, root=str(self.root), denied=denied)

    def outside_untouched(self) -> None:
        assert sorted(os.listdir(self.outside)) == ["secret.txt"]
        assert (self.outside / "secret.txt").read_bytes() == SECRET


def _data(spool: Path) -> bytes:
    """The DATA records of a spool's output, joined."""
    try:
        raw = (spool / OUTPUT_FILE).read_bytes()
    except FileNotFoundError:
        return b""
    out, pos = bytearray(), 0
    while pos < len(raw):
        _stream, length = struct.unpack_from(">BI", raw, pos)
        out += raw[pos + 5 : pos + 5 + length]
        pos += 5 + length
    return bytes(out)


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


def _refused(result: OpResult, *words: str) -> None:
    assert result.exit_code == 1, result
    assert "\n" not in result.error
    assert "Traceback" not in result.error
    for word in words:
        assert word in result.error, (word, result.error)


def test_a_symlink_in_the_root_to_etc_or_to_a_file_outside_is_never_followed(box: Box) -> None:
    etc_file = "hostname" if Path("/etc/hostname").exists() else "passwd"
    (box.root / "link").symlink_to("/etc")
    result, data = box.read(box.root / "link" / etc_file)
    _refused(result, f"{box.root / 'link'} is a symlink to /etc", "do not follow links")
    assert data == b""
    listed, entries = box.list(box.root / "link")
    _refused(listed, "is a symlink to /etc")
    assert entries == {}

    (box.root / "secret-link").symlink_to(box.outside / "secret.txt")
    result, data = box.read(box.root / "secret-link")
    _refused(result, "outside the allowed root", str(box.root))
    assert data == b""

    (box.root / "up").symlink_to("../outside")  # relative, climbing out with `..`
    result, data = box.read(box.root / "up" / "secret.txt")
    _refused(result, "leads out of the allowed root")
    assert data == b""

    # The walk itself, whatever any string check said before it.
    with (
        pytest.raises(files.PathRefused),
        files.walk(
            str(box.root), str(box.root / "link" / etc_file), leaf="file", denied=_nothing_denied
        ),
    ):
        pass


def test_symlinks_that_stay_inside_the_root_are_resolved_by_the_walk(box: Box) -> None:
    deep = box.root / "real" / "deep"
    deep.mkdir(parents=True)
    (deep / "f.txt").write_bytes(b"inside")
    (box.root / "rel").symlink_to("real/deep")
    (box.root / "abs").symlink_to(box.root / "real")
    (box.root / "real" / "back").symlink_to("../rel/f.txt")  # a chain of two links
    for path in (
        box.root / "rel" / "f.txt",
        box.root / "abs" / "deep" / "f.txt",
        box.root / "real" / "back",
    ):
        result, data = box.read(path)
        assert (result.error, data) == ("", b"inside"), path

    assert box.write(box.root / "rel" / "new.txt", b"via link").error == ""
    assert (deep / "new.txt").read_bytes() == b"via link"

    (box.root / "a").symlink_to("b")
    (box.root / "b").symlink_to("a")
    result, _ = box.read(box.root / "a")
    _refused(result, "more than 40 symbolic links")


def test_a_directory_swapped_for_a_symlink_after_the_check_is_not_followed(
    box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TOCTOU: the path is checked while `dir` is a directory, then `dir` becomes a link
    to the outside, right before the walk opens it. The open must not follow it."""
    for name in ("dir", "dir2"):
        (box.root / name).mkdir()
        (box.root / name / "secret.txt").write_bytes(b"harmless")
    checked = files.relative_parts

    def check_then_swap(root: str, path: str) -> list[str]:
        parts = checked(root, path)  # the check saw a directory inside the root
        swapped = box.root / parts[0]
        shutil.rmtree(swapped)
        swapped.symlink_to(box.outside)
        return parts

    monkeypatch.setattr(files, "relative_parts", check_then_swap)
    result, data = box.read(box.root / "dir" / "secret.txt")
    _refused(result, f"{box.root / 'dir'} is a symlink to {box.outside}")
    assert data == b""
    _refused(box.write(box.root / "dir2" / "new.txt"), "is a symlink")
    box.outside_untouched()


def test_write_file_through_a_symlinked_parent_writes_nothing_outside(box: Box) -> None:
    (box.root / "out").symlink_to(box.outside)
    _refused(box.write(box.root / "out" / "new.txt"), "do not follow links out of the root")
    _refused(box.write(box.root / "out" / "a" / "b" / "c.txt", create_parents=True), "is a symlink")
    (box.root / "victim").symlink_to(box.outside / "secret.txt")
    _refused(box.write(box.root / "victim", b"overwritten"), "outside the allowed root")
    assert (box.root / "victim").is_symlink()
    box.outside_untouched()
    assert sorted(p.name for p in box.root.iterdir()) == ["out", "victim"]

    # Parents made one at a time inside the root.
    assert box.write(box.root / "x" / "y" / "z.txt", create_parents=True).error == ""
    assert (box.root / "x" / "y" / "z.txt").read_bytes() == b"written"
    missing = box.write(box.root / "nope" / "z.txt")
    _refused(missing, "parent directory does not exist", "set create_parents")


def _policy(box: Box, body: str = "") -> Policy:
    config = box.tmp / "config"
    config.mkdir()
    (config / "policy.toml").write_text(f"allowed_roots = [{json.dumps(str(box.root))}]\n{body}")
    (config / "policy.toml").chmod(0o600)
    return Policy(config / "policy.toml", state_dir=box.tmp / "state", home=box.tmp / "home")


def test_a_link_swapped_in_after_the_check_is_judged_again_where_it_leads(box: Box) -> None:
    """Checked, `notes.txt` was an ordinary new file; when it is written it has become a
    link to the repository's pre-commit hook. The link stays inside the root, so the walk
    follows it, and the write is judged again where it really lands: a protected path."""
    hooks = box.root / "repo" / ".git" / "hooks"
    hooks.mkdir(parents=True)
    policy = _policy(box)
    notes = box.root / "notes.txt"
    assert policy.check_path(str(notes), "write").action == "allow"
    notes.symlink_to(hooks / "pre-commit")

    def judge(real: str) -> str | None:
        decision = policy.check_path(real, "write")
        return None if decision.action == "allow" else decision.rule

    result = write_file(
        WriteFile(path=str(notes), content=b"#!/bin/sh\n"),
        root=str(box.root),
        denied=policy.denied_rule,
        judge=judge,
    )
    _refused(result, str(notes), "protected: .git/hooks")
    assert os.listdir(hooks) == []


def test_list_dir_never_descends_into_denied_paths(box: Box) -> None:
    policy = _policy(box, f"denied_paths = [{json.dumps(str(box.root / 'secrets'))}]\n")
    (box.root / "secrets" / "sub").mkdir(parents=True)
    (box.root / "secrets" / "key.pem").write_text("KEY")
    (box.root / "secrets" / "sub" / "more.pem").write_text("KEY")
    (box.root / "ok").mkdir()
    (box.root / "ok" / "f.txt").write_text("fine")
    (box.root / "inlink").symlink_to("ok")
    (box.root / "outlink").symlink_to(box.outside)
    (box.root / "alias").symlink_to("secrets")

    result, entries = box.list(box.root, depth=5, denied=policy.denied_rule)
    assert result.error == ""
    assert entries["secrets"] == {"path": "secrets", "type": "dir", "denied": True}
    assert entries["alias"] == {"path": "alias", "type": "symlink", "denied": True}
    assert not [p for p in entries if p.startswith("secrets/")]
    assert set(entries) == {"secrets", "ok", "ok/f.txt", "inlink", "alias"}  # no outlink
    assert entries["inlink"]["type"] == "symlink"
    assert entries["ok/f.txt"]["size"] == 4

    for target in (box.root / "secrets", box.root / "alias", box.root / "secrets" / "sub"):
        listed, found = box.list(target, denied=policy.denied_rule)
        _refused(listed, "denied_paths")
        assert found == {}
    result, data = box.read(box.root / "alias" / "key.pem", denied=policy.denied_rule)
    _refused(result, "denied_paths")
    assert data == b""


def test_written_modes_lose_group_and_world_write_and_special_bits(box: Box) -> None:
    cases = {"all": 0o777, "setuid": 0o4777, "setgid": 0o2775, "sticky": 0o1755, "own": 0o600}
    for name, mode in cases.items():
        assert box.write(box.root / name, mode=mode).error == ""
    modes = {name: stat.S_IMODE((box.root / name).stat().st_mode) for name in cases}
    assert modes == {
        "all": 0o755,
        "setuid": 0o755,
        "setgid": 0o755,
        "sticky": 0o755,
        "own": 0o600,
    }
    shared = box.root / "shared.txt"
    shared.write_text("old")
    shared.chmod(0o666)
    assert box.write(shared, b"new").error == ""  # no mode given: the file's own, capped
    assert stat.S_IMODE(shared.stat().st_mode) == 0o644
