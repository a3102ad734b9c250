"""Checkpoints: what goes in one, when to save, and restoring the latest on start.

A checkpoint holds the model, the optimizer (slots and iteration count), the step, the
EMA shadows, a float16 model's loss scale (`trainer.lossscale`), the Keras seed-generator
states (dropout masks; `tf.train.Checkpoint` does not reach them through the model) and
the data iterator, so a resumed run continues exactly where it stopped. Files are
`checkpoints/ckpt-<step>.*`, kept by `tf.train.CheckpointManager`, which lists them in
its `checkpoints/checkpoint` state file.

Resuming survives damage a crash, a full disk or a hand can leave: a state file that is
lost or unreadable is rebuilt from the `ckpt-<step>.index` files there, and a newest
checkpoint whose files are missing or cut short is set aside (`checkpoints/damaged/`)
for the newest one that reads whole. Only a checkpoint that reads whole and still does
not restore is the job's own mismatch (`CheckpointMismatch`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import keras
import tensorflow as tf

from trainer.errors import op_reason
from trainer.lossscale import INITIAL_SCALE
from trainer.rundir import write_text_atomic
from trainer.spec import CheckpointSpec
from trainer.towers import TowerTrainer

log = logging.getLogger(__name__)

_INDEX = re.compile(r"^ckpt-(\d+)\.index$")


class CheckpointMismatch(RuntimeError):
    """The run dir's latest checkpoint was written for a different model or optimizer."""


class CheckpointDamaged(RuntimeError):
    """A checkpoint's files are missing or cut short, so it cannot be read whole."""


def _damage(path: str) -> str | None:
    """Why the checkpoint at `path` cannot be read whole, or None if every tensor reads.

    Run only after a restore failed, to tell damage (a torn save, a lost file) from a
    checkpoint of another job: it reads the whole checkpoint once more.
    """
    try:
        dtypes = tf.train.load_checkpoint(path).get_variable_to_dtype_map()
        # One RestoreV2 of every tensor: the reader's get_tensor cannot give a variant
        # (the data iterator's state).
        with tf.device("/CPU:0"):
            tf.raw_ops.RestoreV2(
                prefix=path,
                tensor_names=list(dtypes),
                shape_and_slices=[""] * len(dtypes),
                dtypes=list(dtypes.values()),
            )
    except Exception as e:  # noqa: BLE001 - a torn file raises OpErrors, IndexError, ...
        return _reason(e)
    return None


def data_bytes(path: str) -> int:
    """The bytes of the data files of the checkpoint at `path` (`ckpt-N.data-*-of-*`, beside
    its `.index`): what its restore reads, but for the index's kilobytes."""
    prefix = Path(path)
    total = 0
    for file in prefix.parent.glob(f"{prefix.name}.data-*"):
        with contextlib.suppress(OSError):  # gone: the restore says so
            total += file.stat().st_size
    return total


def _reason(error: Exception) -> str:
    """The error's message on one line, without the function and op names TensorFlow wraps
    around it: the job's message repeats it for every checkpoint found damaged."""
    if isinstance(error, tf.errors.OpError):
        return op_reason(error.message) or type(error).__name__
    return " ".join(str(error).split()) or type(error).__name__


def _write_state(directory: Path, steps: list[int]) -> None:
    """Write the state file listing the checkpoints of `steps` (oldest first)."""
    names = [f"ckpt-{step}" for step in steps]
    times = []
    for name in names:
        try:
            times.append((directory / f"{name}.index").stat().st_mtime)
        except OSError:
            times.append(time.time())
    # The manager tracks (and rotates) only checkpoints newer than the last preserved
    # time: their own mtimes, then, and a preserved time before the oldest. The file is
    # the text proto TensorFlow writes (its writer for it is deprecated in TF 2).
    lines = [f'model_checkpoint_path: "{names[-1]}"']
    lines += [f'all_model_checkpoint_paths: "{name}"' for name in names]
    lines += [f"all_model_checkpoint_timestamps: {t!r}" for t in times]
    lines.append(f"last_preserved_timestamp: {min(times) - 1.0!r}")
    write_text_atomic(directory / "checkpoint", "\n".join(lines) + "\n")


def _remove_torn_saves(directory: Path) -> None:
    """Delete what saves cut short left in `directory` (a SIGKILL mid-save): TensorFlow
    writes a checkpoint into `ckpt-<step>_temp/` and renames it into place when whole, and
    never looks at a leftover again; it can be as large as a checkpoint. Run before this
    process saves, so no save of its own is under way."""
    torn = [*directory.glob("ckpt-*_temp"), *directory.glob("ckpt-*.tempstate*")]
    for path in torn:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if torn:
        log.info("removed %s, left by a save cut short", ", ".join(sorted(p.name for p in torn)))


def _recover_state(directory: Path) -> None:
    """Rebuild a lost or unreadable `checkpoint` state file from the `ckpt-<step>.index`
    files in `directory`. TensorFlow ignores such a state file (a warning in the log),
    and the job would train again from step 0 over its own checkpoints."""
    state = tf.train.get_checkpoint_state(str(directory))
    if state is not None and state.all_model_checkpoint_paths:
        return
    steps = sorted(
        int(m.group(1))
        for m in (_INDEX.match(p.name) for p in directory.glob("ckpt-*.index"))
        if m is not None
    )
    if not steps:
        return
    was = "unreadable" if (directory / "checkpoint").exists() else "missing"
    _write_state(directory, steps)
    log.warning(
        "checkpoints/checkpoint was %s: rebuilt it from the checkpoint files (%s)",
        was,
        ", ".join(f"ckpt-{step}" for step in steps),
    )


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
        *,
        reading: Callable[[int], AbstractContextManager[None]] | None = None,
    ) -> None:
        """`reading`: what each restore runs inside, given the bytes of the checkpoint's
        data files (a preparation's `restoring checkpoint` stage, saying how far it is)."""
        items: dict[str, object] = {
            "model": trainer.model,
            "optimizer": trainer.optimizer,
            "step": trainer.step,
            "iterator": iterator,
            "seed_states": _seed_states(trainer.model),
        }
        if trainer.ema is not None:
            items["ema"] = trainer.ema
        if trainer.loss_scale is not None:
            items["loss_scale"] = trainer.loss_scale
        self.checkpoint = tf.train.Checkpoint(**items)
        # For a float16 model's checkpoint written before its step had a loss scale: the
        # rest restores, and the scale starts afresh (it finds its level in a few steps).
        self._without_loss_scale = (
            tf.train.Checkpoint(**{k: v for k, v in items.items() if k != "loss_scale"})
            if "loss_scale" in items
            else None
        )
        self.directory = directory
        self.spec = spec
        if directory.exists() and not directory.is_dir():
            # Else the job trains from step 0 and fails at its first save, steps later.
            raise NotADirectoryError(
                f"{directory.name}/ in the job's folder is a file, not a folder of "
                "checkpoints: move it away, then run the job again"
            )
        if directory.is_dir():
            _remove_torn_saves(directory)
            _recover_state(directory)
        self.manager = self._manager()
        self._trainer = trainer
        self._reading = reading
        self._last_step = -1
        self._last_time = time.monotonic()

    def _manager(self) -> tf.train.CheckpointManager:
        """A manager over the directory's state file as it is now."""
        return tf.train.CheckpointManager(
            self.checkpoint, str(self.directory), max_to_keep=self.spec.keep, checkpoint_name="ckpt"
        )

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
        """Restore the newest checkpoint that reads whole, if any; return its step.

        Damaged newer ones are set aside once an older one is restored. If every one is
        damaged, nothing is moved and `CheckpointDamaged` says so: training again from
        step 0 is the user's call.
        """
        damaged: list[tuple[int, CheckpointDamaged]] = []
        for step in reversed(self.steps()):
            try:
                restored = self.restore(step)
            except CheckpointDamaged as e:
                log.warning("%s; trying the one before it", e)
                damaged.append((step, e))
                continue
            if damaged:
                self.set_aside([s for s, _ in damaged])
            return restored
        if damaged:
            raise CheckpointDamaged(
                "Cannot resume: every checkpoint in checkpoints/ is damaged ("
                + "; ".join(str(e) for _, e in damaged)
                + "). To train it again from step 0, submit its spec as a new job (or, "
                "running it by hand, move checkpoints/ away)."
            )
        return None

    def restore(self, step: int) -> int:
        """Restore the checkpoint of `step` (one of `steps()`); return the step restored."""
        path = self._kept()[step]
        name = f"{Path(path).parent.name}/{Path(path).name}"
        reading = self._reading(data_bytes(path)) if self._reading else contextlib.nullcontext()
        try:
            with reading:
                self._restorer(path, name).restore(path).assert_existing_objects_matched()
        except Exception as e:
            damage = _damage(path)
            if damage is not None:
                raise CheckpointDamaged(f"{name} is damaged: {damage}") from e
            if not isinstance(e, (AssertionError, ValueError, tf.errors.OpError)):
                raise
            # TensorFlow names a variable and two shapes; say what that means for a job.
            # Without each variable's value, which TensorFlow prints in full.
            reason = re.sub(r",\s*numpy=.*?dtype=\w+\)>", ">", str(e), flags=re.DOTALL)
            raise CheckpointMismatch(
                f"Cannot resume from {name}: it does not fit this job's model or optimizer "
                "(did the spec, or the data's image shape or classes, change after it was "
                f"written? Use a new job dir). {reason}"
            ) from e
        self._last_step = int(self._trainer.step.numpy())
        self._last_time = time.monotonic()
        return self._last_step

    def _restorer(self, path: str, name: str) -> tf.train.Checkpoint:
        """What restores the checkpoint at `path`: the whole checkpoint, or, for one of a
        float16 model written before the step had a loss scale, all of it but the scale."""
        if self._without_loss_scale is None or any(
            key.startswith("loss_scale/")
            for key in tf.train.load_checkpoint(path).get_variable_to_shape_map()
        ):
            return self.checkpoint
        log.info(
            "%s holds no loss scale (written before float16 models had one): the scale "
            "starts at %g",
            name,
            INITIAL_SCALE,
        )
        return self._without_loss_scale

    def set_aside(self, steps: list[int]) -> None:
        """Move the damaged checkpoints of `steps` into `checkpoints/damaged/` (kept for a
        look, out of the state file, the service's listing and the manager's rotation)."""
        aside = self.directory / "damaged"
        aside.mkdir(exist_ok=True)
        for step in steps:
            for path in self.directory.glob(f"ckpt-{step}.*"):
                shutil.move(str(path), str(aside / path.name))
        _write_state(self.directory, [s for s in self.steps() if s not in steps])
        self.manager = self._manager()
        log.warning(
            "set aside damaged %s in checkpoints/damaged/",
            ", ".join(f"ckpt-{s}" for s in steps),
        )

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
