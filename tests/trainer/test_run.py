"""`python -m trainer run` as the service runs it: real worker processes, real run dirs."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator

from tests.service.harness import wait_catching_sigterm
from tests.trainer.beside import start_beside
from tests.trainer.progress_lines import progress_lines
from tests.trainer.test_data import write_tib_headers
from trainer.profiling import tower_times_ms, trace_op_names

REPO = Path(__file__).resolve().parents[2]

TINY = {
    "name": "tiny",
    "model": {"name": "mlp", "params": {"hidden": [32], "dropout": 0.2}},
    "data": {"format": "synthetic", "params": {"shape": [8, 8], "classes": 4, "size": 512}},
    "towers": 2,
    "batch_size": 32,
    "steps": 40,
    "eval": {"every_steps": 20, "batches": 2},
    "summaries": {
        "scalars_every": 5,
        "histograms_every": 20,
        "images_every": 20,
        "trace_steps": [6, 7],
    },
    "checkpoint": {"every_steps": 20, "every_seconds": 0, "keep": 3},
}


def with_(base: dict, **changes) -> dict:
    spec = json.loads(json.dumps(base))
    spec.update(changes)
    return spec


def start_worker(
    job_dir: Path, spec: dict | None = None, spec_file: Path | None = None, env=None
) -> subprocess.Popen:
    job_dir.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "trainer", "run", "--job-dir", str(job_dir)]
    if spec is not None:
        (job_dir / "spec.json").write_text(json.dumps(spec))
    if spec_file is not None:
        args += ["--spec", str(spec_file)]
    return subprocess.Popen(
        args,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_worker(job_dir: Path, spec: dict | None = None, **kw) -> tuple[int, dict, str]:
    proc = start_worker(job_dir, spec, **kw)
    log, _ = proc.communicate(timeout=300)
    return proc.returncode, json.loads((job_dir / "result.json").read_text()), log


def ended_preparing(job_dir: Path) -> list[str]:
    """`stages_reached` of a job refused while preparing, whose folder holds only what such
    a job writes: its spec, the preparation's lines and its result."""
    assert sorted(p.name for p in job_dir.iterdir()) == [
        "progress.jsonl",
        "result.json",
        "spec.json",
    ]
    return stages_reached(job_dir)


def stages_reached(job_dir: Path) -> list[str]:
    """The stages of a job that ended while preparing, in the order its progress.jsonl
    names them: it holds nothing else (no `start`, nothing trained)."""
    lines = progress_lines(job_dir / "progress.jsonl")
    assert all(line["event"] == "phase" and line["phase"] == "preparing" for line in lines)
    return list(dict.fromkeys(line["stage"] for line in lines))


# The stages a worker of a job on synthetic data goes through before its `start` line.
STAGES = ["importing TensorFlow", "loading data", "building the model"]


def tags_by_plugin(logdir: Path) -> dict[str, set[str]]:
    acc = event_accumulator.EventAccumulator(
        str(logdir), size_guidance={event_accumulator.TENSORS: 0}
    )
    acc.Reload()
    found: dict[str, set[str]] = {}
    for tag in acc.Tags()["tensors"]:
        plugin = acc.SummaryMetadata(tag).plugin_data.plugin_name
        found.setdefault(plugin, set()).add(tag)
    if acc.Tags()["graph"]:
        found["graph"] = {"train_step"}
    return found


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[Path, int, dict]:
    job_dir = tmp_path_factory.mktemp("tiny")
    temp = tmp_path_factory.mktemp("tiny-tmpdir")  # see what the worker leaves in /tmp
    code, result, log = run_worker(job_dir, TINY, env={"TMPDIR": str(temp)})
    assert code == 0, log
    (job_dir / "worker.log").write_text(log)  # where the service keeps it
    (job_dir.parent / "tiny-tmpdir-left.txt").write_text("\n".join(p.name for p in temp.iterdir()))
    return job_dir, code, result


def test_run_job_succeeds_and_writes_run_dir(tiny_run):
    job_dir, _, result = tiny_run
    assert result["outcome"] == "succeeded" and result["step"] == 40 and result["total"] == 40
    assert result["checkpoint"] == "checkpoints/ckpt-40" and result["export"] == "export"
    assert 0.0 <= result["eval"]["accuracy"] <= 1.0
    # eval.batches 2 of 32 read 64 of the 102 held-out examples: said, not left to guess.
    assert result["eval"]["examples"] == 64
    assert result["eval"]["step"] == 40  # the final eval's (a stop in it leaves an earlier)
    # Rounded as its eval line, the API's eval series' last point (2.2160538148239564 was
    # the result's where the line said 2.21605).
    lines = [json.loads(line) for line in (job_dir / "progress.jsonl").read_text().splitlines()]
    last_eval = [line for line in lines if line["event"] == "eval"][-1]
    assert last_eval["step"] == 40
    assert (result["eval"]["loss"], result["eval"]["accuracy"]) == (
        last_eval["eval_loss"],
        last_eval["eval_accuracy"],
    )
    log = (job_dir / "worker.log").read_text()
    assert "eval: each eval reads the first 64 of the 102 eval examples (eval.batches 2 of " in log
    assert "batch_size 32); give eval.batches 4 to read them all" in log
    assert sorted(p.name for p in (job_dir / "checkpoints").glob("*.index")) == [
        "ckpt-20.index",
        "ckpt-40.index",
    ]
    assert (job_dir / "export" / "saved_model.pb").exists()
    restored = tf.saved_model.load(str(job_dir / "export"))
    logits = restored.serve(tf.zeros([3, 8, 8, 1]))
    assert logits.shape == (3, 4)


def test_run_job_leaves_nothing_in_the_temp_folder(tiny_run):
    # Autograph writes each converted function to a temp file and deletes it at exit, but
    # the worker skips the interpreter's exit: every job left 17 or more files in /tmp,
    # 54,000 of them on a day of tests.
    job_dir, _, _ = tiny_run
    assert (job_dir.parent / "tiny-tmpdir-left.txt").read_text() == ""


def test_run_job_log_has_no_line_per_checkpoint_save(tiny_run):
    # TensorFlow's "Sharding callback duration: N microseconds", at INFO on every save,
    # filled worker.log and every one of the 30 lines a failed job keeps as its log tail.
    job_dir, _, _ = tiny_run
    log = (job_dir / "worker.log").read_text()
    assert "succeeded (exit 0)" in log and "Sharding callback duration" not in log


def test_run_job_log_explains_the_cuda_probe_on_a_cpu_host(tiny_run):
    # A CUDA build of TensorFlow logs `E ... failed call to cuInit` on every host without a
    # driver; the worker says after it that this is the expected probe and where it trains.
    job_dir, _, _ = tiny_run
    log = (job_dir / "worker.log").read_text()
    said = log.index("no GPU visible: training on the CPU")
    assert "is TensorFlow's probe for a CUDA driver, expected here" in log[said:]
    if "failed call to cuInit" in log:
        assert log.index("failed call to cuInit") < said


def test_run_job_reports_progress(tiny_run):
    job_dir, _, _ = tiny_run
    events = progress_lines(job_dir / "progress.jsonl")
    # Its preparation first, a line a stage (synthetic data says no amounts), then `start`.
    preparing = events[: len(STAGES)]
    assert [(e["event"], e["phase"], e["stage"]) for e in preparing] == [
        ("phase", "preparing", stage) for stage in STAGES
    ]
    assert not any("stage_done" in e for e in preparing)
    events = events[len(STAGES) :]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end"
    assert events[-1]["phase"] == "done"  # it trained every step
    assert not any("stage" in e for e in events)
    assert {"progress", "eval", "checkpoint", "trace"} <= set(kinds)
    # What it trains on, in its start line (it was in its log alone): 512 examples, a fifth
    # held out.
    assert events[0]["data"] == {
        "train_examples": 410,
        "eval_examples": 102,
        "classes": 4,
        "image_shape": [8, 8, 1],
    }
    last = [e for e in events if e["event"] == "progress"][-1]
    assert last["step"] == 40 and last["total"] == 40
    assert set(last) >= {
        "loss",
        "accuracy",
        "examples_per_sec",
        "eta_seconds",
        "learning_rate",
        "phase",
        "tower_ms",
    }
    # The end line carries the last step's numbers as its progress line does, rounded
    # alike: they are the API's series' last point (it showed 0.10326767712831497).
    end = events[-1]
    assert (end["step"], end["loss"], end["accuracy"]) == (40, last["loss"], last["accuracy"])
    checkpoints = [e["checkpoint"] for e in events if e["event"] == "checkpoint"]
    assert checkpoints == ["checkpoints/ckpt-20", "checkpoints/ckpt-40"]
    # The phase is what the worker does now: a save says so as it begins, and its line
    # (and an eval's) says training again once it is done, until the job's last step.
    for kind in ("checkpoint", "eval"):
        assert [(e["step"], e["phase"]) for e in events if e["event"] == kind] == [
            (20, "training"),
            (40, kind),
        ], kind
    saving = [e["step"] for e in events if e["event"] == "phase" and e["phase"] == "checkpoint"]
    assert saving == [20, 40]
    # Each eval (steps 20 and 40) says first how many batches it has: TINY asks for 2.
    starts = [
        e for e in events if e["event"] == "phase" and e["phase"] == "eval" and e["phase_done"] == 0
    ]
    assert [(e["step"], e["phase_total"]) for e in starts] == [(20, 2), (40, 2)]


def test_run_job_short_job_reports_enough_points_for_a_chart(tmp_path):
    # 5,000 steps of a tiny model train in a few seconds: a report every 2 s alone would
    # chart two or three points.
    spec = with_(TINY, towers=1, steps=5000, eval={"every_steps": 0, "batches": 1},
                 summaries={"trace_steps": [], "histograms_every": 0, "images_every": 0},
                 checkpoint={"every_steps": 0, "every_seconds": 0, "keep": 1})  # fmt: skip
    code, _, log = run_worker(tmp_path / "job", spec)
    assert code == 0, log
    events = progress_lines(tmp_path / "job" / "progress.jsonl")
    reports = [e for e in events if e["event"] == "progress"]
    # The first step always, however quickly its step function was traced: the charts
    # start at the job's initial loss, not a fiftieth of the job in.
    assert reports[0]["step"] == 1, reports[0]
    assert reports[0]["examples_per_sec"] is None  # it traced the step function
    # At every 50th step (a hundredth of the job), at most 4 a second; another step only
    # for the report that is due every 2 s anyway (steps slowed down by a busy machine).
    pairs = zip([None, *reports], reports, strict=False)
    off_grid = [(a, b) for a, b in pairs if b["step"] % 50]
    assert all(a is None or b["time"] - a["time"] >= 1.9 for a, b in off_grid), [
        e["step"] for e in reports
    ]
    gaps = [b["time"] - a["time"] for a, b in zip(reports, reports[1:], strict=False)]
    assert all(gap >= 0.24 for gap in gaps[:-1]), gaps  # the last is the final step's
    trained = reports[-1]["time"] - reports[0]["time"]
    assert len(reports) >= min(100, int(trained / 0.75)) >= 2, (len(reports), trained)


def test_run_job_writes_every_summary_kind(tiny_run):
    job_dir, _, _ = tiny_run
    train = tags_by_plugin(job_dir / "tb" / "train")
    assert train["scalars"] >= {
        "loss", "accuracy", "learning_rate", "grad_norm", "examples_per_sec", "step_time_ms",
        "tower_0/loss", "tower_1/loss", "tower_0/compute_ms", "tower_1/compute_ms",
        "zero_fraction/dense",
    }  # fmt: skip
    # No `tower_i/memory_mb` of towers on CPUs, whose counters miss a small model's tensors.
    assert not {tag for tag in train["scalars"] if tag.endswith("/memory_mb")}
    assert train["histograms"] == {
        f"{kind}/{layer}/{var}"
        for kind in ("weights", "gradients")
        for layer in ("dense", "logits")
        for var in ("kernel", "bias")
    } | {"activations/dense", "activations/logits"}
    assert train["images"] == {"tower_0/inputs", "tower_1/inputs"}
    assert "graph" in train
    assert tags_by_plugin(job_dir / "tb" / "eval")["scalars"] == {"loss", "accuracy"}


def test_run_job_charts_tower_0s_activations(tiny_run):
    # The outputs of the hidden ReLU layer and the logits, for tower 0's 16 examples of the
    # global 32 (at most `activations.EXAMPLES`), at each histograms step.
    job_dir, _, _ = tiny_run
    acc = event_accumulator.EventAccumulator(
        str(job_dir / "tb" / "train"), size_guidance={"tensors": 0}
    )
    acc.Reload()
    for tag, values in (("activations/dense", 16 * 32), ("activations/logits", 16 * 4)):
        events = acc.Tensors(tag)
        assert [e.step for e in events] == [1, 20, 40], tag  # the first step, and by cadence
        for event in events:
            buckets = tf.make_ndarray(event.tensor_proto)
            assert buckets[:, 2].sum() == values, (tag, event.step)
            if tag == "activations/dense":
                assert buckets[0, 0] >= 0.0, buckets[0]  # a ReLU's: none below 0
            else:
                assert buckets[0, 0] < 0.0 < buckets[-1, 1], buckets  # logits of both signs
    description = acc.SummaryMetadata("activations/dense").summary_description
    assert description.startswith("Outputs of layer `dense` for tower 0's first examples"), (
        description
    )
    # The ReLU's units at 0, beside its histogram; the logits, no rectifier, have none.
    zeros = acc.Tensors("zero_fraction/dense")
    assert [e.step for e in zeros] == [1, 20, 40]
    assert all(0 < tf.make_ndarray(e.tensor_proto) < 1 for e in zeros), zeros
    assert "zero_fraction/logits" not in acc.Tags()["tensors"]


def test_run_job_without_activations_charts_weights_and_gradients_alone(tmp_path):
    spec = with_(
        TINY,
        steps=10,
        eval={"every_steps": 0},
        summaries={
            "histograms_every": 5,
            "images_every": 0,
            "trace_steps": [],
            "activations": False,
        },
    )
    code, _, log = run_worker(tmp_path, spec)
    assert code == 0, log
    histograms = tags_by_plugin(tmp_path / "tb" / "train")["histograms"]
    assert {tag.partition("/")[0] for tag in histograms} == {"weights", "gradients"}


def test_run_job_step_time_is_the_steps_alone(tiny_run):
    # step_time_ms leaves out the first step's tracing (seconds) and the evals, summaries and
    # checkpoints between steps. Counted in, the step-5 point was ~100x a usual step; a
    # noisy machine moves points by a few times at most.
    job_dir, _, _ = tiny_run
    acc = event_accumulator.EventAccumulator(
        str(job_dir / "tb" / "train"), size_guidance={"tensors": 0}
    )
    acc.Reload()
    times = {e.step: float(tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors("step_time_ms")}
    assert sorted(times) == list(range(5, 41, 5))
    assert max(times.values()) < 20 * float(np.median(list(times.values()))), times
    # Examples are counted, not assumed: TINY trains on 410 examples, 13 batches an epoch
    # whose last (steps 13, 26, 39) holds 26. Step 1 (tracing) is left out of the times.
    rates = {
        e.step: float(tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors("examples_per_sec")
    }
    for s in times:
        timed = [t for t in range(s - 4, s + 1) if t > 1]
        examples = sum(26 if t % 13 == 0 else 32 for t in timed)
        assert rates[s] == pytest.approx(examples * 1000 / (len(timed) * times[s]), rel=1e-4), s


def test_run_job_traces_each_tower(tiny_run):
    job_dir, _, _ = tiny_run
    traces = list((job_dir / "tb" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1
    names = trace_op_names(traces[0])
    assert any(n.startswith("tower_0/") for n in names) and any(
        n.startswith("tower_1/") for n in names
    )
    # The compute time the job reported is the one the trace holds (2 traced steps).
    [line] = [e for e in progress_lines(job_dir / "progress.jsonl") if e["event"] == "trace"]
    reported = line["tower_ms"]
    assert "requested" not in line  # the spec's trace_steps: no request answered
    assert reported == tower_times_ms(traces[0], towers=2, steps=range(6, 8))
    assert traces[0].parent.name.endswith("_steps_6-7")
    assert line["step"] == 7 and line["trace_dir"] == f"tb/plugins/profile/{traces[0].parent.name}"
    assert all(ms > 0 for ms in reported)


@pytest.mark.parametrize("left", [b"", b"\x00" * 4096], ids=["clean", "nul-run"])
def test_restart_at_the_final_checkpoint_keeps_the_train_metrics(tiny_run, tmp_path, left):
    # A worker that dies while exporting is restarted by the service: it restores the final
    # checkpoint, trains no step, and must still report what the run trained to. Its host
    # may have crashed with it, leaving a run of NULs at the end of progress.jsonl: the
    # read of the last report failed on them (UnicodeDecodeError, exit 1).
    job_dir, _, first = tiny_run
    again = tmp_path / "again"
    shutil.copytree(job_dir, again)
    (again / "result.json").unlink()
    shutil.rmtree(again / "export")
    with open(again / "progress.jsonl", "ab") as f:
        f.write(left)
    code, result, log = run_worker(again)
    assert code == 0, log
    assert result["outcome"] == "succeeded" and result["step"] == 40
    assert result["metrics"]["loss"] == pytest.approx(first["metrics"]["loss"], abs=1e-6)
    assert result["metrics"]["accuracy"] == pytest.approx(first["metrics"]["accuracy"], abs=1e-6)
    assert result["metrics"]["examples_per_sec"] == pytest.approx(
        first["metrics"]["examples_per_sec"], abs=0.01
    )
    assert (again / "export" / "saved_model.pb").exists()


def test_rerun_with_a_different_model_says_the_checkpoint_does_not_fit(tiny_run, tmp_path):
    # The same job dir run again with a changed spec: the restore fails; the message must
    # say why in the job's terms, not only TensorFlow's variable shapes.
    job_dir, _, _ = tiny_run
    again = tmp_path / "again"
    shutil.copytree(job_dir, again)
    spec = json.loads((again / "spec.json").read_text())
    spec["model"]["params"]["hidden"] = [64]
    (again / "spec.json").write_text(json.dumps(spec))
    code, result, log = run_worker(again)
    assert code == 1, log
    assert result["outcome"] == "failed"
    assert result["message"].startswith(
        "CheckpointMismatch: Cannot resume from checkpoints/ckpt-40: it does not fit this job's model or optimizer"
    ), result["message"]


def test_rerun_with_ema_added_says_what_does_not_fit_without_the_weights_values(tiny_run, tmp_path):
    # TensorFlow's message lists each unmatched variable with its whole value: the job's
    # one-line message held thousands of numbers.
    job_dir, _, _ = tiny_run
    again = tmp_path / "again"
    shutil.copytree(job_dir, again)
    spec = json.loads((again / "spec.json").read_text())
    spec["ema_decay"] = 0.99
    spec["steps"] = 60
    (again / "spec.json").write_text(json.dumps(spec))
    code, result, log = run_worker(again)
    assert code == 1, log
    message = result["message"]
    assert message.startswith("CheckpointMismatch: Cannot resume from checkpoints/ckpt-40: "), (
        message
    )
    assert "numpy=" not in message and len(message) < 1500, message
    assert "ema" in message  # still names what did not match


def test_resume_after_sigterm_equals_uninterrupted(tmp_path):
    # The SIGTERM lands right after step 100's checkpoint, a few steps past it: 600 steps
    # leave hundreds after it, as 1500 did, with 900 fewer for the whole and resumed runs.
    steps = 600
    spec = with_(
        TINY,
        steps=steps,
        deterministic=True,
        summaries={
            "scalars_every": 50,
            "histograms_every": 0,
            "images_every": 0,
            "trace_steps": [],
        },
        eval={"every_steps": 0, "batches": 1},
        checkpoint={"every_steps": 100, "every_seconds": 0, "keep": 2},
    )
    # The uninterrupted run trains meanwhile, in a process of its own: the two runs are
    # independent, and one after the other left a core idle through each start-up.
    with ThreadPoolExecutor(1) as pool:
        whole_run = pool.submit(run_worker, tmp_path / "whole", spec)
        interrupted = tmp_path / "interrupted"
        proc = start_worker(interrupted, spec)
        deadline = time.monotonic() + 120
        while not (interrupted / "checkpoints" / "ckpt-100.index").exists():
            assert proc.poll() is None and time.monotonic() < deadline, (
                "worker ended before its first checkpoint"
            )
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        log, _ = proc.communicate(timeout=120)
        code, whole, whole_log = whole_run.result()
    assert code == 0, whole_log
    stopped = json.loads((interrupted / "result.json").read_text())
    assert proc.returncode == 3, log
    assert stopped["outcome"] == "cancelled"
    assert 100 <= stopped["step"] < steps, (
        "SIGTERM must land mid-run for this test to mean anything"
    )
    assert stopped["checkpoint"] == f"checkpoints/ckpt-{stopped['step']}"
    # Its end line has the numbers of the step it stopped at, as its result has them (its
    # last report was of an earlier step).
    end = progress_lines(interrupted / "progress.jsonl")[-1]
    assert end["event"] == "end" and end["step"] == stopped["step"]
    # Its phase says it stopped short of its total: not "done".
    assert (end["outcome"], end["phase"]) == ("cancelled", "stopped")
    assert end["loss"] == stopped["metrics"]["loss"]
    assert end["accuracy"] == stopped["metrics"]["accuracy"]
    # The log ends saying so too, not on whatever TensorFlow printed last.
    assert (
        log.rstrip()
        .splitlines()[-1]
        .endswith(
            f"INFO trainer: cancelled (exit 3): Stopped by SIGTERM at step {stopped['step']}, "
            "after a checkpoint."
        )
    ), log[-2000:]

    code, resumed, log = run_worker(interrupted)
    assert code == 0, log
    assert resumed["step"] == steps
    names = assert_same_checkpoints(
        tmp_path / "whole", interrupted, steps, ("model/", "seed_states/", "optimizer/")
    )
    assert any(n.startswith("seed_states/") for n in names)
    assert resumed["metrics"]["loss"] == whole["metrics"]["loss"]


def assert_same_checkpoints(a: Path, b: Path, step: int, prefixes: tuple[str, ...]) -> list[str]:
    """Assert that job dirs `a` and `b` hold the same values, bit for bit, in every
    variable of their checkpoints of `step` under `prefixes`; return the names compared."""
    first = tf.train.load_checkpoint(str(a / "checkpoints" / f"ckpt-{step}"))
    second = tf.train.load_checkpoint(str(b / "checkpoints" / f"ckpt-{step}"))
    names = sorted(n for n in first.get_variable_to_shape_map() if n.startswith(prefixes))
    assert names == sorted(n for n in second.get_variable_to_shape_map() if n.startswith(prefixes))
    for name in names:
        np.testing.assert_array_equal(first.get_tensor(name), second.get_tensor(name), name)
    return names


def scalar_series(job_dir: Path, run: str) -> dict[str, list[tuple[int, float]]]:
    """Each scalar's (step, value) points in `tb/<run>` as the service's TensorBoard loads
    them (a later process's steps replace an earlier one's); timings left out."""
    loaded = plugin_event_accumulator.EventAccumulator(
        str(job_dir / "tb" / run), size_guidance={plugin_event_accumulator.TENSORS: 0}
    )
    loaded.Reload()
    return {
        tag: [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in loaded.Tensors(tag)]
        for tag in loaded.Tags()["tensors"]
        if loaded.SummaryMetadata(tag).plugin_data.plugin_name == "scalars"
        and not tag.endswith(("step_time_ms", "examples_per_sec"))
    }


# Every option with state of its own that a resume must carry on, at once: momentum's
# slots, the EMA's shadows (which the evals between read), batch norm's moving statistics
# averaged over 3 towers of a batch (31) that does not divide by them, the augmentations
# (drawn by the batch's place), a warm-up into a staircase decay, clipping, weight decay.
# 120 training examples: epochs of 4 steps, the last of 27 examples.
EVERY_OPTION = with_(
    TINY,
    towers=3,
    batch_size=31,
    steps=26,
    seed=3,
    deterministic=True,
    model={"name": "resnet", "params": {"width": 4, "blocks_per_stage": [1, 1]}},
    data={
        "format": "synthetic",
        "params": {"shape": [8, 8, 3], "classes": 5, "size": 150},
        "augment": {
            "flip_left_right": True,
            "random_crop_padding": 2,
            "brightness": 0.2,
            "contrast": 0.3,
        },
    },
    optimizer={
        "name": "momentum",
        "learning_rate": 0.02,
        "warmup_steps": 3,
        "schedule": {
            "name": "exponential_decay",
            "decay_steps": 7,
            "decay_rate": 0.9,
            "staircase": True,
        },
    },
    ema_decay=0.9,
    clip_norm=1.0,
    weight_decay=1e-3,
    eval={"every_steps": 5, "batches": 1},
    summaries={"scalars_every": 1, "histograms_every": 0, "images_every": 0, "trace_steps": []},
    checkpoint={"every_steps": 10, "every_seconds": 0, "keep": 2},
)


def test_trained_longer_equals_trained_at_once_with_every_option(tmp_path):
    # As `towerboard resume ID --steps N` trains a job on: its spec.json's total raised and
    # the worker started again, from the checkpoint the first run ended with, at step 13,
    # one step into an epoch. That run's end (a final eval, its last scalars, an export)
    # must leave nothing that the run trained at once does not have.
    steps, stop = EVERY_OPTION["steps"], 13
    with ThreadPoolExecutor(1) as pool:
        whole_run = pool.submit(run_worker, tmp_path / "whole", EVERY_OPTION)
        code, _, log = run_worker(tmp_path / "longer", with_(EVERY_OPTION, steps=stop))
        assert code == 0, log
        code, whole, whole_log = whole_run.result()
    assert code == 0, whole_log
    code, longer, log = run_worker(tmp_path / "longer", EVERY_OPTION)
    assert code == 0 and f"resumed from step {stop}" in log, log
    names = assert_same_checkpoints(
        tmp_path / "whole", tmp_path / "longer", steps, ("model/", "optimizer/", "ema/", "step/")
    )
    assert any(n.startswith("ema/") for n in names) and any("moving_mean" in n for n in names)
    assert longer["eval"] == whole["eval"]
    # Each step charted once, with the same loss, rate and norm; the evals (of the EMA's
    # weights) the same, and the first run's own at its end, step 13, besides.
    train = scalar_series(tmp_path / "whole", "train")
    assert [step for step, _ in train["loss"]] == list(range(1, steps + 1))
    assert scalar_series(tmp_path / "longer", "train") == train
    evals, longer_evals = (scalar_series(tmp_path / d, "eval") for d in ("whole", "longer"))
    assert {
        tag: [p for p in points if p[0] != stop] for tag, points in longer_evals.items()
    } == evals


def test_checkpoints_by_time_alone(tmp_path):
    # One tower and no evals (TINY's, every 20 steps, were 100 evals): the saves by time
    # are what is checked, and 2000 steps still take seconds to train.
    spec = with_(
        TINY,
        towers=1,
        steps=2000,
        eval={"every_steps": 0, "batches": 1},
        summaries={"scalars_every": 0, "histograms_every": 0, "images_every": 0, "trace_steps": []},
        checkpoint={"every_steps": 0, "every_seconds": 1, "keep": 100},
    )
    code, result, log = run_worker(tmp_path, spec)
    assert code == 0, log
    saved = sorted(int(p.name[5:-6]) for p in (tmp_path / "checkpoints").glob("ckpt-*.index"))
    assert saved[-1] == 2000
    assert len(saved) >= 2, f"a run of {result['metrics']} saved only at its end: {saved}"


def test_sigterm_while_the_worker_starts_up_exits_3_with_a_result(tmp_path):
    # A cancel or a service shutdown can land in the seconds a worker spends importing
    # TensorFlow, loading data and building the model, before its first step. It must
    # still end with exit 3 after a checkpoint, not die by the signal with no result.json
    # (which the service takes for a crash and restarts).
    (tmp_path / "slowbuild.py").write_text(
        "import pathlib, time, keras\n"
        "def build(input_shape, num_classes, marker):\n"
        "    pathlib.Path(marker).touch()\n"
        "    time.sleep(2)\n"
        "    inputs = keras.Input(input_shape)\n"
        "    return keras.Model(inputs, keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs)))\n"
    )
    marker = tmp_path / "building"
    spec = with_(TINY, model={"name": "slowbuild:build", "params": {"marker": str(marker)}})
    job_dir = tmp_path / "job"
    proc = start_worker(job_dir, spec, env={"PYTHONPATH": f"{tmp_path}:{REPO}"})
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, (
            "worker ended before building its model"
        )
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, log
    result = json.loads((job_dir / "result.json").read_text())
    assert result["outcome"] == "cancelled" and result["step"] == 0
    assert result["checkpoint"] == "checkpoints/ckpt-0"
    assert (job_dir / "checkpoints" / "ckpt-0.index").exists()


def test_sigterm_while_tensorflow_is_imported_exits_3_with_a_result(tmp_path):
    # The earliest window: the handler was set only once trainer.run had been imported
    # (about the first 0.3 s), so a cancel then killed the worker with no result.json.
    # Sent as soon as the handler is set: TensorFlow's import, seconds, has not ended.
    job_dir = tmp_path / "job"
    proc = start_worker(job_dir, TINY)
    wait_catching_sigterm(lambda: [proc.pid])
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, log
    result = json.loads((job_dir / "result.json").read_text())
    assert result["outcome"] == "cancelled" and result["step"] == 0, result


def test_sigterm_during_a_long_eval_stops_without_finishing_it(tmp_path):
    # An eval of 10,000 batches (~20 s here) that a cancel lands in: the worker must drop it
    # and checkpoint, not finish it first (the service SIGKILLs after its grace period).
    spec = with_(
        TINY,
        data={
            "format": "synthetic",
            "eval_fraction": 0.9,
            "params": {"shape": [8, 8], "classes": 4, "size": 400_000},
        },
        steps=1000,
        eval={"every_steps": 5, "batches": 10_000},
        summaries={"scalars_every": 0, "histograms_every": 0, "images_every": 0, "trace_steps": []},
    )
    job_dir = tmp_path / "job"
    proc = start_worker(job_dir, spec)
    deadline = time.monotonic() + 120

    def eval_reports() -> list[dict]:
        return [
            e
            for e in progress_lines(job_dir / "progress.jsonl")
            if e["event"] == "phase" and e["phase"] == "eval"
        ]

    # The eval reports how far it is every 2 s: wait for a report from inside it.
    while not any(e["phase_done"] > 0 for e in eval_reports()):
        assert proc.poll() is None and time.monotonic() < deadline, (
            "worker ended before reporting an eval's progress"
        )
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    log, _ = proc.communicate(timeout=120)
    events = progress_lines(job_dir / "progress.jsonl")
    assert proc.returncode == 3, log
    assert json.loads((job_dir / "result.json").read_text())["step"] == 5
    assert not [e for e in events if e["event"] == "eval"], "the eval ran to its end"
    reports = eval_reports()
    assert reports[0]["phase_done"] == 0 and all(
        e["phase_total"] == 10_000 and e["step"] == 5 for e in reports
    )
    assert reports[-1]["phase_done"] < 10_000
    assert [e["checkpoint"] for e in events if e["event"] == "checkpoint"] == ["checkpoints/ckpt-5"]


BAD_SPECS: dict[str, tuple[str | bytes | None, str]] = {
    "not_json": ("{not json", "is not valid JSON"),
    # Exit 1 with a traceback until JSON's other errors were caught: a RecursionError and
    # a ValueError (Python's limit on the digits of an int).
    "nested_too_deep": ("[" * 100_000, "is not valid JSON"),
    "number_too_long": ('{"steps": ' + "1" * 5000 + "}", "is not valid JSON"),
    # Exit 1 ("failed") with a UnicodeDecodeError, or an IsADirectoryError, until these.
    "not_utf8": (b'{"name": "caf\xe9", "data": {"format": "synthetic"}}', "is not UTF-8 text"),
    "a_folder": (None, "Cannot read the spec file"),
    # One of the two values would be lost (Python's json keeps the last).
    "duplicate_key": (
        '{"data": {"format": "synthetic"}, "steps": 5, "steps": 7}',
        ": Duplicate key `steps`: given at line 1 column 35 and again at line 1 column 47; "
        "give each key once, as only one of its values would be kept",
    ),
    "duplicate_nested_key": (
        '{"data": {"format": "synthetic",\n  "params": {"size": 64},\n  "params": {"size": 8}}}',
        ": Duplicate key `data.params`: given at line 2 column 3 and again at line 3 column 3",
    ),
    "unknown_key": (
        json.dumps(with_(TINY, tower=2)),
        "tower: Unknown key. Did you mean `towers`?",
    ),
    "unknown_model": (
        json.dumps(with_(TINY, model={"name": "transformer"})),
        "model.name: Expected one of mlp, cnn, resnet, logistic or 'module:function'. Received: 'transformer'",
    ),
    "missing_data_path": (
        json.dumps(with_(TINY, data={"format": "idx", "path": "/nonexistent/mnist"})),
        "/nonexistent/mnist",
    ),
    "option_its_optimizer_ignores": (
        json.dumps(with_(TINY, optimizer={"name": "sgd", "momentum": 0.9})),
        "optimizer.momentum: Expected no `momentum` with optimizer 'sgd', which does not use it",
    ),
    "custom_model_not_importable": (
        json.dumps(with_(TINY, model={"name": "no_such_module:build"})),
        "Cannot import module 'no_such_module' of model 'no_such_module:build'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_run_job_bad_spec_exits_2(tmp_path, case):
    text, expected = BAD_SPECS[case]
    spec_file = tmp_path / "spec.json"
    if text is None:
        spec_file.mkdir()
    else:
        spec_file.write_bytes(text if isinstance(text, bytes) else text.encode())
    job_dir = tmp_path / "job"
    code, result, log = run_worker(job_dir, spec_file=spec_file)
    assert code == 2, log
    assert result["outcome"] == "invalid_spec" and result["exit_code"] == 2
    assert expected in result["message"]
    if case == "custom_model_not_importable":  # refused as its model is built
        assert sorted(p.name for p in job_dir.iterdir()) == ["progress.jsonl", "result.json"]
        assert stages_reached(job_dir) == STAGES
    else:  # the spec and its data files are checked before TensorFlow is imported
        assert sorted(p.name for p in job_dir.iterdir()) == ["result.json"]


def test_run_job_spec_json_giving_a_key_twice_exits_2_naming_it(tmp_path):
    # As the service starts it: `--job-dir` alone, reading the spec.json there. The same
    # key in two objects (`name` at the top and in `model`) is no duplicate; `units` twice
    # in an object of a custom model's list of params is one.
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    text = json.dumps(with_(TINY, model={"name": "m:f", "params": {"layers": [{}]}}), indent=1)
    text = text.replace('"layers": [\n    {}', '"layers": [\n    {"units": 4, "units": 8}')
    (job_dir / "spec.json").write_text(text)
    code, result, log = run_worker(job_dir)
    assert code == 2, log
    assert result["outcome"] == "invalid_spec"
    line = text.splitlines().index('    {"units": 4, "units": 8}') + 1
    places = f"given at line {line} column 6 and again at line {line} column 18"
    assert result["message"] == (
        f"Spec file {job_dir / 'spec.json'}: Duplicate key `model.params.layers.0.units`: "
        f"{places}; give each key once, as only one of its values would be kept"
    )
    assert result["errors"] == [
        {
            "field": "model.params.layers.0.units",
            "message": f"Duplicate key here: {places}. Give each key once: only one of its "
            "values would be kept.",
        }
    ]
    assert log.rstrip().endswith(result["message"]), log
    assert sorted(p.name for p in job_dir.iterdir()) == ["result.json", "spec.json"]


@pytest.mark.parametrize(
    "request_text", ['{"steps": 1e400}', '{"steps": ' + "[" * 100_000], ids=["inf", "nested"]
)
def test_run_job_takes_a_hand_written_profile_request_it_cannot_read_as_three_steps(
    tmp_path, request_text
):
    # The service writes `{"steps": N}` with N in 1..100; a hand-written 1e400 (infinity
    # to Python's json) raised an OverflowError at the first report and failed the job,
    # and brackets nested too deep a RecursionError.
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "profile_request.json").write_text(request_text)
    # No trace of the spec's own: the request is taken at the first report, whose step
    # depends on the machine's speed, and one taken next to TINY's trace of steps 6-7
    # ran on into it (a trace of steps 6-9, in CI).
    summaries = {**TINY["summaries"], "trace_steps": []}
    code, result, log = run_worker(job_dir, with_(TINY, steps=2000, summaries=summaries))
    assert code == 0, log
    events = progress_lines(job_dir / "progress.jsonl")
    (trace,) = [e for e in events if e["event"] == "trace" and e.get("requested")]
    assert trace["trace_dir"].endswith(f"_steps_{trace['step'] - 2}-{trace['step']}")
    assert not (job_dir / "profile_request.json").exists()


def test_run_job_given_gpus_that_tensorflow_cannot_see_fails_saying_so(tmp_path):
    # The service gave the job GPU 97 (TOWERBOARD_GPUS), which no host has: as with a
    # driver that does not match, TensorFlow finds no GPU. The job trained on the CPU,
    # many times slower, while the service showed it on its GPU.
    job_dir = tmp_path / "job"
    env = {"CUDA_VISIBLE_DEVICES": "97", "TOWERBOARD_JOB_ID": "j"}
    code, result, log = run_worker(job_dir, TINY, env=env)
    assert code == 1, log
    assert result["message"].startswith(
        "Preparing the job failed: GpusMissing: Expected the GPUs given in "
        "CUDA_VISIBLE_DEVICES='97', but TensorFlow "
        "finds no GPU"
    ), result["message"]


def test_run_job_says_which_trace_steps_lie_past_its_end_or_move_off_its_first(tmp_path):
    # Accepted (an epochs job's length is the worker's to find), but never taken: said.
    spec = with_(TINY, summaries={"trace_steps": [1, 2, 50_000, 60_000]})
    code, _, log = run_worker(tmp_path / "job", spec)
    assert code == 0, log
    assert "summaries.trace_steps 50000, 60000: past this job's " in log
    assert " steps, so no trace of them" in log
    # A process's first step traces the step function: its trace showed a step of a second
    # and more (a resumed one's too). The steps that run on from it move one later.
    assert "trace of step 1 moved to step 3: this process's first step traces" in log
    runs = [p.name for p in (tmp_path / "job" / "tb" / "plugins" / "profile").iterdir()]
    assert len(runs) == 1 and runs[0].endswith("_steps_2-3"), runs


def test_run_job_says_when_its_batch_is_more_than_the_training_set(tmp_path):
    # 512 synthetic examples, a fifth held out: 410 to train on. A batch of 1000 trained
    # on 410 a step without a word, its examples/sec a third of what the spec led to expect.
    spec = with_(TINY, batch_size=1000, steps=3, eval={"every_steps": 0})
    code, _, log = run_worker(tmp_path / "job", spec)
    assert code == 0, log
    assert (
        "batch_size 1000 is more than the 410 training examples: each step trains on all of "
        "them (one epoch a step), a global batch of 410"
    ) in log


@pytest.mark.parametrize("value", ["0", "²"])  # '²' passes str.isdigit(), not int()
def test_run_job_with_a_bad_gpu_split_exits_2(tmp_path, value):
    # The benchmarks' knob for towers on logical GPUs of one card: a value that is no size
    # is refused by name, before any device is set up.
    code, result, log = run_worker(tmp_path / "job", TINY, env={"TOWERBOARD_SPLIT_GPU_MB": value})
    assert code == 2, log
    assert result["errors"] == [
        {
            "field": "TOWERBOARD_SPLIT_GPU_MB",
            "message": "Expected TOWERBOARD_SPLIT_GPU_MB to be a whole number of MiB above 0. "
            f"Received: {value!r}",
        }
    ]


def test_run_job_crop_padding_larger_than_the_images_exits_2(tmp_path):
    # The spec cannot know a file's image size: the worker refuses before it trains.
    rng = np.random.default_rng(0)
    data = tmp_path / "small.npz"
    np.savez(data, x=rng.integers(0, 256, (20, 6, 10), np.uint8), y=rng.integers(0, 2, 20))
    spec = with_(
        TINY, data={"format": "npz", "path": str(data), "augment": {"random_crop_padding": 6}}
    )
    job_dir = tmp_path / "job"
    code, result, log = run_worker(job_dir, spec)
    assert code == 2, log
    assert result["errors"] == [
        {
            "field": "data.augment.random_crop_padding",
            "message": "Expected `random_crop_padding` below the images' height and width (6x10), "
            "so that a shifted image keeps some of its pixels. Received: 6, which would leave "
            "about 15% of the training images blank",
        }
    ]
    assert ended_preparing(job_dir) == ["importing TensorFlow", "loading data"]


def test_run_job_on_data_larger_than_memory_fails_before_reading_it(tmp_path):
    # Not the spec's fault (exit 1, not 2): the same job may start where there is room.
    data = write_tib_headers(tmp_path / "data", "idx")
    job_dir = tmp_path / "job"
    code, result, log = run_worker(job_dir, with_(TINY, data={"format": "idx", "path": str(data)}))
    assert code == 1, log
    assert result["outcome"] == "failed"
    assert result["message"].startswith(
        "Not enough memory for the data: Expected room in memory for 1024.0 GiB more: "
        f"{data / 'train-images-idx3-ubyte'} (dims (1048576, 1024, 1024)) holds that much to read."
    ), result["message"]
    assert ended_preparing(job_dir) == ["importing TensorFlow", "loading data"]


# --- runs started beside each other ----------------------------------------------------
# Each test below reads one worker run, which starts, with the others', when the first of
# them asks (tests/trainer/beside.py): two at a time, as a worker's start-up keeps one core
# of two busy. They come last in the module, so that no run goes on beside a test that
# times its own worker. None of them depends on how fast its worker goes.

Run = tuple[int, dict, str, Path]  # exit code, result.json, log, the run's folder
BESIDE: dict[str, Callable[[Path], Run]] = {}  # test name -> its run, given a fresh folder


def beside_run(*tests: str) -> Callable[[Callable[[Path], Run]], Callable[[Path], Run]]:
    """Register the decorated run as the one the named tests read."""

    def register(run: Callable[[Path], Run]) -> Callable[[Path], Run]:
        for test in tests:
            BESIDE[test] = run
        return run

    return register


@pytest.fixture(scope="module")
def beside(request, tmp_path_factory) -> Iterator[dict[str, Future]]:
    yield from start_beside(request, tmp_path_factory, BESIDE)


@pytest.fixture
def run(beside, request) -> Run:
    """This test's run (BESIDE), once it has ended."""
    return beside[request.node.name].result()


def run_in(folder: Path, spec: dict, **kw) -> Run:
    return (*run_worker(folder / "job", spec, **kw), folder)


@beside_run("test_epochs_train_partial_batches_and_scalars_count_their_examples")
def _partial_batches(folder: Path) -> Run:
    # 10 examples in batches of 9 on 2 towers: every other batch holds one example, so
    # tower 1 has none. 2 epochs are 4 steps.
    spec = with_(
        TINY,
        data={
            "format": "synthetic",
            "eval_fraction": 0.0,
            "params": {"shape": [4, 4], "classes": 2, "size": 10},
        },
        batch_size=9,
        steps=None,
        epochs=2,
        summaries={"scalars_every": 1, "histograms_every": 0, "images_every": 0, "trace_steps": []},
    )
    return run_in(folder, spec)


def test_epochs_train_partial_batches_and_scalars_count_their_examples(run):
    # The partial batches train, their rate counts one example, and tower 1 writes no loss
    # where it had no examples (0 would plot as perfect).
    code, result, log, folder = run
    assert code == 0, log
    assert result["step"] == result["total"] == 4
    # The start line says how long an epoch is: the service checks an `epochs` resume by it.
    starts = [e for e in progress_lines(folder / "job" / "progress.jsonl") if e["event"] == "start"]
    assert [e["steps_per_epoch"] for e in starts] == [2]
    acc = event_accumulator.EventAccumulator(
        str(folder / "job" / "tb" / "train"), size_guidance={"tensors": 0}
    )
    acc.Reload()

    def series(tag: str) -> dict[int, float]:
        return {e.step: float(tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)}

    assert sorted(series("tower_0/loss")) == [1, 2, 3, 4]
    assert sorted(series("tower_1/loss")) == [1, 3]
    # Each value under its own tag: a full batch of 9 splits 5 and 4, and the towers' mean
    # losses weighted so make the step's; the last step's is the job's.
    loss, tower_0, tower_1 = series("loss"), series("tower_0/loss"), series("tower_1/loss")
    for step in (1, 3):
        assert loss[step] == pytest.approx((5 * tower_0[step] + 4 * tower_1[step]) / 9, rel=1e-5)
    assert loss[4] == pytest.approx(result["metrics"]["loss"], rel=1e-5)
    assert 0 <= series("accuracy")[4] <= 1 and series("grad_norm")[4] > 0
    reports = [
        e for e in progress_lines(folder / "job" / "progress.jsonl") if e["event"] == "progress"
    ]
    assert series("learning_rate")[4] == pytest.approx(reports[-1]["learning_rate"], rel=1e-6)
    # The default rate as written in the spec, not its float32's bits read as a float64
    # (0.0010000000474974513).
    assert reports[-1]["learning_rate"] == 0.001
    times, rates = series("step_time_ms"), series("examples_per_sec")
    assert sorted(times) == [2, 3, 4]
    for step, examples in ((2, 1), (3, 9), (4, 1)):
        assert rates[step] == pytest.approx(examples * 1000 / times[step], rel=1e-4), step


@beside_run("test_run_job_of_one_step_has_no_speed_to_report")
def _one_step(folder: Path) -> Run:
    return run_in(
        folder, with_(TINY, steps=1, eval={"every_steps": 0}, summaries={"trace_steps": []})
    )


def test_run_job_of_one_step_has_no_speed_to_report(run):
    # The only step traces the function, and is not timed: the speed is unknown (null), not 0.
    code, result, log, folder = run
    assert code == 0, log
    [report] = [
        e for e in progress_lines(folder / "job" / "progress.jsonl") if e["event"] == "progress"
    ]
    assert report["step"] == 1 and report["examples_per_sec"] is None
    assert result["metrics"]["examples_per_sec"] is None and result["metrics"]["loss"] > 0


@beside_run("test_every_kind_is_written_at_the_first_and_last_steps")
def _last_step(folder: Path) -> Run:
    spec = with_(
        TINY,
        steps=23,
        summaries={
            "scalars_every": 5,
            "histograms_every": 10,
            "images_every": 10,
            "trace_steps": [],
        },
    )
    return run_in(folder, spec)


def test_every_kind_is_written_at_the_first_and_last_steps(run):
    # A 23-step job with scalars every 5 ended its charts at step 20, and its histograms and
    # images began at step 10: its inputs and initial weights unseen until then.
    code, _, log, folder = run
    assert code == 0, log
    acc = event_accumulator.EventAccumulator(
        str(folder / "job" / "tb" / "train"), size_guidance={event_accumulator.TENSORS: 0}
    )
    acc.Reload()
    steps = {tag: [e.step for e in acc.Tensors(tag)] for tag in acc.Tags()["tensors"]}
    assert steps["loss"] == steps["grad_norm"] == steps["tower_1/loss"] == [1, 5, 10, 15, 20, 23]
    kernels = [t for t in steps if t.startswith("weights/") and t.endswith("kernel")]
    assert kernels and all(steps[t] == [1, 10, 20, 23] for t in kernels)
    assert steps["tower_0/inputs"] == steps["tower_1/inputs"] == [1, 10, 20, 23]
    # The first step is the process's, untimed (it traces the step function): no time.
    assert steps["step_time_ms"] == steps["examples_per_sec"] == [5, 10, 15, 20, 23]


@beside_run("test_run_job_logistic_on_many_classes_exits_2")
def _logistic_ten_classes(folder: Path) -> Run:
    data = folder / "ten.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x=rng.random((64, 4, 4), dtype=np.float32), y=np.arange(64) % 10)
    spec = with_(TINY, model={"name": "logistic"}, data={"format": "npz", "path": str(data)})
    return run_in(folder, spec)


def test_run_job_logistic_on_many_classes_exits_2(run):
    code, result, log, _ = run
    assert code == 2, log
    assert result["message"] == (
        "Model `logistic` needs two-class data. Received: labels 0..9, so 10 classes"
    )


@beside_run("test_run_job_applies_the_specs_weight_decay_and_clip_norm")
def _decayed_and_clipped(folder: Path) -> Run:
    # Blank images: the first layer's kernel gets no gradient from the loss, so its update
    # is weight decay's alone. Plain SGD at rate 1, a checkpoint after each step.
    data = folder / "blank.npz"
    np.savez(data, x=np.zeros((32, 4, 4), np.float32), y=np.arange(32) % 2)
    spec = with_(
        TINY,
        model={"name": "mlp", "params": {"hidden": [8], "dropout": 0.0}},
        data={"format": "npz", "path": str(data), "eval_fraction": 0.0},
        towers=1,
        batch_size=16,
        steps=2,
        optimizer={"name": "sgd", "learning_rate": 1.0},
        weight_decay=0.5,
        clip_norm=0.01,
        eval={"every_steps": 0},
        summaries={"scalars_every": 1, "histograms_every": 0, "images_every": 0, "trace_steps": []},
        checkpoint={"every_steps": 1, "every_seconds": 0, "keep": 5},
    )
    return run_in(folder, spec)


def test_run_job_applies_the_specs_weight_decay_and_clip_norm(run):
    # The trainer's own tests hold what `weight_decay` and `clip_norm` do to a step; this,
    # that a worker gives its trainer the spec's (dropped, the job trained without them).
    code, _, log, folder = run
    assert code == 0, log

    def weights(step: int) -> list[np.ndarray]:
        reader = tf.train.load_checkpoint(str(folder / "job" / "checkpoints" / f"ckpt-{step}"))
        key = "optimizer/_trainable_variables/{}/.ATTRIBUTES/VARIABLE_VALUE"
        return [reader.get_tensor(key.format(i)) for i in range(4)]  # kernel, bias, x2

    before, after = weights(1), weights(2)
    update = [b - a for a, b in zip(before, after, strict=True)]
    # Step 2's update is clipped to the global norm clip_norm (times the rate, 1).
    norm = np.sqrt(sum(float(np.sum(np.square(u, dtype=np.float64))) for u in update))
    assert norm == pytest.approx(0.01, rel=1e-4)
    # The first kernel moved by decay alone: toward 0, along itself.
    kernel, moved = before[0], after[0]
    shrink = float(np.sum(moved * kernel) / np.sum(kernel * kernel))
    assert 0 < shrink < 1
    np.testing.assert_allclose(moved, shrink * kernel, rtol=1e-5, atol=1e-8)


@beside_run("test_run_job_draws_the_models_initial_weights_from_its_seed")
def _two_seeds(folder: Path) -> Run:
    # One step on the whole training set (in an order of the seed's, which the loss does
    # not depend on): the loss is the initial weights'. Two seeds, two runs.
    data = folder / "fixed.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x=rng.random((24, 4, 4), dtype=np.float32), y=np.arange(24) % 3)
    spec = with_(
        TINY,
        model={"name": "mlp", "params": {"hidden": [8], "dropout": 0.0}},
        data={"format": "npz", "path": str(data), "eval_fraction": 0.0},
        towers=1,
        batch_size=24,
        steps=1,
        eval={"every_steps": 0},
        summaries={"trace_steps": []},
    )
    run_worker(folder / "seed-1", with_(spec, seed=1))  # read by the test from its folder
    return (*run_worker(folder / "seed-2", with_(spec, seed=2)), folder)


def test_run_job_draws_the_models_initial_weights_from_its_seed(run):
    code, second, log, folder = run
    assert code == 0, log
    first = json.loads((folder / "seed-1" / "result.json").read_text())
    assert first["outcome"] == "succeeded", first
    losses = first["metrics"]["loss"], second["metrics"]["loss"]
    assert abs(losses[0] - losses[1]) > 1e-3, losses


def run_custom_model(tmp_path: Path, module: str, source: str, **changes) -> tuple[int, dict, str]:
    """Run TINY with the `module:build` model whose source is given, importable by the worker."""
    (tmp_path / f"{module}.py").write_text(source)
    spec = with_(TINY, model={"name": f"{module}:build"}, **changes)
    return run_worker(tmp_path / "job", spec, env={"PYTHONPATH": f"{tmp_path}:{REPO}"})


def custom_model_in(folder: Path, module: str, source: str, **changes) -> Run:
    """run_custom_model, as a run of BESIDE."""
    return (*run_custom_model(folder, module, source, **changes), folder)


@beside_run("test_run_job_non_finite_loss_fails_naming_step")
def _exploding(folder: Path) -> Run:
    # A custom `module:function` model whose output turns infinite once its weights move.
    return custom_model_in(
        folder,
        "exploding",
        "import keras\n"
        "def build(input_shape, num_classes):\n"
        "    inputs = keras.Input(input_shape)\n"
        "    x = keras.layers.Flatten()(inputs)\n"
        "    x = keras.layers.Dense(num_classes, kernel_initializer='ones')(x)\n"
        "    return keras.Model(inputs, keras.layers.Lambda(lambda t: t * 1e38)(x))\n",
        towers=1,
    )


def test_run_job_non_finite_loss_fails_naming_step(run):
    code, result, log, _ = run
    assert code == 1, log
    assert result["outcome"] == "failed"
    assert result["message"].startswith("Loss became non-finite (")
    assert result["message"].endswith(f"at step {result['step']}.")


# A model whose first layer's gradient is NaN while its output stays finite whatever the
# weights (NaN and inf read as 0): the loss stays finite as the weights turn NaN, as a
# rectifier on the CPU made it (NaN in, 0 out), and the job trained to its end saying nothing.
NAN_GRADIENT_MODEL = (
    "import keras\n"
    "import tensorflow as tf\n"
    "@tf.custom_gradient\n"
    "def nan_gradient(x):\n"
    "    return tf.identity(x), lambda dy: dy * float('nan')\n"
    "def build(input_shape, num_classes):\n"
    "    inputs = keras.Input(input_shape)\n"
    "    x = keras.layers.Dense(16)(keras.layers.Flatten()(inputs))\n"
    "    x = keras.layers.Lambda(nan_gradient)(x)\n"
    "    x = keras.layers.Lambda(lambda t: tf.where(tf.math.is_finite(t), t, 0.0))(x)\n"
    "    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))\n"
)


@beside_run("test_run_job_fails_on_non_finite_gradients_under_a_finite_loss")
def _nan_gradients(folder: Path) -> Run:
    return custom_model_in(folder, "nangrad", NAN_GRADIENT_MODEL)


def test_run_job_fails_on_non_finite_gradients_under_a_finite_loss(run):
    code, result, log, folder = run
    assert code == 1, log
    assert result["outcome"] == "failed"
    # Step 1 writes scalars (every kind is written at a job's first step), so its norm is
    # read and the job fails there, naming it and the cadence that checks it.
    assert result["step"] == 1
    assert result["message"].startswith("Gradients became non-finite (global norm nan) at step 1")
    assert "summaries.scalars_every: 5" in result["message"], result["message"]
    assert not (folder / "job" / "checkpoints").exists()


@beside_run("test_run_job_saves_no_checkpoint_of_non_finite_weights")
def _nan_weights_unchecked(folder: Path) -> Run:
    # Scalars off: no step reads the gradient norm, so the weights' check before the
    # checkpoint of step 20 is what finds them.
    summaries = {**json.loads(json.dumps(TINY))["summaries"], "scalars_every": 0}
    return custom_model_in(folder, "nangrad", NAN_GRADIENT_MODEL, summaries=summaries)


def test_run_job_saves_no_checkpoint_of_non_finite_weights(run):
    code, result, log, folder = run
    assert code == 1, log
    assert result["outcome"] == "failed"
    assert result["step"] == 20
    assert result["message"].startswith(
        "Weights became non-finite by step 20 (dense/kernel holds NaN or inf)"
    ), result["message"]
    assert not list((folder / "job" / "checkpoints").glob("ckpt-*")), "a NaN checkpoint was saved"


@beside_run("test_run_job_deterministic_turns_on_tensorflows_op_determinism")
def _deterministic(folder: Path) -> Run:
    # Its effect shows on GPUs (most CPU kernels are deterministic as they are): here, as
    # TensorFlow's flag, which a custom model's builder reads (the flag is set before).
    (folder / "determinism.py").write_text(
        "import keras\n"
        "from tensorflow.python.framework import config  # no public reader of the flag\n"
        "def build(input_shape, num_classes, note):\n"
        "    with open(note, 'w') as f:\n"
        "        f.write(str(config.is_op_determinism_enabled()))\n"
        "    inputs = keras.Input(input_shape)\n"
        "    x = keras.layers.Flatten()(inputs)\n"
        "    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))\n"
    )
    spec = with_(
        TINY,
        model={"name": "determinism:build", "params": {"note": str(folder / "note.txt")}},
        deterministic=True,
        towers=1,
        steps=1,
        eval={"every_steps": 0},
        summaries={"trace_steps": []},
    )
    return run_in(folder, spec, env={"PYTHONPATH": f"{folder}:{REPO}"})


def test_run_job_deterministic_turns_on_tensorflows_op_determinism(run):
    code, _, log, folder = run
    assert code == 0, log
    assert (folder / "note.txt").read_text() == "True"


@beside_run("test_run_job_trains_and_exports_a_subclassed_custom_model")
def _subclassed(folder: Path) -> Run:
    # A `module:function` model written as a keras.Model subclass: no input_shape or
    # output_shape until it is called, and a layer it builds but never uses.
    return custom_model_in(
        folder,
        "subclassed",
        "import keras\n"
        "class Net(keras.Model):\n"
        "    def __init__(self, num_classes):\n"
        "        super().__init__()\n"
        "        self.flatten = keras.layers.Flatten()\n"
        "        self.hidden = keras.layers.Dense(16, activation='relu')\n"
        "        self.logits = keras.layers.Dense(num_classes)\n"
        "        self.spare = keras.layers.Dense(2, name='spare')\n"
        "    def build(self, input_shape):\n"
        "        self.spare.build((None, 3))\n"
        "        super().build(input_shape)\n"
        "    def call(self, x, training=False):\n"
        "        return self.logits(self.hidden(self.flatten(x)))\n"
        "def build(input_shape, num_classes):\n"
        "    return Net(num_classes)\n",
    )


def test_run_job_trains_and_exports_a_subclassed_custom_model(run):
    code, result, log, folder = run
    assert code == 0, log
    assert result["outcome"] == "succeeded"
    assert "No gradient reaches" in log and "spare" in log
    exported = tf.saved_model.load(str(folder / "job" / "export"))
    assert exported.serve(np.zeros((2, 8, 8, 1), np.float32)).shape == (2, 4)  # TINY's data


ONE_LOGIT = (
    "import keras\n"
    "def build(input_shape, num_classes):\n"
    "    inputs = keras.Input(input_shape)\n"
    "    x = keras.layers.Dense(16, activation='relu')(keras.layers.Flatten()(inputs))\n"
    "    return keras.Model(inputs, keras.layers.Dense(1)(x))\n"
)


@beside_run("test_run_job_custom_model_with_one_sigmoid_logit_for_two_classes")
def _one_logit_two_classes(folder: Path) -> Run:
    two_classes = {"format": "synthetic", "params": {"shape": [8, 8], "classes": 2, "size": 512}}
    return custom_model_in(folder, "onelogit", ONE_LOGIT, data=two_classes, towers=1, steps=60)


def test_run_job_custom_model_with_one_sigmoid_logit_for_two_classes(run):
    # As `logistic` does: one logit, a sigmoid loss, its sign for the class, and an export
    # whose probabilities are the sigmoid. It was refused for not giving 2 logits.
    code, result, log, folder = run
    assert code == 0, log
    assert result["eval"]["accuracy"] > 0.9, result  # synthetic classes are easy to tell apart
    exported = tf.saved_model.load(str(folder / "job" / "export"))
    out = exported.signatures["serving_default"](images=tf.zeros((3, 8, 8, 1)))
    assert out["probabilities"].shape == (3, 1)
    np.testing.assert_allclose(out["probabilities"], tf.sigmoid(out["logits"]), rtol=1e-6)


@beside_run("test_run_job_custom_model_with_one_logit_for_four_classes_exits_2")
def _one_logit_four_classes(folder: Path) -> Run:
    return custom_model_in(folder, "onelogit", ONE_LOGIT)


def test_run_job_custom_model_with_one_logit_for_four_classes_exits_2(run):
    code, result, log, _ = run
    assert code == 2, log
    assert result["message"] == (
        "Expected model 'onelogit:build' to output logits of shape (batch, 4). "
        "Received: output shape (batch, 1)"
    )


@beside_run("test_run_job_leaves_no_result_json_of_its_models_code_beside_its_end_line")
def _notes_model(folder: Path) -> Run:
    # A model whose code writes a result.json of its own (the run directory is its working
    # directory), and looks at what a reader of the run directory finds as the end line is
    # written: the trainer's progress writer, wrapped by the model's module.
    return custom_model_in(
        folder,
        "notes",
        "import json, os, sys, keras\n"
        "from trainer import rundir\n"
        "os.chdir(sys.argv[sys.argv.index('--job-dir') + 1])  # as the service starts it\n"
        "write = rundir.ProgressWriter.write\n"
        "def looked(self, event, **fields):\n"
        "    write(self, event, **fields)\n"
        "    if event == 'end':\n"
        "        with open('seen_at_end.txt', 'w') as f:\n"
        "            f.write(open('result.json').read() if os.path.exists('result.json') else '')\n"
        "rundir.ProgressWriter.write = looked\n"
        "def build(input_shape, num_classes):\n"
        "    with open('result.json', 'w') as f:\n"
        "        json.dump({'outcome': 'failed', 'message': 'the model built'}, f)\n"
        "    inputs = keras.Input(input_shape)\n"
        "    return keras.Model(inputs, keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs)))\n",
        towers=1,
    )


def test_run_job_leaves_no_result_json_of_its_models_code_beside_its_end_line(run):
    # The service ends a running job at the result.json it finds once the end line is in.
    # The model's own was still there until the trainer's replaced it (after an fsync), and
    # a service that looked then ended the job with it: failed, "the model built".
    code, result, log, folder = run
    assert code == 0, log
    assert result["message"] == "Trained 40 steps."
    assert (folder / "job" / "seen_at_end.txt").read_text() == ""


MIXED_PRECISION = (
    "import keras\n"
    "def build(input_shape, num_classes):\n"
    "    # Keras's mixed-precision recipe, but for the float32 output layer it advises.\n"
    "    keras.mixed_precision.set_global_policy('mixed_bfloat16')\n"
    "    inputs = keras.Input(input_shape)\n"
    "    x = keras.layers.Dense(16, activation='relu')(keras.layers.Flatten()(inputs))\n"
    "    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))\n"
)


@beside_run("test_run_job_custom_model_with_half_precision_logits_trains")
def _mixed_precision(folder: Path) -> Run:
    return custom_model_in(folder, "mixed", MIXED_PRECISION, steps=60)


def test_run_job_custom_model_with_half_precision_logits_trains(run):
    # Its bfloat16 logits met the float32 loss weights in the step: a TypeError at step 1.
    # The loss is computed in float32, and the export answers float32.
    code, result, log, folder = run
    assert code == 0, log
    assert result["eval"]["accuracy"] > 0.9, result  # synthetic classes are easy to tell apart
    exported = tf.saved_model.load(str(folder / "job" / "export"))
    out = exported.signatures["serving_default"](images=tf.zeros((3, 8, 8, 1)))
    assert out["probabilities"].dtype == tf.float32 and out["logits"].dtype == tf.float32


@beside_run("test_run_job_custom_model_with_integer_output_exits_2")
def _integer_output(folder: Path) -> Run:
    return custom_model_in(
        folder,
        "intout",
        "import keras\n"
        "def build(input_shape, num_classes):\n"
        "    inputs = keras.Input(input_shape)\n"
        "    x = keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs))\n"
        "    return keras.Model(inputs, keras.ops.cast(x, 'int32'))\n",
    )


def test_run_job_custom_model_with_integer_output_exits_2(run):
    code, result, log, folder = run
    assert code == 2, log
    assert result["message"] == (
        "Expected model 'intout:build' to output floating-point logits. Received: int32"
    )
    assert ended_preparing(folder / "job") == STAGES


@beside_run("test_run_job_custom_model_that_cannot_run_exits_2")
def _broken(folder: Path) -> Run:
    return custom_model_in(
        folder,
        "broken",
        "import keras\n"
        "def build(input_shape, num_classes):\n"
        "    inputs = keras.Input((5,))\n"
        "    return keras.Model(inputs, keras.layers.Dense(num_classes)(inputs))\n",
    )


def test_run_job_custom_model_that_cannot_run_exits_2(run):
    code, result, log, folder = run
    assert code == 2, log
    assert result["message"].startswith("Model 'broken:build' failed on a batch of shape (1, ")
    assert ended_preparing(folder / "job") == STAGES


USER_BUGS = {
    "builder-raises": (
        "def build(input_shape, num_classes):\n    assert input_shape[-1] == 3, 'wants colour images'\n",
        "Model 'userbug:build' failed to build: AssertionError: wants colour images",
    ),
    "module-does-not-parse": (
        "def build(input_shape, num_classes)\n    pass\n",
        "Cannot import module 'userbug' of model 'userbug:build': SyntaxError: ",
    ),
}
for _case, (_source, _) in USER_BUGS.items():
    beside_run(f"test_run_job_custom_model_errors_exit_2_with_a_result[{_case}]")(
        partial(custom_model_in, module="userbug", source=_source)
    )


@pytest.mark.parametrize("case", list(USER_BUGS))
def test_run_job_custom_model_errors_exit_2_with_a_result(run, case):
    # User code can raise anything; the job must still end with exit 2 and say why.
    code, result, log, folder = run
    message = USER_BUGS[case][1]
    assert code == 2, log
    assert result["outcome"] == "invalid_spec"
    assert result["message"].startswith(message), result["message"]
    assert ended_preparing(folder / "job") == STAGES


@beside_run("test_run_job_crash_in_training_reports_its_step")
def _fuse(folder: Path) -> Run:
    # A custom layer that fails its own check on its 4th training call: a crash inside
    # step 4.
    return custom_model_in(
        folder,
        "fuse",
        "import keras\n"
        "import tensorflow as tf\n"
        "class Fuse(keras.layers.Layer):\n"
        "    def build(self, shape):\n"
        "        self.calls = self.add_weight(shape=(), initializer='zeros', trainable=False, name='calls')\n"
        "    def call(self, x, training=False):\n"
        "        if training:\n"
        "            self.calls.assign_add(1.0)\n"
        "            tf.debugging.assert_less(self.calls, 4.0, message='fuse blew')\n"
        "        return x\n"
        "def build(input_shape, num_classes):\n"
        "    inputs = keras.Input(input_shape)\n"
        "    x = Fuse()(keras.layers.Flatten()(inputs))\n"
        "    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))\n",
        towers=1,
    )


def test_run_job_crash_in_training_reports_its_step(run):
    # The result must say where it happened, not step 0.
    code, result, log, _ = run
    assert code == 1, log
    assert result["outcome"] == "failed"
    assert "fuse blew" in result["message"]
    assert result["step"] == 4
    assert "\n" not in result["message"], result["message"]  # the traceback is in the log


@beside_run("test_run_job_failed_step_is_one_line_without_keras_page")
def _picky(folder: Path) -> Run:
    # A custom layer that raises only in training, when the train step is traced: Keras
    # wraps it in a page (ANSI bold, the arguments received) and autograph in a traceback.
    return custom_model_in(
        folder,
        "picky",
        "import keras\n"
        "class Picky(keras.layers.Layer):\n"
        "    def call(self, x, training=False):\n"
        "        if training:\n"
        "            raise ValueError('wants colour images only')\n"
        "        return x\n"
        "def build(input_shape, num_classes):\n"
        "    inputs = keras.Input(input_shape)\n"
        "    x = Picky()(keras.layers.Flatten()(inputs))\n"
        "    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))\n",
        towers=1,
    )


def test_run_job_failed_step_is_one_line_without_keras_page(run):
    # The job's message is the reason and the layer; the log keeps the whole of it.
    code, result, log, _ = run
    assert code == 1, log
    assert result["outcome"] == "failed"
    assert result["message"] == "ValueError: wants colour images only (in Picky.call())"
    assert "Arguments received by Picky.call()" in log


def test_run_job_custom_model_outside_the_services_list_exits_2_unimported(tmp_path):
    """A service that lists the modules custom models may come from passes the list to its
    workers: a job admitted before the list was narrowed is refused before its module is
    imported (importing runs its code). By hand, without the variable, any module goes."""
    (tmp_path / "qa_marker_model.py").write_text(
        f"open({str(tmp_path / 'imported')!r}, 'w').close()\n"
        "def build(input_shape, num_classes):\n    raise SystemExit(9)\n"
    )
    spec = with_(TINY, model={"name": "qa_marker_model:build"})
    env = {"PYTHONPATH": str(tmp_path), "TOWERBOARD_MODEL_MODULES": "team.models, models"}
    code, result, log = run_worker(tmp_path / "job", spec, env=env)
    assert code == 2, log
    assert result["outcome"] == "invalid_spec"
    assert result["message"] == (
        "Expected a custom model from a module this service allows (TOWERBOARD_MODEL_MODULES: "
        "'team.models', 'models'). Received: 'qa_marker_model:build'. Code in a custom model "
        "runs as the service's user, so the service's operator lists the modules jobs may use"
    )
    assert not (tmp_path / "imported").exists()
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == ["result.json", "spec.json"]
    # Listed (or no list at all): imported, and its builder's own failure is what ends it.
    for allowed in ({"TOWERBOARD_MODEL_MODULES": "qa_marker_model"}, {}):
        code, result, log = run_worker(
            tmp_path / f"job{len(allowed)}", spec, env={"PYTHONPATH": str(tmp_path), **allowed}
        )
        assert code == 2 and "failed to build" in result["message"], log
        assert (tmp_path / "imported").exists()


def test_run_job_data_led_out_of_the_services_roots_while_queued_exits_2(tmp_path):
    """The service checks a job's data against its roots at submit, and passes them to
    the worker, which checks again as it starts: a link put in the data's folder while
    the job waited for its turn was read from outside them."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "set").mkdir(parents=True)
    outside.mkdir()
    np.savez(root / "set" / "a.npz", x=np.zeros((8, 4, 4), np.uint8), y=np.zeros(8, np.int64))
    np.savez(outside / "b.npz", x=np.zeros((8, 4, 4), np.uint8), y=np.zeros(8, np.int64))
    (root / "set" / "b.npz").symlink_to(outside / "b.npz")  # after the job's submit
    spec = with_(TINY, data={"format": "npz", "path": str(root / "set")})
    env = {"TOWERBOARD_WORKER_DATA_ROOTS": json.dumps([str(root)])}  # as the service sets it
    code, result, log = run_worker(tmp_path / "job", spec, env=env)
    assert code == 2, log
    assert result["errors"][0]["field"] == "data.path"
    assert f"resolves to {outside / 'b.npz'}" in result["message"], result
    # By hand, without the variable, the data is the job's own.
    code, result, log = run_worker(tmp_path / "by-hand", spec)
    assert code == 0, log


def test_run_job_whose_checkpoints_path_is_a_file_fails_at_the_start(tmp_path):
    # It trained from step 0 and failed at its first save (a hand-damaged job folder).
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "checkpoints").write_text("not a folder")
    code, result, log = run_worker(job_dir, TINY)
    assert code == 1, log
    assert result["message"] == (
        "NotADirectoryError: checkpoints/ in the job's folder is a file, not a folder of "
        "checkpoints: move it away, then run the job again"
    )
    assert result["step"] is None
    lines = progress_lines(job_dir / "progress.jsonl")
    assert not [line for line in lines if line["event"] == "progress"]  # nothing trained
