"""The CLI's tables line up by the columns a terminal gives each character."""

from __future__ import annotations

import io

from service.client.display import table, width


def test_wide_and_combining_characters_keep_the_columns_in_line() -> None:
    # A name in Chinese, padded by its length, pushed every column after it out of line.
    rows = [
        ["NAME", "STATE"],
        ["训练任务", "running"],
        ["café", "queued"],
        ["e\u0301t\u00e9", "failed"],
    ]
    out = io.StringIO()
    table(rows, out)
    lines = out.getvalue().splitlines()
    # Each state starts at the same terminal column: 8 (the widest name) + 2.
    for line, (name, state) in zip(lines, rows, strict=True):
        assert line == name + " " * (8 - width(name)) + "  " + state
    assert [width(name) for name, _ in rows] == [4, 8, 4, 3]
