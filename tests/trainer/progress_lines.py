"""progress.jsonl as the tests read it, whole: parsed a line at a time as the trainer and
the service parse it (`trainer.rundir.json_object`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.rundir import json_object


def progress_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of progress.jsonl's complete lines (none while it does not exist);
    a line still being written is left out."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    complete = data[: data.rfind(b"\n") + 1]
    return [line for raw in complete.splitlines() if (line := json_object(raw)) is not None]
