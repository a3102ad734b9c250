"""The CLI's live progress line on a terminal: never wider than it, and on a narrow one the
parts that matter least go first, whole."""

from __future__ import annotations

import io
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from service.client.display import ProgressLine


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def running_job() -> dict[str, Any]:
    return {
        "id": "abc",
        "state": "running",
        "progress": {
            "step": 1500, "total": 2000, "percent": 75.0, "phase": "training",
            "loss": 0.1234, "accuracy": 0.95, "examples_per_sec": 12_300, "eta_seconds": 90,
            "updated_at": datetime.fromtimestamp(time.time(), UTC).isoformat(),
        },
        "eval": {"accuracy": 0.91},
    }  # fmt: skip


def drawn(columns: int, monkeypatch: pytest.MonkeyPatch) -> str:
    """The line `update` draws on a terminal of `columns`."""
    monkeypatch.setenv("COLUMNS", str(columns))  # what shutil.get_terminal_size reads first
    out = Terminal()
    ProgressLine(out).update(running_job())
    return out.getvalue().removeprefix("\r")


@pytest.mark.parametrize(
    ("columns", "line"),
    [
        (160, "[##################------]  75.0% running (training) step 1500/2000 loss 0.1234 "
              "acc 95.0% eval acc 91.0% 12.3k ex/s ETA 1m30s"),
        # The bar narrows before anything goes.
        (120, "[##############----]  75.0% running (training) step 1500/2000 loss 0.1234 "
              "acc 95.0% eval acc 91.0% 12.3k ex/s ETA 1m30s"),
        (80, "[##########----]  75.0% running (training) step 1500/2000 loss 0.1234 ETA 1m30s"),
        # It showed "[##################------]  75.0% running (training) step 1": cut at
        # the edge, mid-word, with the loss and the ETA never shown.
        (60, "75.0% running (training) step 1500/2000 ETA 1m30s"),
        (40, "75.0% running step 1500/2000 ETA 1m30s"),
        (30, "75.0% running ETA 1m30s"),
        (20, "75.0% running"),
        (5, "75.0"),  # the percent alone is too wide: cut, as nothing is left to drop
    ],
)  # fmt: skip
def test_a_narrow_terminal_drops_whole_parts_least_needed_first(
    columns: int, line: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = drawn(columns, monkeypatch)
    assert shown == line
    assert len(shown) <= columns - 1  # a wrapped line cannot be drawn again with \r
