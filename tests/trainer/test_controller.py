"""The outer loop's order of work, in this process on real towers (logical CPU devices):
which step's loss is read when, relative to the launches of the next ones.

On a GPU a step's call returns once it is queued, and reading any tensor back waits for
all the work queued; the loop launches steps with nothing but their loss due up to
`UNREAD_STEPS_MAX` at a time before it reads them, and reads at once a step that has
something else due. A CPU runs each call to its end, so the gain cannot be timed here;
the order it comes from is what these tests hold."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

from tests.trainer.progress_lines import progress_lines
from trainer import controller as controller_module
from trainer import profiling
from trainer.checkpoints import Checkpointer
from trainer.cluster import Cluster
from trainer.controller import UNREAD_STEPS_MAX, Controller
from trainer.devicememory import TowerMemory
from trainer.divergence import Diverged, NonFiniteLoss
from trainer.models import build_model
from trainer.optim import make_optimizer
from trainer.rundir import ProgressWriter, RunDir
from trainer.spec import JobSpec, ModelSpec, OptimizerSpec
from trainer.summaries import SummaryManager
from trainer.towers import TowerTrainer

SHAPE = (8, 8, 1)


class _Loss:
    """A step's loss tensor that notes when the loop first reads it, alone (`float`) or
    with others (converted to a tensor, to be stacked)."""

    def __init__(self, tensor: tf.Tensor, step: int, log: list[str]) -> None:
        self.tensor, self.step, self.log = tensor, step, log

    def _note(self) -> None:
        if f"read {self.step}" not in self.log:
            self.log.append(f"read {self.step}")

    @property
    def device(self) -> str:  # where the loop looks to choose how it reads (`_read_losses`)
        return self.tensor.device

    def __float__(self) -> float:
        self._note()
        return float(self.tensor)

    def __tf_tensor__(self, dtype: tf.DType | None = None, name: str | None = None) -> tf.Tensor:
        self._note()
        return tf.convert_to_tensor(self.tensor, dtype=dtype, name=name)


class RecordingTrainer(TowerTrainer):
    """The real tower trainer, noting each launch and each first read of a step's loss."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.log: list[str] = []
        self.stop_after: tuple[int, threading.Event] | None = None  # set it as that step launches
        self.nan_at: int | None = None  # that step's loss reads as NaN
        self.nan_norm_at: int | None = None  # that step's gradient norm reads as NaN

    def train_step(self, *args: Any, **kw: Any) -> dict[str, Any]:
        out = dict(super().train_step(*args, **kw))
        step = int(self.step.numpy())
        self.log.append(f"launch {step}")
        loss = tf.constant(np.nan) if step == self.nan_at else out["loss"]
        out["loss"] = _Loss(loss, step, self.log)
        if step == self.nan_norm_at:  # in the scalars the step packs, which the loop reads
            at = self.scalar_names.index("grad_norm")
            out["scalars"] = tf.tensor_scatter_nd_update(out["scalars"], [[at]], [np.nan])
        if self.stop_after is not None and self.stop_after[0] == step:
            self.stop_after[1].set()
        return out


@pytest.fixture(autouse=True)
def reports_at_the_end_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step a report is due at is read at once, and reports fall due by the clock: these
    tests hold the order of reads by the steps alone, with reports at the last step."""
    monkeypatch.setattr(controller_module, "PROGRESS_EVERY_SECONDS", float("inf"))
    monkeypatch.setattr(controller_module, "PROGRESS_MIN_SECONDS", float("inf"))


def run_loop(
    tmp_path: Path,
    steps: int,
    batches: Iterator[tuple[tf.Tensor, tf.Tensor]],
    eval_data: tf.data.Dataset | None = None,
    **spec: Any,
) -> tuple[Controller, RecordingTrainer]:
    job = JobSpec.model_validate(
        {
            "data": {"format": "synthetic"},
            "towers": 2,
            "batch_size": 16,
            "steps": steps,
            "eval": {"every_steps": 0},
            "checkpoint": {"every_steps": 0, "every_seconds": 0, "keep": 1},
            **spec,
        }
    )
    keras.utils.set_random_seed(0)
    with tf.device("/CPU:0"):
        trainer = RecordingTrainer(
            model=build_model(ModelSpec(name="mlp"), SHAPE, 4).model,
            optimizer=make_optimizer(OptimizerSpec(name="sgd", learning_rate=0.1)),
            tower_devices=["/CPU:0", "/CPU:1"],
            parameter_device="/CPU:0",
        )
    iterator = iter(tf.data.Dataset.range(1))  # what the checkpoint holds; unused here
    rundir = RunDir(tmp_path)
    controller = Controller(
        spec=job,
        trainer=trainer,
        train_batches=batches,
        eval_data=eval_data,
        total_steps=steps,
        rundir=rundir,
        progress=ProgressWriter(rundir.progress),
        summaries=SummaryManager(rundir.tensorboard),
        checkpointer=Checkpointer(rundir.checkpoints, trainer, iterator, job.checkpoint),
        stop=threading.Event(),
    )
    return controller, trainer


def batches() -> Iterator[tuple[tf.Tensor, tf.Tensor]]:
    rng = np.random.default_rng(0)
    while True:
        images = rng.random((16, *SHAPE), dtype=np.float32)
        yield tf.constant(images), tf.constant(rng.integers(0, 4, 16).astype(np.int32))


def logged(verb: str, *steps: int) -> list[str]:
    return [f"{verb} {s}" for s in steps]


def test_steps_with_only_their_loss_due_are_read_with_the_next_that_has_more(tmp_path) -> None:
    summaries = {"scalars_every": 5, "histograms_every": 0, "images_every": 0}
    controller, trainer = run_loop(
        tmp_path, 12, batches(), summaries={**summaries, "trace_steps": [], "graph": False}
    )

    summary = controller.run()

    assert summary.step == 12
    # 1 is read at once (the first step is timed apart), and so are 5 and 10 (scalars)
    # and 12 (the last), each with the steps launched before it and not read yet.
    assert trainer.log == [
        *logged("launch", 1), *logged("read", 1),
        *logged("launch", 2, 3, 4, 5), *logged("read", 2, 3, 4, 5),
        *logged("launch", 6, 7, 8, 9, 10), *logged("read", 6, 7, 8, 9, 10),
        *logged("launch", 11, 12), *logged("read", 11, 12),
    ]  # fmt: skip
    lines = progress_lines(controller.rundir.progress)
    ends = [e for e in lines if e["event"] == "progress"]
    # The last report is of the last step, its loss to 6 significant digits.
    assert ends[-1]["step"] == 12
    assert ends[-1]["loss"] == pytest.approx(summary.metrics["loss"], rel=1e-5)


def test_the_first_step_is_reported_whatever_the_clock_says(tmp_path) -> None:
    # Reports fall due by the clock alone here (never, until the last step): the first
    # step's is made all the same, so the charts begin at the job's initial loss. Left to
    # the clock, a step function traced in under 2 s went unreported, and a fast job's
    # loss chart began a hundredth of the job in, its initial descent never drawn.
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, _ = run_loop(
        tmp_path, 12, batches(), summaries={**off, "trace_steps": [], "graph": False}
    )

    controller.run()

    lines = progress_lines(controller.rundir.progress)
    reports = [e for e in lines if e["event"] == "progress"]
    assert [e["step"] for e in reports] == [1, 12]
    assert reports[0]["loss"] > 0 and reports[0]["examples_per_sec"] is None  # traced


def test_each_evals_step_is_reported_whatever_the_clock_says(tmp_path) -> None:
    # Reports fall due by the clock alone here (never, until the last step): an eval's
    # step is reported all the same, so its eval has the train loss beside it. Left to
    # the clock, a fast job's CSV held eval rows with no loss, and its charts an eval
    # point with no train point of its step.
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, _ = run_loop(
        tmp_path,
        12,
        batches(),
        eval_data=eval_set(),
        eval={"every_steps": 4, "batches": 1},
        summaries={**off, "trace_steps": [], "graph": False},
    )

    controller.run()

    lines = progress_lines(controller.rundir.progress)
    reports = [e["step"] for e in lines if e["event"] == "progress"]
    evals = [e["step"] for e in lines if e["event"] == "eval"]
    assert reports == [1, 4, 8, 12]
    assert evals == [4, 8, 12]


def test_with_nothing_else_due_the_loop_reads_every_so_many_steps(tmp_path) -> None:
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    steps = 2 * UNREAD_STEPS_MAX + 3
    controller, trainer = run_loop(
        tmp_path, steps, batches(), summaries={**off, "trace_steps": [], "graph": False}
    )

    controller.run()

    # After the first, the loop reads when UNREAD_STEPS_MAX steps are unread, and at the last.
    read_after = [
        int(trainer.log[i - 1].split()[1])
        for i, entry in enumerate(trainer.log)
        if entry.startswith("read") and trainer.log[i - 1].startswith("launch")
    ]
    assert read_after == [1, 1 + UNREAD_STEPS_MAX, 1 + 2 * UNREAD_STEPS_MAX, steps]
    assert [e for e in trainer.log if e.startswith("read")] == logged("read", *range(1, steps + 1))
    # Every step reported: the last report is of the last step.
    lines = progress_lines(controller.rundir.progress)
    assert [e for e in lines if e["event"] == "progress"][-1]["step"] == steps


class _LossOnAGpu:
    """A loss the loop takes for one on a GPU (none here): stacked with the others into
    one copy, never read alone, which on a GPU is a sync of its own."""

    device = "/job:localhost/replica:0/task:0/device:GPU:0"

    def __init__(self, value: float) -> None:
        self.value = value

    def __float__(self) -> float:
        raise AssertionError("a loss on a GPU read alone: a sync of its own")

    def __tf_tensor__(self, dtype: tf.DType | None = None, name: str | None = None) -> tf.Tensor:
        return tf.constant(self.value, dtype=dtype or tf.float32, name=name)


def test_losses_on_the_host_are_read_each_and_on_a_device_stacked(monkeypatch) -> None:
    on_host = [tf.constant(0.5), tf.constant(0.25)]
    stacked: list[int] = []
    stack = tf.stack

    def counted(values: list[Any]) -> tf.Tensor:
        stacked.append(len(values))
        return stack(values)

    monkeypatch.setattr(tf, "stack", counted)

    assert controller_module._read_losses(on_host) == [0.5, 0.25]
    assert stacked == []  # no eager op: each read from host memory (37 against 216 µs)
    assert controller_module._read_losses([_LossOnAGpu(0.5), _LossOnAGpu(0.25)]) == [0.5, 0.25]
    assert stacked == [2]


def test_a_non_finite_loss_read_steps_late_names_its_own_step(tmp_path) -> None:
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, trainer = run_loop(
        tmp_path, 40, batches(), summaries={**off, "trace_steps": [], "graph": False}
    )
    trainer.nan_at = 7

    with pytest.raises(NonFiniteLoss) as failed:
        controller.run()

    assert failed.value.step == 7
    assert str(failed.value) == "Loss became non-finite (nan) at step 7."
    # Found when the steps after the first were read, UNREAD_STEPS_MAX of them, together.
    last = 1 + UNREAD_STEPS_MAX
    tail = [*logged("launch", last), *logged("read", *range(2, last + 1))]
    assert trainer.log[-len(tail) :] == tail


@pytest.mark.parametrize(
    ("nan_at", "reported"),
    [
        (7, [1, 6]),  # 6 read with 7, in the same copy
        (12, [1, 11]),  # 11 read with the steps before it, 12 in the next copy
        (2, [1]),  # 1, the last finite, reported already: not again
        (1, []),  # no step was finite
    ],
)
def test_a_non_finite_loss_reports_the_last_finite_step_first(
    tmp_path, nan_at: int, reported: list[int]
) -> None:
    # A run that blew up within seconds had reported its first step alone (reports fall
    # due by the clock, never here): the dashboard's charts, made of the progress lines,
    # held that one point, not the climb to the step before the failure.
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, trainer = run_loop(
        tmp_path, 40, batches(), summaries={**off, "trace_steps": [], "graph": False}
    )
    trainer.nan_at = nan_at

    with pytest.raises(NonFiniteLoss):
        controller.run()

    lines = progress_lines(controller.rundir.progress)
    reports = [e for e in lines if e["event"] == "progress"]
    assert [e["step"] for e in reports] == reported
    if len(reported) == 2:
        last = reports[-1]
        assert last["loss"] > 0 and 0 <= last["accuracy"] <= 1
        assert last["learning_rate"] == 0.1 and last["eta_seconds"] is None
    # The losses read as before the failure: each once, in the copies the loop makes.
    reads = [e for e in trainer.log if e.startswith("read")]
    launches = [e for e in trainer.log if e.startswith("launch")]
    assert [e.split()[1] for e in reads] == [e.split()[1] for e in launches]


def test_non_finite_gradients_report_their_step_first(tmp_path) -> None:
    # Under a finite loss the step's own loss and accuracy are the last finite ones: they
    # are reported before the job fails, as the step before a non-finite loss is.
    off = {"histograms_every": 0, "images_every": 0, "trace_steps": [], "graph": False}
    controller, trainer = run_loop(tmp_path, 40, batches(), summaries={**off, "scalars_every": 5})
    trainer.nan_norm_at = 10

    with pytest.raises(
        Diverged, match=r"^Gradients became non-finite \(global norm nan\) at step 10"
    ):
        controller.run()

    lines = progress_lines(controller.rundir.progress)
    reports = [e for e in lines if e["event"] == "progress"]
    assert [e["step"] for e in reports] == [1, 10]
    assert math.isfinite(reports[-1]["loss"]) and reports[-1]["eta_seconds"] is None


def test_a_stop_reads_the_steps_in_flight_and_checkpoints_after_them(tmp_path) -> None:
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, trainer = run_loop(
        tmp_path, 50, batches(), summaries={**off, "trace_steps": [], "graph": False}
    )
    trainer.stop_after = (6, controller.stop)  # as SIGTERM sets it, with step 6 in flight

    summary = controller.run()

    assert summary.outcome.value == "cancelled" and summary.step == 6
    assert trainer.log[-6:] == [*logged("launch", 6), *logged("read", 2, 3, 4, 5, 6)]
    assert summary.checkpoint == "checkpoints/ckpt-6"
    assert int(trainer.step.numpy()) == 6


def test_a_step_a_report_is_due_at_is_read_at_once(tmp_path, monkeypatch) -> None:
    # As on a host whose steps take longer than the 2 s between reports: each is read as
    # soon as it is launched, and reported, never held back with the unread ones.
    monkeypatch.setattr(controller_module, "PROGRESS_EVERY_SECONDS", 0.0)
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, trainer = run_loop(
        tmp_path, 5, batches(), summaries={**off, "trace_steps": [], "graph": False}
    )

    controller.run()

    assert trainer.log == [e for s in range(1, 6) for e in logged("launch", s) + logged("read", s)]
    lines = progress_lines(controller.rundir.progress)
    assert [e["step"] for e in lines if e["event"] == "progress"] == [1, 2, 3, 4, 5]


def test_each_towers_images_are_the_examples_it_trained_on(tmp_path) -> None:
    # A batch of 7 on 2 towers: the first tower trains examples 0-3, the second 4-6. Each
    # example is a flat image of its own shade, so its grid says which examples it holds.
    controller, _ = run_loop(tmp_path, 1, batches())
    shades = np.arange(7, dtype=np.float32) / 10
    images = np.broadcast_to(shades[:, None, None, None], (7, *SHAPE)).copy()

    controller._write_images(3, tf.constant(images))
    controller.summaries.close()

    acc = event_accumulator.EventAccumulator(
        str(controller.rundir.tensorboard / "train"), size_guidance={event_accumulator.TENSORS: 0}
    )
    acc.Reload()
    for tag, examples in (("tower_0/inputs", [0, 1, 2, 3]), ("tower_1/inputs", [4, 5, 6])):
        [event] = acc.Tensors(tag)
        pngs = tf.make_ndarray(event.tensor_proto)[2:]  # after the width and the height
        seen = [int(tf.io.decode_png(png).numpy()[0, 0, 0]) for png in pngs]
        assert seen == [int(shades[k] * 255.5) for k in examples], tag


def test_each_towers_memory_is_charted_and_reported(tmp_path, monkeypatch) -> None:
    # The CPU's counters stand in for each tower's GPU's (tests/trainer/test_devicememory.py
    # says why): with 48 MiB held from before the job, every scalars point charts each
    # tower's peak since the point before, and every report its peak since the start.
    monkeypatch.setattr(controller_module, "PROGRESS_MIN_SECONDS", 0.0)
    monkeypatch.setattr(controller_module, "PROGRESS_EVERY_SECONDS", 0.0)
    with tf.device("/CPU:1"):
        held = tf.fill([48 << 18], 1.0)
    controller, _ = run_loop(tmp_path, 6, batches(), summaries={"scalars_every": 2})
    controller.memory = TowerMemory(controller.trainer.tower_devices, counted=("CPU",))

    controller.run()
    controller.summaries.close()
    del held

    acc = event_accumulator.EventAccumulator(
        str(controller.rundir.tensorboard / "train"), size_guidance={event_accumulator.TENSORS: 0}
    )
    acc.Reload()
    for i in (0, 1):
        charted = [
            (e.step, float(tf.make_ndarray(e.tensor_proto)))
            for e in acc.Tensors(f"tower_{i}/memory_mb")
        ]
        assert [step for step, _ in charted] == [1, 2, 4, 6], charted  # the first step too
        assert all(mb >= 48 for _, mb in charted), charted
    reports = [e for e in progress_lines(tmp_path / "progress.jsonl") if e["event"] == "progress"]
    assert reports and all(len(e["memory_mb"]) == 2 and min(e["memory_mb"]) >= 48 for e in reports)


def histograms_of(controller: Controller) -> dict[str, list[tuple[int, np.ndarray]]]:
    controller.summaries.close()
    acc = event_accumulator.EventAccumulator(
        str(controller.rundir.tensorboard / "train"), size_guidance={event_accumulator.TENSORS: 0}
    )
    acc.Reload()
    return {
        tag: [(e.step, tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]
        for tag in acc.Tags()["tensors"]
        if tag.startswith(("weights/", "activations/"))
    }


def test_the_activations_are_of_tower_0s_examples(tmp_path) -> None:
    # A batch of 7 on 2 towers: tower 0 trains examples 0-3, so the logits' histogram is
    # of 4 examples of 4 classes, and the hidden ReLU's of 4 x its width.
    controller, trainer = run_loop(tmp_path, 1, batches(), summaries={"histograms_every": 0})
    controller.spec.summaries.histograms_every = 1
    images, labels = next(batches())
    out = trainer.train_step(images[:7], labels[:7])

    controller._write_histograms(1, out["grads"], images[:7])

    written = histograms_of(controller)
    [(_, logits)] = written["activations/logits"]
    assert logits[:, 2].sum() == 4 * 4
    # Keras numbers the layer by the models this process built before (`dense_4`).
    [relu] = [layer for layer in trainer.model.layers[2:-1] if layer.name.startswith("dense")]
    [(_, hidden)] = written[f"activations/{relu.name}"]
    assert hidden[:, 2].sum() == 4 * relu.units


@pytest.mark.parametrize("fails_at", ["the start", "a histograms step"])
def test_activations_that_fail_are_logged_once_and_the_job_trains_on(
    tmp_path, monkeypatch, caplog, fails_at
) -> None:
    # A summary is never fatal: a probe that fails (a device out of memory), as the job
    # starts or later, leaves the weights' and gradients' histograms and the training as
    # they were.
    def fail(self, images):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")

    monkeypatch.setattr(controller_module.ActivationProbe, "__call__", fail)
    if fails_at == "a histograms step":
        monkeypatch.setattr(controller_module.ActivationProbe, "warm", lambda self: None)
    controller, _ = run_loop(tmp_path, 3, batches(), summaries={"histograms_every": 1})

    with caplog.at_level("WARNING", logger="trainer.controller"):
        summary = controller.run()

    assert summary.step == 3
    more = "" if fails_at == "the start" else "more "
    assert [r.getMessage() for r in caplog.records if "activations" in r.getMessage()] == [
        f"activations: no {more}histograms of them: ResourceExhaustedError: OOM when "
        "allocating tensor"
    ]
    written = histograms_of(controller)
    assert not [tag for tag in written if tag.startswith("activations/")]
    assert [step for step, _ in written["weights/logits/kernel"]] == [1, 2, 3]


def eval_set() -> tf.data.Dataset:
    rng = np.random.default_rng(1)
    images = rng.random((16, *SHAPE), dtype=np.float32)
    labels = rng.integers(0, 4, 16).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(16)


@pytest.mark.parametrize(
    ("resumed_at", "evaluated", "evals"),
    [
        # A cluster: SIGTERM during the eval of step 10 drops it, and the workers stop
        # after step 11, the next they agree on. The eval due is done first, of step 11
        # (step 10's weights are gone), then the job's own at its end.
        pytest.param(11, [], [11, 15], id="cluster-eval-lost"),
        pytest.param(11, [10], [15], id="cluster-eval-done"),  # it ended before the stop
        # The resumed run's eval of step 11 was cut short too, and it stopped after 12.
        pytest.param(12, [], [12, 15], id="cluster-eval-lost-twice"),
        # An earlier resumed run did it (of step 11): not done again.
        pytest.param(13, [11], [15], id="cluster-eval-done-on-resume"),
        # Evals of other steps are not the one due.
        pytest.param(11, [5, 9, 12], [11, 15], id="cluster-other-evals"),
        # One process stops before its next step: at the eval step itself.
        pytest.param(10, [], [10, 15], id="one-process-eval-lost"),
        pytest.param(10, [10], [15], id="one-process-eval-done"),
        pytest.param(9, [], [10, 15], id="before-the-first-eval-step"),
    ],
)
def test_a_resumed_run_first_does_the_eval_a_stop_cut_short(
    tmp_path, resumed_at, evaluated, evals
) -> None:
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    total = 15
    controller, trainer = run_loop(
        tmp_path,
        total,
        batches(),
        eval_data=eval_set(),
        eval={"every_steps": 10, "batches": 1},
        summaries={**off, "trace_steps": [], "graph": False},
    )
    trainer.step.assign(resumed_at)  # as restored from the checkpoint of that step
    progress = ProgressWriter(controller.rundir.progress)  # the runs before this one's
    for step in evaluated:
        progress.write("phase", step=step, total=total, phase="eval", phase_done=0)
        progress.write("eval", step=step, total=total, eval_loss=1.0, eval_accuracy=0.5)
    progress.close()

    summary = controller.run()

    assert summary.outcome.value == "succeeded" and summary.step == total
    lines = progress_lines(controller.rundir.progress)
    assert [e["step"] for e in lines if e["event"] == "eval"] == [*evaluated, *evals]
    controller.summaries.close()
    acc = event_accumulator.EventAccumulator(str(controller.rundir.tensorboard / "eval"))
    acc.Reload()
    assert [event.step for event in acc.Tensors("loss")] == evals


def test_a_profile_request_it_cannot_take_traces_nothing(tmp_path, monkeypatch, caplog) -> None:
    # A folder named as the request once taken (the job's code runs in the run directory)
    # leaves every request where it is. Read as a request of the default steps, it was
    # taken again at every report: one trace of the whole job from its first report on.
    monkeypatch.setattr(controller_module, "PROGRESS_EVERY_SECONDS", 0.0)
    (tmp_path / "profile_request.taken").mkdir()
    (tmp_path / "profile_request.taken" / "kept").write_text("")
    (tmp_path / "profile_request.json").write_text('{"steps": 1}')
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, _ = run_loop(
        tmp_path, 6, batches(), summaries={**off, "trace_steps": [], "graph": False}
    )

    with caplog.at_level("WARNING", logger="trainer.controller"):
        controller.run()

    lines = progress_lines(controller.rundir.progress)
    assert [e["step"] for e in lines if e["event"] == "progress"] == [1, 2, 3, 4, 5, 6]
    assert [e for e in lines if e["event"] == "trace"] == []
    assert not (tmp_path / "tb" / "plugins").exists()
    # Said once, not at every report.
    [warning] = [r.getMessage() for r in caplog.records if "profile request" in r.getMessage()]
    assert warning.startswith("could not take the profile request ")


def test_a_profile_request_that_is_no_text_traces_the_default_steps(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(controller_module, "PROGRESS_EVERY_SECONDS", 0.0)
    (tmp_path / "profile_request.json").write_bytes(b'{"steps": \xff}')
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, _ = run_loop(
        tmp_path, 8, batches(), summaries={**off, "trace_steps": [], "graph": False}
    )

    controller.run()

    lines = progress_lines(controller.rundir.progress)
    # Taken at the first report, as one of PROFILE_STEPS_DEFAULT (3) steps: 2 to 4.
    assert [(e["step"], e["requested"]) for e in lines if e["event"] == "trace"] == [(4, True)]
    assert not (tmp_path / "profile_request.json").exists()


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(("stopped_in", "outcome"), [(3, "cancelled"), (4, "succeeded")])
def test_a_stop_during_the_last_step_ends_a_cluster_as_it_ends_one_process(
    tmp_path, workers: int, stopped_in: int, outcome: str
) -> None:
    # A cluster's workers stop after the step whose requests carried the stop; one process
    # before its next step, so a stop during its last ends it trained. A cluster's ended
    # "cancelled" at step 4 of 4, with no final checkpoint and no export. Two workers are
    # a one-process stand-in marked as a cluster's chief: the requests go through the
    # step as a cluster's do, agreed by one.
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, _ = run_loop(
        tmp_path, 4, iter(()), summaries={**off, "trace_steps": [], "graph": False}
    )
    controller.cluster = Cluster(workers=workers)

    def stopped_while_drawn() -> Iterator[tuple[tf.Tensor, tf.Tensor]]:
        for drawn, batch in enumerate(batches(), start=1):
            if drawn == stopped_in:  # a SIGTERM as the step's input is awaited
                controller.stop.set()
            yield batch

    controller.train_batches = stopped_while_drawn()

    summary = controller.run()

    assert (summary.outcome.value, summary.step) == (outcome, stopped_in)
    assert controller.checkpointer.manager.latest_checkpoint.endswith(f"ckpt-{stopped_in}")


def slow_profiler_stop(
    monkeypatch: pytest.MonkeyPatch, seconds: float, until: Callable[[], bool] | None = None
) -> list[str]:
    """The profiler's stop, made to take `seconds` first (or, given `until`, to wait for it
    up to `seconds`, noting whether it came): so it is still running when the loop goes
    on. The list says what each stop saw, once it ended."""
    stop, ended = tf.profiler.experimental.stop, []

    def slow_stop() -> None:
        waited = time.monotonic() + seconds
        while time.monotonic() < waited and not (until and until()):
            time.sleep(0.01)
        stop()
        ended.append("came" if until and until() else "ended")

    monkeypatch.setattr(profiling.tf.profiler.experimental, "stop", slow_stop)
    return ended


def trace_lines(controller: Controller) -> list[tuple[int, str]]:
    """(step, the steps its folder is named by) of each `trace` line; each line's times
    and folder are checked here."""
    lines = progress_lines(controller.rundir.progress)
    traces = [e for e in lines if e["event"] == "trace"]
    for e in traces:
        assert len(e["tower_ms"]) == 2 and all(ms > 0 for ms in e["tower_ms"]), e
        assert (controller.rundir.root / e["trace_dir"]).is_dir(), e
    return [(e["step"], e["trace_dir"].rsplit("_", 1)[1]) for e in traces]


def compute_ms_steps(controller: Controller) -> list[int]:
    controller.summaries.close()
    acc = event_accumulator.EventAccumulator(
        str(controller.rundir.tensorboard / "train"), size_guidance={"tensors": 0}
    )
    acc.Reload()
    return [e.step for e in acc.Tensors("tower_0/compute_ms")]


def test_the_loop_goes_on_while_the_profiler_stops(tmp_path, monkeypatch) -> None:
    # The profiler's stop (collecting and writing the trace: 40 ms on an H200 host) and
    # the reading of the towers' times ran on the loop, 2% of a 1000-step GPU job. The
    # stop waits here for step 6 to launch: on the loop, it would wait in vain.
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, trainer = run_loop(
        tmp_path, 8, batches(), summaries={**off, "trace_steps": [3, 4], "graph": False}
    )
    ended = slow_profiler_stop(monkeypatch, 10.0, until=lambda: "launch 6" in trainer.log)

    summary = controller.run()

    assert summary.outcome.value == "succeeded"
    assert ended == ["came"]
    assert trace_lines(controller) == [(4, "3-4")]
    assert compute_ms_steps(controller) == [4]
    assert not [t for t in threading.enumerate() if t.name.startswith("trace-stop")]


@pytest.mark.parametrize(
    ("trace_steps", "steps", "stop_after", "outcome", "traces"),
    [
        # A cancel just after a trace's last step: the trace is written, then the checkpoint.
        pytest.param([3, 4], 8, 4, "cancelled", [(4, "3-4")], id="cancel-after-a-trace"),
        # The job's last step is a trace step.
        pytest.param([5], 5, None, "succeeded", [(5, "5")], id="trace-at-the-last-step"),
        # The next trace starts as soon as the last one's stop ends.
        pytest.param([3, 4, 6, 7], 9, None, "succeeded", [(4, "3-4"), (7, "6-7")], id="close"),
    ],
)
def test_a_trace_still_stopping_is_written_before_the_job_ends(
    tmp_path, monkeypatch, trace_steps, steps, stop_after, outcome, traces
) -> None:
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, trainer = run_loop(
        tmp_path, steps, batches(), summaries={**off, "trace_steps": trace_steps, "graph": False}
    )
    if stop_after is not None:
        trainer.stop_after = (stop_after, controller.stop)  # as SIGTERM sets it
    slow_profiler_stop(monkeypatch, 0.3)  # still stopping when the loop comes to its end

    summary = controller.run()

    assert summary.outcome.value == outcome
    assert trace_lines(controller) == traces
    assert compute_ms_steps(controller) == [step for step, _ in traces]
    # Before the final checkpoint: the run writes its end and result.json after that.
    events = [e["event"] for e in progress_lines(controller.rundir.progress)]
    assert events[-2:] == ["phase", "checkpoint"], events
    assert events[:-2].count("trace") == len(traces), events


def test_a_failure_while_the_profiler_stops_waits_for_the_stop(tmp_path, monkeypatch) -> None:
    # The run closes the summaries and exits once the loop fails: a stop still running
    # then would run on into the interpreter's shutdown.
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, trainer = run_loop(
        tmp_path, 8, batches(), summaries={**off, "trace_steps": [3], "graph": False}
    )
    trainer.nan_at = 4
    ended = slow_profiler_stop(monkeypatch, 1.0)

    with pytest.raises(NonFiniteLoss):
        controller.run()

    assert ended == ["ended"]
    assert not [t for t in threading.enumerate() if t.name.startswith("trace-stop")]


@pytest.mark.parametrize("nan_at", [3, 4], ids=["the trace's first step", "its second"])
def test_a_failure_inside_a_trace_stops_the_profiler_and_keeps_the_trace(tmp_path, nan_at) -> None:
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, trainer = run_loop(
        tmp_path, 8, batches(), summaries={**off, "trace_steps": [3, 4, 5], "graph": False}
    )
    trainer.nan_at = nan_at

    with pytest.raises(NonFiniteLoss):
        controller.run()

    # Named by the steps it holds, the failing one the last; and no profiler left running,
    # which would refuse the next one.
    runs = [p.name for p in (controller.rundir.tensorboard / "plugins" / "profile").iterdir()]
    assert [run.split("_", 6)[-1] for run in runs] == ["step_3" if nan_at == 3 else "steps_3-4"], (
        runs
    )
    tf.profiler.experimental.start(str(tmp_path / "next"))
    tf.profiler.experimental.stop()


def test_a_failure_after_a_traced_step_names_the_trace_by_the_steps_it_holds(
    tmp_path, monkeypatch
) -> None:
    # The checkpoint after traced step 4 fails (a full disk, say): the step was traced and
    # counted, and the trace holds steps 3-4, not a step 2 before it.
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, _ = run_loop(
        tmp_path,
        8,
        batches(),
        summaries={**off, "trace_steps": [3, 4, 5], "graph": False},
        checkpoint={"every_steps": 4, "every_seconds": 0, "keep": 1},
    )

    def save(step: int) -> str:
        raise OSError(f"no space left on the device, at step {step}")

    monkeypatch.setattr(controller.checkpointer, "save", save)

    with pytest.raises(OSError, match="at step 4"):
        controller.run()

    runs = [p.name for p in (controller.rundir.tensorboard / "plugins" / "profile").iterdir()]
    assert [run.split("_", 6)[-1] for run in runs] == ["steps_3-4"], runs


class _AskForTrace:
    """Stands in for the stop event of `RecordingTrainer.stop_after`: as its step launches,
    a profile request (the service's `POST /profile`) is put in the run directory."""

    def __init__(self, rundir: RunDir, steps: int) -> None:
        self.rundir, self.steps = rundir, steps

    def set(self) -> None:
        (self.rundir.root / "profile_request.json").write_text(f'{{"steps": {self.steps}}}')


def test_a_trace_whose_times_cannot_be_read_still_answers_its_request(
    tmp_path, monkeypatch
) -> None:
    # On a GPU host whose profiler could not load CUPTI the trace is written (TensorBoard
    # shows it) but has no kernels to time. Without a line, a page that asked for it
    # waited for ever and, at the job's end, said the job ended before the trace was taken.
    monkeypatch.setattr(controller_module, "PROGRESS_EVERY_SECONDS", 0.0)
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, trainer = run_loop(
        tmp_path, 14, batches(), summaries={**off, "trace_steps": [3, 4], "graph": False}
    )
    trainer.stop_after = (6, _AskForTrace(controller.rundir, 2))  # type: ignore[assignment]
    read, no_cupti = profiling.tower_times_ms, "Expected the trace to hold the towers' GPU kernels"

    def times_of_the_first_trace_only(path: Path, *args: Any, **kw: Any) -> list[float]:
        if "steps_3-4" not in str(path):
            raise ValueError(f"{no_cupti}. Received: none")
        return read(path, *args, **kw)

    monkeypatch.setattr(profiling, "tower_times_ms", times_of_the_first_trace_only)
    end = profiling.TraceCapture.end

    def ended_at_once(self: profiling.TraceCapture, *args: Any, **kw: Any) -> Any:
        # The thread's work done before the loop goes on, so each trace's line comes at the
        # next step, with reports after it: else the last could come at the job's end, the
        # thread still stopping the profiler through the reports (a race).
        ending = end(self, *args, **kw)
        ending.result()
        return ending

    monkeypatch.setattr(profiling.TraceCapture, "end", ended_at_once)

    summary = controller.run()

    assert summary.outcome.value == "succeeded"
    lines = progress_lines(controller.rundir.progress)
    timed, untimed = [e for e in lines if e["event"] == "trace"]
    assert (timed["step"], len(timed["tower_ms"]), "requested" in timed) == (4, 2, False), timed
    assert untimed["requested"] is True and "tower_ms" not in untimed, untimed
    assert untimed["tower_ms_error"] == f"{no_cupti}. Received: none", untimed
    assert (controller.rundir.root / untimed["trace_dir"]).is_dir(), untimed
    # The steps asked for from the report after step 6 was launched, traced and named so.
    first = untimed["step"] - 1
    assert untimed["trace_dir"].endswith(f"_steps_{first}-{untimed['step']}"), untimed
    assert compute_ms_steps(controller) == [4]  # no times of the untimed trace
    # The reports after it no longer repeat the older trace's times as if they were its.
    at = lines.index(untimed)
    before = [e for e in lines[lines.index(timed) : at] if e["event"] == "progress"]
    after = [e for e in lines[at:] if e["event"] == "progress"]
    assert before and all(e["tower_ms"] == timed["tower_ms"] for e in before), before
    assert after and not [e for e in after if "tower_ms" in e], after


def test_a_cadence_of_0_turns_its_kind_off(tmp_path) -> None:
    # JOB_SPEC.md: "`summaries.*_every`: 0 turns that kind off". Each kind is also written
    # at the job's first and last steps, but not a kind that is off; nor is the graph
    # without `graph`. The progress reports (the service's charts) go on.
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, _ = run_loop(
        tmp_path, 3, batches(), summaries={**off, "trace_steps": [], "graph": False}
    )

    assert controller.run().step == 3
    controller.summaries.close()

    # Every event of the train run (its folder is made by the first one written).
    events = [
        event
        for path in sorted((controller.rundir.tensorboard / "train").glob("events.*"))
        for event in tf.compat.v1.train.summary_iterator(str(path))
    ]
    assert [v.tag for e in events for v in e.summary.value] == []
    assert not any(e.graph_def for e in events)
    reports = [e for e in progress_lines(controller.rundir.progress) if e["event"] == "progress"]
    assert reports[-1]["step"] == 3


def test_checkpoints_every_so_many_steps_keep_the_newest_few(tmp_path) -> None:
    # `checkpoint.every_steps` 2 over 7 steps saves at 2, 4 and 6 and at the end; `keep` 2
    # leaves the newest two of them on disk.
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, _ = run_loop(
        tmp_path,
        7,
        batches(),
        summaries={**off, "trace_steps": [], "graph": False},
        checkpoint={"every_steps": 2, "every_seconds": 0, "keep": 2},
    )

    controller.run()

    lines = progress_lines(controller.rundir.progress)
    saved = [e["checkpoint"] for e in lines if e["event"] == "checkpoint"]
    assert saved == [f"checkpoints/ckpt-{step}" for step in (2, 4, 6, 7)]
    assert controller.checkpointer.steps() == [6, 7]
    kept = sorted(p.name for p in controller.rundir.checkpoints.glob("ckpt-*.index"))
    assert kept == ["ckpt-6.index", "ckpt-7.index"]


def test_eval_every_0_steps_evaluates_at_no_step_not_even_the_last(tmp_path) -> None:
    # As a summaries cadence of 0 turns its kind off: with eval data there, no eval at all
    # (the final one after the last step included), and the result has none.
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, _ = run_loop(
        tmp_path,
        4,
        batches(),
        eval_data=eval_set(),
        eval={"every_steps": 0, "batches": 1},
        summaries={**off, "trace_steps": [], "graph": False},
    )

    summary = controller.run()

    assert (summary.step, summary.eval) == (4, None)
    lines = progress_lines(controller.rundir.progress)
    assert not [e for e in lines if e["event"] == "eval" or e.get("phase") == "eval"]
    assert not (controller.rundir.tensorboard / "eval").exists()
