"""The benchmarks are run by hand, not by CI: these keep them running (a bench that breaks
silently is found only when someone needs its numbers)."""

import argparse
import importlib.util
import json
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

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
        "scalars (+ grad norm)": 101,  # every 10 steps, and the first
        "histograms": 3,  # every 500 and the first (a cost under 0.5 s once counted as none)
        "images": 2,  # every 500 and the first, the first call apart
        "images, first call": 1,
        "graph (once)": 1,
        "trace of 3 steps (once)": 1,
    }
    assert job_seconds({**calls, "histograms": 0.01}, SummariesSpec(), 1000) == 0.03
    # A last step off the cadence is one call more.
    assert job_seconds({**calls, "histograms": 1.0}, SummariesSpec(), 1001) == 4
    # A kind turned off costs nothing (the defaults trace steps 20-22 and write the graph).
    every = {name: 1.0 for name in kinds}
    off = SummariesSpec(histograms_every=0, images_every=0, trace_steps=[], graph=False)
    assert job_seconds(every, off, 1000) == 101


def test_whole_worker_specs_differ_from_the_defaults_in_their_kinds_alone() -> None:
    from trainer.spec import JobSpec, SummariesSpec

    bench = load("towers_bench")
    args = argparse.Namespace(
        parameter_device="cpu", batch=128, worker_steps=1000, attribute=True, worker_model="cnn"
    )
    specs = bench.worker_specs(args)
    assert list(specs) == ["default summaries", "no summaries", "defaults less the trace",
                           "defaults less scalars", "defaults less histograms, images"]  # fmt: skip
    summaries = {name: JobSpec.model_validate(spec).summaries for name, spec in specs.items()}
    defaults = SummariesSpec().model_dump()
    assert summaries["default summaries"].model_dump() == defaults
    less: dict[str, dict[str, Any]] = {
        "defaults less the trace": {"trace_steps": []},
        "defaults less scalars": {"scalars_every": 0},
        "defaults less histograms, images": {"histograms_every": 0, "images_every": 0},
    }
    for name, off in less.items():
        assert summaries[name].model_dump() == defaults | off, name
    none = summaries["no summaries"]
    assert not (none.scalars_every or none.histograms_every or none.images_every)
    assert not (none.trace_steps or none.graph)
    args.attribute = False
    assert list(bench.worker_specs(args)) == ["default summaries", "no summaries"]


def run_bench(*args: str, timeout: int = 300) -> str:
    """A bench's stdout, run as `python bench/...` from the repository; it must succeed."""
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_towers_bench_runs_and_reports_every_ratio() -> None:
    # The fewest rounds that give a 95% interval (6), one step each, and a global batch of 8
    # (2 examples a tower at 4 towers): this checks that every part runs and reports, not
    # the numbers; at the default batch of 128 it took 1.7 times the CPU time.
    out = run_bench(
        "bench/towers_bench.py", "--rounds", "6", "--steps", "1", "--worker-steps", "0",
        "--batch", "8", timeout=600,
    )  # fmt: skip
    for ratio in (
        "towers(1) / plain",
        "towers(1) / mirrored(1)",
        "towers(2) / mirrored(2)",
        "towers(4) / mirrored(4)",
    ):
        line = next((line for line in out.splitlines() if line.startswith(ratio)), None)
        assert line is not None and "95% CI" in line, out
    # Monitoring's share twice: all of its work, and the training loop's part of it.
    assert "default cadences over a 1000-step job, all of the work" in out
    assert "default cadences over a 1000-step job, the loop's share" in out
    assert out.count("throughput ratio") == 2, out
    # Each share is the table's costs a call times their calls in a 1000-step job at the
    # default cadences, the once-only trace included (it once counted as none: the bench's
    # own spec traces no step). Rounding: 0.005 ms a call, times 101 for the scalars, and
    # 0.5 ms in the printed share.
    table = dict(
        (m[1].strip(), (float(m[2]) / 1000, float(m[3]) / 1000))
        for m in re.finditer(r"^  (\S.*?)\s+([\d.]+) ms\s+([\d.]+) ms$", out, re.M)
    )
    calls = {"scalars (+ grad norm)": 101, "histograms": 3, "images, first call": 1,
             "images": 2, "graph (once)": 1, "trace of 3 steps (once)": 1}  # fmt: skip
    assert table.keys() == calls.keys(), out
    assert table["trace of 3 steps (once)"][0] > 0.0012, out  # or this checks nothing
    shares = [float(m[1]) for m in re.finditer(r"^  ([\d.]+) s of ", out, re.M)]
    for which, share in zip((1, 0), shares, strict=True):  # all of the work, then the loop's
        expected = sum(table[name][which] * n for name, n in calls.items())
        assert share == pytest.approx(expected, abs=0.0012), out


def test_loop_cpu_worker_trains_the_job_and_times_its_loop(tmp_path: Path) -> None:
    spec = {
        "model": {"name": "mlp", "params": {"hidden": [8]}},
        "data": {"format": "synthetic", "params": {"shape": [4, 4], "classes": 2, "size": 64}},
        "towers": 2,
        "batch_size": 8,
        "steps": 12,
        "eval": {"every_steps": 0},
        "summaries": {"trace_steps": [], "histograms_every": 0, "images_every": 0},
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    run_bench("bench/loop_cpu_worker.py", "--job-dir", str(tmp_path))
    assert json.loads((tmp_path / "result.json").read_text())["outcome"] == "succeeded"
    loop = json.loads((tmp_path / "loop_cpu.json").read_text())
    # From this process's second step to its last: the first traces the step function.
    assert loop["steps"] == 11 and 0 < loop["seconds"] < 10, loop
    # Over the same span, steps 2 to 12: scalars are due at step 10 and at the last.
    parts = loop["parts"]
    assert parts["steps, scalars"]["calls"] == 2 and parts["steps, other"]["calls"] == 9, parts
    # The monitoring from the first step on: it writes every kind, and the graph once.
    assert parts["scalars written"]["calls"] == 3, parts
    assert parts["graph written"]["calls"] == 1, parts
    assert "steps, traced" not in parts and "histograms handed over" not in parts, parts
    assert all(0 < part["seconds"] < 10 for part in parts.values()), parts


def test_whole_workers_report_what_the_summaries_add_to_the_loop(capsys) -> None:
    # (examples/sec, loop CPU µs a step) per run: a batch of 100 at 1000 examples/sec is a
    # step of 100 ms with none; the defaults add 10 µs in both repeats.
    load("towers_bench").print_whole_workers(
        {
            "default summaries": [(900.0, 110.0), (1000.0, 130.0)],
            "no summaries": [(1000.0, 100.0), (1000.0, 120.0)],
        },
        batch=100,
    )
    out = capsys.readouterr().out
    assert re.search(r"^default / none +?= 0\.950 ", out, re.M), out
    assert re.search(
        r"^default adds to the loop +?= 10\.0 µs a step, 0\.0% of a step", out, re.M
    ), out
    assert re.search(r"^no summaries +110\.0 µs of loop CPU a step", out, re.M), out


def test_loop_parts_are_medians_over_runs_a_job_and_a_call(capsys) -> None:
    load("towers_bench").print_loop_parts(
        {
            "default summaries": [
                {"scalars written": {"calls": 100, "seconds": 0.01}},
                {"scalars written": {"calls": 100, "seconds": 0.03}},
                # A run that wrote none: 0 ms in its job, and no µs a call of its own.
                {},
            ],
        }
    )
    out = capsys.readouterr().out
    assert "where the loop's time went, default summaries (median of 3 runs):" in out, out
    assert re.search(
        r"^  scalars written +10\.0 ms a job +100 calls +200\.0 µs a call$", out, re.M
    ), out


def test_what_the_summaries_add_is_taken_within_each_run(capsys) -> None:
    # 1 ms an other step; a scalars step 1.5 ms, so 0.5 ms over one; 1 ms writing scalars;
    # 5 ms of reports, which a job with none makes too. 2 ms of the loop's 19.
    run = {
        "steps, other": {"calls": 10, "seconds": 0.010},
        "steps, scalars": {"calls": 2, "seconds": 0.003},
        "scalars written": {"calls": 2, "seconds": 0.001},
        "progress reported": {"calls": 1, "seconds": 0.005},
    }
    bench = load("towers_bench")
    added, share = bench.added_by_monitoring(run)
    assert added == pytest.approx(2.0) and share == pytest.approx(2 / 19)
    bench.print_loop_parts({"default summaries": [run], "no summaries": [{}]})
    out = capsys.readouterr().out
    assert re.search(
        r"^  adds 2\.0 ms a job to its loop, 10\.5% of the loop's time: throughput ratio 0\.895 ",
        out, re.M,
    ), out  # fmt: skip
    assert out.count("adds ") == 1, out  # none adds nothing to itself


def test_start_bench_runs_and_reports_the_ratio() -> None:
    out = run_bench("bench/start_bench.py", "--rounds", "1")
    assert "service / floor, median of 1 per-round ratios:" in out, out


def test_bucketing_bench_runs_and_reports_every_bucketing() -> None:
    out = run_bench("bench/bucketing_bench.py", "--rounds", "1", "--seconds", "0.2")
    for row in ("| control (np.sort) |", "| np.histogram |", "| histogram_buckets |"):
        assert row in out, out
    assert "16 tensors, 3,260,180 values" in out, out


def test_series_bench_runs_and_reports_every_figure() -> None:
    out = run_bench("bench/series_bench.py", "--steps", "40000", "--series", "2")
    for row in ("| chart of 2,000 points", "| chart of 600 points", "| storing every batch"):
        assert row in out, out


def test_tensorboard_load_bench_loads_every_kind_with_both_loaders() -> None:
    # The bench itself fails unless each loader serves every job's loss, and the last
    # job's histograms and images, to their last step within the deadline: so a logdir
    # it wrote that TensorBoard could not read, or read in part, fails here.
    out = run_bench(
        "bench/tensorboard_load_bench.py", "--jobs", "2", "--steps", "1000", "--rounds", "1",
        "--deadline", "120",
    )  # fmt: skip
    assert "2 jobs of 1000 steps" in out, out
    for what in ("up", "scalars", "all"):
        assert re.search(
            rf"^{what}: Python loader [\d.]+ s, Rust data server [\d.]+ s", out, re.M
        ), out


def fatbin(entries: list[tuple[int, int, bytes]]) -> bytes:
    """A fatbin container as nvcc lays one out: its 16-byte header, then each entry's
    64-byte header (kind, version, header size, payload size; the architecture at 28)
    and payload."""
    body = b""
    for kind, arch, payload in entries:
        header = bytearray(64)
        struct.pack_into("<HHIQ", header, 0, kind, 0x101, 64, len(payload))
        struct.pack_into("<I", header, 28, arch)
        body += bytes(header) + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


@pytest.mark.skipif(
    not (shutil.which("cc") and shutil.which("readelf")),
    reason="needs a C compiler and readelf to build a library with a .nv_fatbin section",
)
def test_gpu_pack_keeps_only_the_machine_code_of_the_architecture_asked_for(
    tmp_path: Path,
) -> None:
    pack = load("gpu_pack")
    sm90, sm80, ptx = b"\x90" * 96, b"\x80" * 64, b"P" * 32
    # Two containers, 8 bytes of padding between them, as in TensorFlow's libraries.
    blob = fatbin([(2, 80, sm80), (1, 90, ptx), (2, 90, sm90)]) + bytes(8) + fatbin([(2, 90, sm90)])
    source = tmp_path / "lib.c"
    source.write_text(
        '__attribute__((section(".nv_fatbin"), used)) const unsigned char blob[] = {'
        + ",".join(str(b) for b in blob)
        + "};\n"
    )
    lib = tmp_path / "libfake.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    offset, size = pack.section(lib, ".nv_fatbin")
    assert lib.read_bytes()[offset : offset + size] == blob

    assert pack.keep_only_arch(lib, 90) == len(sm80) + len(ptx)
    data = lib.read_bytes()[offset : offset + size]
    found = [(k, a, data[o - offset : o - offset + n]) for k, a, o, n in
             pack.fatbin_entries(lib.read_bytes(), offset, offset + size)]  # fmt: skip
    assert found == [
        (2, 80, bytes(len(sm80))),
        (1, 90, bytes(len(ptx))),
        (2, 90, sm90),
        (2, 90, sm90),
    ]
    # Nothing but the payloads changed: the headers still describe every entry.
    assert len(data) == len(blob) and data.count(b"\x90") == 2 * len(sm90)
    # A library without GPU code is left as it was.
    plain = tmp_path / "libplain.so"
    (tmp_path / "plain.c").write_text("int f(void) { return 1; }\n")
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(plain), str(tmp_path / "plain.c")], check=True
    )
    before = plain.read_bytes()
    assert pack.keep_only_arch(plain, 90) == 0 and plain.read_bytes() == before


def test_scale_bench_runs_and_reports_every_figure() -> None:
    out = run_bench(
        "bench/scale_bench.py", "--jobs", "60", "--queued", "10", "--steps", "4000"
    )  # fmt: skip
    for row in ("| newest 50 |", "| name=nomatch |", "| supervisor pass |",
                "| read on after its last 100 steps |", "| first batch of a run resumed"):  # fmt: skip
        assert row in out, out


def test_input_bench_times_every_set_and_augmentation_beside_the_step() -> None:
    # One round of 2 batches of 32, and this checkout's own trainer/data.py as the baseline:
    # this checks that every part runs and reports, not the numbers.
    out = run_bench(
        "bench/input_bench.py", "--rounds", "1", "--batches", "2", "--warmup", "1", "--steps",
        "1", "--batch", "32", "--examples", "256", "--baseline", "trainer/data.py",
    )  # fmt: skip
    sets = ["synthetic 32x32x3 float", "npz 32x32x3 uint8", "TFRecord 32x32x3 uint8"]
    if "MNIST idx: left out, not found at" not in out:
        sets.insert(0, "MNIST idx 28x28x1")
    augmentations = ["none", "flip_left_right", "random_crop_padding 4", "brightness 0.2",
                     "contrast 0.2", "all"]  # fmt: skip
    for shape in ("28x28x1", "32x32x3") if "MNIST idx 28x28x1" in sets else ("32x32x3",):
        assert re.search(rf"^\| towers step {shape} \| [1-9]\d* \|", out, re.M), out
    rows = re.findall(
        r"^\| (.+?) \| (.+?) \| ([\d.]+) \| ([\d.]+) \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$", out, re.M
    )
    assert [(name, augment) for name, augment, *_ in rows] == [
        (name, augment) for name in sets for augment in augmentations
    ], out
    assert all(float(rate) > 0 and float(per_cpu) > 0 for *_, rate, per_cpu in rows), out
    against = re.findall(r"^\| (.+?) \| (.+?) \| [1-9]\d* \| [1-9]\d* \| [\d.]+ \|$", out, re.M)
    assert against == [(name, augment) for name, augment, *_ in rows], out


def test_checkpoint_race_counts_what_a_download_would_get_wrong() -> None:
    # A real race, for two seconds: TensorFlow saving back to back with keep 1 while the
    # listing reads. Before the listing read again and checked the index, about 1 read in
    # 20,000 was empty and 1 in 3,000 torn; since, none in over 150,000 (the commits).
    out = run_bench("bench/checkpoint_race.py", "--seconds", "2", "--variables", "2")
    counts = re.fullmatch(
        r"keep 1, (\d+) saves in 2 s: reads (\d+), empty (\d+), gone (\d+), torn (\d+)\n", out
    )
    assert counts is not None, out
    saves, reads, empty, _, torn = map(int, counts.groups())
    assert saves > 1 and reads > 100, out  # it raced
    assert (empty, torn) == (0, 0), out
