"""The command journal (endpointd.journal): a command's lifecycle, and compaction."""

from __future__ import annotations

from pathlib import Path

from endpointd.journal import Journal


def test_journal_lifecycle_and_compaction(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    journal.insert(
        command_id="c1", seq=2, body=b"body", body_sha256=b"h" * 32, state="accepted", accepted=True
    )
    journal.insert(
        command_id="c0", seq=1, body=b"b0", body_sha256=b"g" * 32, state="finished", accepted=False
    )
    assert [e.command_id for e in journal.active()] == ["c0", "c1"]
    journal.mark_running("c1")
    journal.set_pid("c1", 1234)
    journal.finish("c1", b"result")
    journal.mark_acked("c1", 99)
    entry = journal.get("c1")
    assert entry is not None
    assert (entry.state, entry.body, entry.result, entry.acked_offset) == (
        "acked",
        None,
        b"result",
        99,
    )
    assert entry.body_sha256 == b"h" * 32  # kept for dedupe
    assert [e.command_id for e in journal.active()] == ["c0"]
    assert journal.prune(older_than=-1) == 1
    assert journal.get("c1") is None
    journal.close()
    assert oct((tmp_path / "j.sqlite3").stat().st_mode & 0o777) == oct(0o600)
