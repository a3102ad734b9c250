"""Dynamic loss scaling for a model that computes in float16, as Keras's `fit` does it.

Under Keras's `mixed_float16` policy a model's layers compute in float16, whose smallest
normal number is 6e-5: the backward pass flushes small gradients to zero or rounds them
coarsely. Keras's `fit` wraps such a model's optimizer in `LossScaleOptimizer`; the tower
step does the same arithmetic itself (trainer/towers.py). Wrapped, the optimizer would
lose the fused update kernels (trainer/updates.py fuses SGD, momentum and Adam), and its
`apply` refuses the cross-replica context a cluster applies its update in.

- each tower differentiates its objective times the scale, so the float16 backward pass
  works on values `scale` times larger;
- the towers' sum is checked for a non-finite value and divided by the scale (exactly, as
  the scale is a power of two) before anything else reads it;
- a step whose sum is finite is applied; one that is not is skipped (no weight, optimizer
  slot or iteration count moves, as Keras skips its inner optimizer, so the learning-rate
  schedule does not advance either) and halves the scale; `GROWTH_STEPS` finite steps in
  a row double it. A skipped step is still a step: the step counter, the batch-norm
  statistics (as in Keras, moved by the forward pass) and the EMA (of weights that did
  not move) go on as on any other.

The scale and its count of finite steps are variables, saved in the checkpoint, so a
resumed run goes on with the scale the interrupted one had.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import tensorflow as tf

# Keras's `LossScaleOptimizer` defaults (`initial_scale`, `dynamic_growth_steps`).
INITIAL_SCALE = 2.0**15
GROWTH_STEPS = 2000


def computes_in_float16(model: keras.Model) -> bool:
    """Whether any layer of `model` (the model itself included) computes in float16: then
    its gradients need loss scaling. A model may set the policy per layer, so the model's
    own says nothing of its layers'. bfloat16 has float32's range and needs none (Keras's
    `fit` scales only under `mixed_float16`)."""
    return any(
        getattr(layer.dtype_policy, "compute_dtype", None) == "float16"
        for layer in model._flatten_layers()
    )


def all_finite(grads: Sequence[tf.Tensor]) -> tf.Tensor:
    """True when no element of `grads` is inf or NaN (a scalar bool)."""
    return tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in grads]))


def unscaled(grad: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
    """`grad / scale`, as Keras divides it. A model whose weights are themselves float16
    has float16 gradients, whose type cannot hold a scale of 2**16 and above: those are
    divided in float32."""
    if grad.dtype in (tf.float16, tf.bfloat16):
        return tf.cast(tf.cast(grad, tf.float32) / scale, grad.dtype)
    return grad / tf.cast(scale, grad.dtype)


class LossScale(tf.Module):
    """The scale and its count of finite steps in a row, on `device`."""

    def __init__(self, device: str) -> None:
        super().__init__(name="loss_scale")
        with tf.device(device):
            self.scale = tf.Variable(INITIAL_SCALE, dtype=tf.float32, trainable=False, name="scale")
            self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="good_steps")

    def update(self, finite: tf.Tensor) -> None:
        """After a step: double the scale on its `GROWTH_STEPS`th finite step in a row, halve
        it on a step that was not finite (Keras's rule)."""
        grow = tf.logical_and(finite, tf.equal(self.good_steps, GROWTH_STEPS - 1))
        factor = tf.where(finite, tf.where(grow, 2.0, 1.0), 0.5)
        self.scale.assign(self.scale * factor)
        self.good_steps.assign(
            tf.where(tf.logical_and(finite, tf.logical_not(grow)), self.good_steps + 1, 0)
        )
