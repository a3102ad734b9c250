"""Checkpoints: what goes in one, when to save, and restoring the latest on start.

A checkpoint holds the model, the optimizer (slots and iteration count), the step, the
EMA shadows, the Keras seed-generator states (dropout masks; `tf.train.Checkpoint` does
not reach them through the model) and the data iterator, so a resumed run continues
exactly where it stopped. Files are `checkpoints/ckpt-<step>.*`, kept by
`tf.train.CheckpointManager`.
"""

from __future__ import annotations

import time
from pathlib import Path

import keras
import tensorflow as tf

from trainer.spec import CheckpointSpec
from trainer.towers import TowerTrainer


class CheckpointMismatch(RuntimeError):
    """The run dir's latest checkpoint was written for a different model or optimizer."""


def _seed_states(model: keras.Model) -> list[tf.Variable]:
    return [v.value for v in model.non_trainable_variables if "seed_generator" in v.path]


class Checkpointer:
    """Saves every `every_steps` steps and/or `every_seconds` seconds, keeping `keep`."""

    def __init__(
        self,
        directory: Path,
        trainer: TowerTrainer,
        iterator: tf.data.Iterator,
        spec: CheckpointSpec,
    ) -> None:
        items: dict[str, object] = {
            "model": trainer.model,
            "optimizer": trainer.optimizer,
            "step": trainer.step,
            "iterator": iterator,
            "seed_states": _seed_states(trainer.model),
        }
        if trainer.ema is not None:
            items["ema"] = trainer.ema
        self.checkpoint = tf.train.Checkpoint(**items)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, str(directory), max_to_keep=spec.keep, checkpoint_name="ckpt"
        )
        self.spec = spec
        self._trainer = trainer
        self._last_step = -1
        self._last_time = time.monotonic()

    def _kept(self) -> dict[int, str]:
        """Step -> path prefix of the checkpoints kept, oldest first."""
        return {int(path.rsplit("-", 1)[1]): path for path in self.manager.checkpoints}

    def steps(self) -> list[int]:
        """The steps of the checkpoints kept, oldest first."""
        return list(self._kept())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def restore_latest(self) -> int | None:
        """Restore the newest checkpoint, if any; return its step."""
        latest = self.latest_step()
        return None if latest is None else self.restore(latest)

    def restore(self, step: int) -> int:
        """Restore the checkpoint of `step` (one of `steps()`); return the step restored."""
        path = self._kept()[step]
        try:
            self.checkpoint.restore(path).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            # TensorFlow names a variable and two shapes; say what that means for a job.
            raise CheckpointMismatch(
                f"Cannot resume from {Path(path).parent.name}/{Path(path).name}: it does not fit this job's "
                f"model or optimizer (was the spec changed after it was written? Use a new job dir). {e}"
            ) from e
        self._last_step = int(self._trainer.step.numpy())
        self._last_time = time.monotonic()
        return self._last_step

    def due_by_steps(self, step: int) -> bool:
        return (
            step != self._last_step
            and self.spec.every_steps > 0
            and step % self.spec.every_steps == 0
        )

    def due_by_time(self) -> bool:
        """The `every_seconds` cadence. A cluster's workers each have their own clock, so
        the controller saves by it only when the step's requests agree (`REQUESTS`)."""
        return (
            self.spec.every_seconds > 0
            and time.monotonic() - self._last_time >= self.spec.every_seconds
        )

    def save(self, step: int) -> str:
        """Save at `step` (once per step); returns the checkpoint's path prefix."""
        if step != self._last_step:
            self.manager.save(checkpoint_number=step)
            self._last_step = step
            self._last_time = time.monotonic()
        return self.manager.latest_checkpoint
