"""Progress lines keep a small loss: 6 significant digits, not 6 decimal places."""

from __future__ import annotations

import math

from trainer.rundir import significant as _significant


def test_a_small_loss_is_not_reported_as_zero() -> None:
    assert _significant(3.2e-8) == 3.2e-8
    assert _significant(0.8258296847343445) == 0.82583
    assert math.isnan(_significant(math.nan))
