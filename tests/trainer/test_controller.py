"""The outer loop's order of work, in this process on real towers (logical CPU devices):
which step's loss is read when, relative to the launch of the next one.

On a GPU a step's call returns once it is queued, and reading its loss waits for it; the
loop reads a step's loss only after it has launched the next one, unless something other
than the loss is due after it. A CPU runs each call to its end, so the gain cannot be
timed here; the order it comes from is what these tests hold."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer.checkpoints import Checkpointer
from trainer.controller import Controller, NonFiniteLoss
from trainer.models import build_model
from trainer.optim import make_optimizer
from trainer.rundir import ProgressWriter, RunDir, read_progress
from trainer.spec import JobSpec, ModelSpec, OptimizerSpec
from trainer.summaries import SummaryManager
from trainer.towers import TowerTrainer

SHAPE = (8, 8, 1)


class _Loss:
    """A step's loss tensor that notes when the loop first reads it."""

    def __init__(self, tensor: tf.Tensor, step: int, log: list[str]) -> None:
        self.tensor, self.step, self.log = tensor, step, log

    def __float__(self) -> float:
        if f"read {self.step}" not in self.log:
            self.log.append(f"read {self.step}")
        return float(self.tensor)


class RecordingTrainer(TowerTrainer):
    """The real tower trainer, noting each launch and each first read of a step's loss."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.log: list[str] = []
        self.stop_after: tuple[int, threading.Event] | None = None  # set it as that step launches
        self.nan_at: int | None = None  # that step's loss reads as NaN

    def train_step(self, *args: Any, **kw: Any) -> dict[str, Any]:
        out = dict(super().train_step(*args, **kw))
        step = int(self.step.numpy())
        self.log.append(f"launch {step}")
        loss = tf.constant(np.nan) if step == self.nan_at else out["loss"]
        out["loss"] = _Loss(loss, step, self.log)
        if self.stop_after is not None and self.stop_after[0] == step:
            self.stop_after[1].set()
        return out


def run_loop(
    tmp_path: Path, steps: int, batches: Iterator[tuple[tf.Tensor, tf.Tensor]], **spec: Any
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
            model=build_model(ModelSpec(name="mlp"), SHAPE, 4),
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
        eval_data=None,
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


def test_a_step_with_only_its_loss_due_is_read_after_the_next_one_launches(tmp_path) -> None:
    summaries = {"scalars_every": 5, "histograms_every": 0, "images_every": 0}
    controller, trainer = run_loop(
        tmp_path, 12, batches(), summaries={**summaries, "trace_steps": [], "graph": False}
    )

    summary = controller.run()

    assert summary.step == 12
    # 1 is read at once (the first step is timed apart), and so are 5 and 10 (scalars)
    # and 12 (the last); each of the others once the step after it is launched.
    assert trainer.log == [
        "launch 1",
        "read 1",
        "launch 2",
        "launch 3",
        "read 2",
        "launch 4",
        "read 3",
        "launch 5",
        "read 4",
        "read 5",
        "launch 6",
        "launch 7",
        "read 6",
        "launch 8",
        "read 7",
        "launch 9",
        "read 8",
        "launch 10",
        "read 9",
        "read 10",
        "launch 11",
        "launch 12",
        "read 11",
        "read 12",
    ]
    lines, _ = read_progress(controller.rundir.progress)
    ends = [e for e in lines if e["event"] == "progress"]
    # The last report is of the last step, its loss to 6 significant digits.
    assert ends[-1]["step"] == 12
    assert ends[-1]["loss"] == pytest.approx(summary.metrics["loss"], rel=1e-5)


def test_a_non_finite_loss_read_a_step_late_names_its_own_step(tmp_path) -> None:
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, trainer = run_loop(
        tmp_path, 20, batches(), summaries={**off, "trace_steps": [], "graph": False}
    )
    trainer.nan_at = 7

    with pytest.raises(NonFiniteLoss) as failed:
        controller.run()

    assert failed.value.step == 7
    assert str(failed.value) == "Loss became non-finite (nan) at step 7."
    assert trainer.log[-2:] == ["launch 8", "read 7"]  # found once 8 was queued


def test_a_stop_reads_the_step_in_flight_and_checkpoints_after_it(tmp_path) -> None:
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0}
    controller, trainer = run_loop(
        tmp_path, 50, batches(), summaries={**off, "trace_steps": [], "graph": False}
    )
    trainer.stop_after = (6, controller.stop)  # as SIGTERM sets it, with step 6 in flight

    summary = controller.run()

    assert summary.outcome.value == "cancelled" and summary.step == 6
    assert trainer.log[-3:] == ["launch 6", "read 5", "read 6"]
    assert summary.checkpoint == "checkpoints/ckpt-6"
    assert int(trainer.step.numpy()) == 6
