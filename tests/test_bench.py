"""The benchmarks are run by hand, not by CI: these keep them running (a bench that breaks
silently is found only when someone needs its numbers)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    """A bench module, loaded by its path (bench/ is no package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_median_interval_is_an_order_statistic_interval() -> None:
    median_interval = load("towers_bench").median_interval
    # Under 6 values no interval covers the median with 95% confidence.
    assert median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (3.0, None, None)
    # 6 values: P(Binomial(6, 1/2) = 0) = 1/64 <= 2.5%, so the whole range.
    assert median_interval([6.0, 1.0, 5.0, 2.0, 4.0, 3.0]) == (3.5, 1.0, 6.0)
    # 100 values: the 40th and 61st (the textbook 95% ranks for n = 100).
    assert median_interval([float(i) for i in range(1, 101)]) == (50.5, 40.0, 61.0)


def test_monitoring_costs_add_up_over_a_job_at_the_default_cadences() -> None:
    from trainer.spec import SummariesSpec

    kinds = ("scalars (+ grad norm)", "histograms", "images", "images, first call",
             "graph (once)", "trace of 3 steps (once)")  # fmt: skip
    calls = {name: 0.0 for name in kinds}
    job_seconds = load("towers_bench").job_seconds
    # Each kind alone at 1 s a call: its number of calls in a 1000-step job.
    counts = {}
    for name in kinds:
        counts[name] = job_seconds({**calls, name: 1.0}, SummariesSpec(), 1000)
    assert counts == {
        "scalars (+ grad norm)": 100,  # every 10 steps
        "histograms": 2,  # every 500 (a cost under 0.5 s once counted as none)
        "images": 1,  # every 500, the first call apart
        "images, first call": 1,
        "graph (once)": 1,
        "trace of 3 steps (once)": 1,
    }
    assert job_seconds({**calls, "histograms": 0.01}, SummariesSpec(), 1000) == 0.02


@pytest.mark.slow
def test_towers_bench_runs_and_reports_every_ratio() -> None:
    # The fewest rounds that give a 95% interval (6), one step each, and a global batch of 8
    # (2 examples a tower at 4 towers): this checks that every part runs and reports, not
    # the numbers; at the default batch of 128 it took 1.7 times the CPU time.
    done = subprocess.run(
        [sys.executable, "bench/towers_bench.py", "--rounds", "6", "--steps", "1",
         "--worker-steps", "0", "--batch", "8"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for ratio in (
        "towers(1) / plain",
        "towers(1) / mirrored(1)",
        "towers(2) / mirrored(2)",
        "towers(4) / mirrored(4)",
    ):
        line = next((line for line in done.stdout.splitlines() if line.startswith(ratio)), None)
        assert line is not None and "95% CI" in line, done.stdout
    # Monitoring's share twice: all of its work, and the training loop's part of it.
    assert "default cadences over a 1000-step job, all of the work" in done.stdout
    assert "default cadences over a 1000-step job, the loop's share" in done.stdout
    assert done.stdout.count("throughput ratio") == 2, done.stdout


def test_start_bench_runs_and_reports_the_ratio() -> None:
    done = subprocess.run(
        [sys.executable, "bench/start_bench.py", "--rounds", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "service / floor, median of 1 per-round ratios:" in done.stdout, done.stdout


def test_series_bench_runs_and_reports_every_figure() -> None:
    done = subprocess.run(
        [sys.executable, "bench/series_bench.py", "--steps", "40000", "--series", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for row in ("| chart of 2,000 points", "| chart of 600 points", "| storing every batch"):
        assert row in done.stdout, done.stdout
