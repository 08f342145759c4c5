"""The shared table: columns fit their widest cell, the last one wraps to the width."""

from __future__ import annotations

from superagent_shared.table import render


def test_a_long_name_widens_its_column_and_every_row_stays_aligned() -> None:
    lines = render(
        ("NAME", "QUEUE", "NOTE"),
        [("laptop", 3, "ok"), ("a-very-long-device-name-indeed", 120, "ok")],
        right={1},
    )
    assert lines == [
        "NAME                            QUEUE  NOTE",
        "laptop                              3  ok",
        "a-very-long-device-name-indeed    120  ok",
    ]


def test_the_last_column_wraps_under_itself() -> None:
    lines = render(("ID", "SUMMARY"), [("f1", "one two three four five six")], width=30)
    # (the last column keeps its minimum width of 20)
    assert lines == ["ID  SUMMARY", "f1  one two three four five", "    six"]
