"""read_file, write_file and list_dir through a real endpointd and the fake gateway."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from superagent_proto.v1 import endpoint_pb2 as pb
from tests.fakes.endpointd_process import Endpointd, endpointd_in, start_paired
from tests.fakes.gateway_server import FakeGateway
from tests.helpers import assert_eventually


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
