"""Exponential moving average of the trainable weights, used for eval and export."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import tensorflow as tf


class WeightEMA(tf.Module):
    """Shadow copies of `variables`, on the parameter device, updated after each step.

    The effective decay ramps up as `min(decay, (1 + step) / (10 + step))`, as
    `tf.train.ExponentialMovingAverage` does with `num_updates`, so early shadows are not
    dominated by the random initialisation.
    """

    def __init__(self, variables: Sequence[tf.Variable], decay: float, device: str) -> None:
        super().__init__(name="ema")
        if not 0.0 < decay < 1.0:
            raise ValueError(f"Expected `decay` in (0, 1). Received: decay={decay}")
        self.decay = decay
        self._keep_untracked(variables)
        with tf.device(device):
            self.shadows = [
                tf.Variable(tf.convert_to_tensor(v), trainable=False, name=f"ema_{i}")
                for i, v in enumerate(self._variables)
            ]

    @tf.__internal__.tracking.no_automatic_dependency_tracking
    def _keep_untracked(self, variables: Sequence[tf.Variable]) -> None:
        # The model's own variables, not the module's: tracked, a checkpoint holding the
        # module named the trained weights `ema/_variables/<i>` (TensorFlow keys a variable
        # by its shortest path), which anyone reading it by name takes for the averages.
        # Untracked, they are keyed by the optimizer's or the model's path, as without an
        # EMA; a checkpoint written before restores the same, as it matches by object.
        self._variables = list(variables)

    def update(self, step: tf.Tensor) -> None:
        step = tf.cast(step, tf.float32)
        decay = tf.minimum(self.decay, (1.0 + step) / (10.0 + step))
        for shadow, var in zip(self.shadows, self._variables, strict=True):
            # In the shadow's type: a custom model's float64 weights met a float32 decay.
            d = tf.cast(decay, shadow.dtype)
            shadow.assign(d * shadow + (1.0 - d) * tf.convert_to_tensor(var))

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Use the averaged weights inside the block; the trained ones come back after."""
        backup = [tf.identity(tf.convert_to_tensor(v)) for v in self._variables]
        for var, shadow in zip(self._variables, self.shadows, strict=True):
            var.assign(shadow)
        try:
            yield
        finally:
            for var, saved in zip(self._variables, backup, strict=True):
                var.assign(saved)
