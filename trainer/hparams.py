"""A job's spec as TensorBoard hyperparameters, for its HParams dashboard: a row per job,
its spec's values beside its metrics' last values, to sort and compare jobs side by side
in the service's TensorBoard (which shows many jobs).

Each leaf of the spec, as spec.json has it (without the options its optimizer or schedule
ignores), is one hyperparameter named by its path: `optimizer.learning_rate`,
`model.params.dropout`, `data.augment.flip_left_right`. A list is its JSON text, and an
integer past 2**53 its digits (a float would round it). Left out: what says how the job
is watched, kept or queued rather than what it trains (`priority`, `eval`, `summaries`,
`checkpoint`), `data.shuffle_buffer` (kept for the contract, read by nothing: the
pipeline shuffles each epoch whole), and the job's length (`steps`, `epochs`): a job
resumed to train longer changes that, while TensorBoard keeps the hyperparameters a run
wrote first; each metric's value says at which step it was taken.

Importable without TensorFlow (pure Python over the spec's dict).
"""

from __future__ import annotations

import json
from typing import Any

from trainer.spec import without_unread

LEFT_OUT = frozenset(
    {"priority", "eval", "summaries", "checkpoint", "steps", "epochs", "data.shuffle_buffer"}
)
# A custom model's params may be anything a builder takes: a megabyte string, a thousand
# keys. The dashboard is a table: a value is cut to a cell's worth, and a spec's leaves
# past the first MOST are left out (the log says how many).
TEXT_CHARS = 200
MOST = 100

HParam = bool | float | str
# Every integer up to this a float holds exactly; past it, not every one.
_EXACT = 2**53


def spec_hparams(spec: dict[str, Any]) -> tuple[dict[str, HParam], int]:
    """The hyperparameters of `spec` (a job spec's JSON dump), and how many of its leaves
    were left out past the first `MOST`."""
    values: dict[str, HParam] = {}
    dropped = 0

    def visit(name: str, value: Any) -> None:
        nonlocal dropped
        if name in LEFT_OUT:
            return
        if isinstance(value, dict):
            for key, item in value.items():
                visit(f"{name}.{key}", item)
            return
        if value is None:  # unset (`clip_norm`, `ema_decay`): no value to compare
            return
        if len(values) == MOST:
            dropped += 1
            return
        if isinstance(value, bool | str):
            values[name] = _cut(value) if isinstance(value, str) else value
        elif isinstance(value, float) or (isinstance(value, int) and abs(value) <= _EXACT):
            values[name] = float(value)
        elif isinstance(value, int):
            # Past 2**53 a float rounds it (two seeds a bit apart showed as one), and past
            # about 1e308 `float` raises, which failed the job at its start: its digits.
            values[name] = _cut(str(value))
        else:
            values[name] = _cut(json.dumps(value, separators=(",", ":")))

    for key, value in without_unread(spec).items():
        visit(key, value)
    return values, dropped


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_CHARS else text[: TEXT_CHARS - 1] + "…"
