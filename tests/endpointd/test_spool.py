"""The output spools (endpointd.spool): framed records read back at any offset, and a
spool directory that never escapes the state dir."""

from __future__ import annotations

import random
from pathlib import Path

from endpointd.spool import SpoolReader, SpoolWriter, output_total, spool_dir


def test_spool_reader_reassembles_any_offsets_and_keeps_streams_apart(tmp_path: Path) -> None:
    writer = SpoolWriter(tmp_path)
    rng = random.Random(7)
    records = []
    for _ in range(200):
        stream = rng.choice([1, 2])
        data = rng.randbytes(rng.choice([0, 1, 7, 500, 70_000]))
        writer.append(stream, data)
        records.append((stream, data))
    writer.close()
    combined = b"".join(d for _, d in records)
    assert output_total(tmp_path) == len(combined) == writer.total

    reader = SpoolReader(tmp_path)
    for start in [0, 1, len(combined) // 3, len(combined) - 1, 12345]:
        # Sequential reads from any start point, with rewinds in between, rebuild the rest.
        offset, out = start, bytearray()
        while (got := reader.read(offset, 64 * 1024)) is not None:
            stream, data = got
            assert 0 < len(data) <= 64 * 1024
            out += data
            offset += len(data)
        assert bytes(out) == combined[start:]
    assert reader.read(len(combined), 10) is None
    reader.close()


def test_spool_reader_merges_a_stream_run_and_stops_at_a_stream_change(tmp_path: Path) -> None:
    writer = SpoolWriter(tmp_path)
    for piece in (b"ab", b"cd", b"ef"):
        writer.append(1, piece)
    writer.append(2, b"ERR")
    writer.close()
    reader = SpoolReader(tmp_path)
    assert reader.read(1, 100) == (1, b"bcdef")
    assert reader.read(6, 100) == (2, b"ERR")
    assert reader.read(0, 3) == (1, b"abc")


def test_spool_dir_never_escapes_the_state_dir(tmp_path: Path) -> None:
    assert spool_dir(tmp_path, "cmd_abc").name == "cmd_abc"
    for hostile in ("../../etc", "/abs", "a/b", ".hidden", ""):
        path = spool_dir(tmp_path, hostile)
        assert path.parent == tmp_path / "spool"
        assert path.name.startswith("x-")
