"""The tree passes its own static checks: ruff's lint rules and format, and mypy's types,
as configured in pyproject.toml. Run here so that CI holds every change to them, not only the ones
whose author remembered."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize(
    "check",
    [("ruff", "check", "."), ("ruff", "format", "--check", "."), ("mypy",)],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_tree_passes_static_check(check: tuple[str, ...]) -> None:
    result = run(*check)
    assert result.returncode == 0, (
        f"{' '.join(check)} found problems:\n{result.stdout}{result.stderr}"
    )
