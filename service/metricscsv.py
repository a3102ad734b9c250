"""A job's metrics as CSV: a header naming the columns (`step`, then a series each), then
a row per step, in step order, each value in its series' column and an empty field where
that series has no point at the step (eval runs less often than train reports).

The one writer of that CSV: `towerboard metrics ID` (standard output, and the file
`--into FILE` keeps) and the service's `GET /api/v1/jobs/{id}/metrics.csv` (the dashboard's
Download CSV) both format with it, so they give the same bytes for the same series.
Standard library only: the client imports it without FastAPI, the service without httpx,
and neither imports TensorFlow.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any


def columns_of(names: Sequence[str], present: Iterable[str]) -> list[str]:
    """The CSV's series columns: those named, in their order, a name given twice once (each
    kept with no points, so reads on append to one CSV); none named, the series `present`
    (those with points, in the order the API's answer lists them: by name)."""
    return list(dict.fromkeys(names)) if names else list(present)


def header(columns: Sequence[str]) -> str:
    """The header line: `step,loss,eval_accuracy`."""
    return ",".join(["step", *columns]) + "\n"


def row(step: int, values: Mapping[str, float], columns: Sequence[str]) -> str:
    """One step's line: its values in `columns`' order, empty where `values` has none."""
    # Each value as Python's repr, which reads back exact; no field needs quoting.
    fields = (repr(values[name]) if name in values else "" for name in columns)
    return ",".join([str(step), *fields]) + "\n"


def _finite(value: float | None) -> bool:
    """Whether a point's value goes in the CSV. An infinity stored before the service took
    one as no value (`service.progress`) is read by the store as it is: left out, as no
    point, as the API's JSON leaves it out, so the two CSVs stay the same bytes (the CLI
    wrote `None` for the JSON's null, which `metrics --into` then refused to read on after)."""
    return value is not None and math.isfinite(value)


def csv_rows(
    series: Mapping[str, list[dict[str, Any]]], columns: Sequence[str]
) -> tuple[str, int | None]:
    """The CSV rows (no header) of the API's JSON `series` in `columns`, a row per step,
    and the last row's step (None: no row)."""
    rows: dict[int, dict[str, float]] = {}
    for name in columns:
        for point in series.get(name) or []:
            if _finite(point["value"]):
                rows.setdefault(point["step"], {})[name] = point["value"]
    text = [row(step, rows[step], columns) for step in sorted(rows)]
    return "".join(text), max(rows, default=None)


def stream_rows(
    points: Iterable[tuple[str, int, float, float]], columns: Sequence[str]
) -> Iterator[str]:
    """The CSV rows (no header) of `points`, (series, step, time, value) in step order (a
    step's points in any order of series), each row yielded once its step is complete:
    only one step's values are held, however many points there are. Points of a series
    not in `columns` are left out, as `csv_rows` leaves them."""
    wanted = frozenset(columns)
    step: int | None = None
    values: dict[str, float] = {}
    for name, at, _, value in points:
        if name not in wanted or not _finite(value):
            continue
        if at != step:
            if step is not None:
                yield row(step, values, columns)
            step, values = at, {}
        values[name] = value
    if step is not None:
        yield row(step, values, columns)
