"""Applying the averaged gradients: one fused TensorFlow kernel per variable.

Keras 3 writes its update rules as separate element-wise ops (Adam is about ten passes
over every parameter, momentum SGD five), and TensorFlow on a CPU or without XLA runs each
as its own pass over memory. TensorFlow's training kernels (`ResourceApplyAdam`,
`ResourceApplyKerasMomentum`, `ResourceApplyGradientDescent`) do the same arithmetic, in
the same order, in one pass. On the `cnn` model (1.6M parameters) that takes an Adam
update from 5.0 to 2.5 ms and a momentum update from 3.1 to 2.2 ms on the benchmark
machine (docs/benchmarks.md).

The Keras optimizer stays the owner of the state: its slot variables, iteration count and
learning-rate schedule are the ones updated, so checkpoints are the same either way. An
optimizer with a feature the kernels do not have (Keras-side clipping, weight decay, EMA,
gradient accumulation, loss scaling, AMSGrad, or an unknown class) is applied through
Keras, unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import keras
import tensorflow as tf

log = logging.getLogger(__name__)

Apply = Callable[[Sequence[tf.Tensor], tf.Tensor], None]


def _keras_only_features(optimizer: keras.optimizers.Optimizer) -> list[str]:
    """The optimizer's settings that the fused kernels do not implement."""
    features = {
        "clipnorm": optimizer.clipnorm,
        "clipvalue": optimizer.clipvalue,
        "global_clipnorm": optimizer.global_clipnorm,
        "weight_decay": optimizer.weight_decay,
        "use_ema": optimizer.use_ema,
        "gradient_accumulation_steps": optimizer.gradient_accumulation_steps,
        "loss_scale_factor": optimizer.loss_scale_factor,
        "amsgrad": getattr(optimizer, "amsgrad", False),
    }
    return [name for name, value in features.items() if value]


def _handle(variable: keras.Variable) -> tf.Tensor:
    return variable.value.handle


def make_apply(
    optimizer: keras.optimizers.Optimizer,
    variables: Sequence[keras.Variable],
    *,
    fused: bool = True,
) -> Apply:
    """A function `apply(grads, learning_rate)` that updates `variables` in place.

    `optimizer` must already be built on `variables`. `learning_rate` is the rate of this
    update (the schedule at the optimizer's iteration count); the iteration count goes up
    by one per call, as with `optimizer.apply_gradients`. `fused=False` always applies
    through Keras (the benchmark's comparison, or to rule the kernels out).
    """
    variables = list(variables)
    kind = type(optimizer)
    keras_only = _keras_only_features(optimizer)
    if not fused or keras_only or kind not in (keras.optimizers.SGD, keras.optimizers.Adam):
        if fused:
            log.info(
                "updates through Keras: %s",
                ", ".join(keras_only) or f"no fused kernel for {kind.__name__}",
            )

        def keras_apply(grads: Sequence[tf.Tensor], learning_rate: tf.Tensor) -> None:
            optimizer.apply_gradients(zip(grads, variables, strict=True))

        return keras_apply

    index = [optimizer._get_variable_index(v) for v in variables]
    constrained = [v for v in variables if v.constraint is not None]

    if kind is keras.optimizers.Adam:
        beta_1, beta_2, epsilon = (
            tf.constant(x, tf.float32)
            for x in (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon)
        )

        def update(grads: Sequence[tf.Tensor], learning_rate: tf.Tensor) -> None:
            t = tf.cast(optimizer.iterations + 1, tf.float32)
            beta_1_power, beta_2_power = tf.pow(beta_1, t), tf.pow(beta_2, t)
            for var, grad, k in zip(variables, grads, index, strict=True):
                tf.raw_ops.ResourceApplyAdam(
                    var=_handle(var), m=_handle(optimizer._momentums[k]), v=_handle(optimizer._velocities[k]),
                    beta1_power=beta_1_power, beta2_power=beta_2_power, lr=learning_rate,
                    beta1=beta_1, beta2=beta_2, epsilon=epsilon, grad=grad,
                )  # fmt: skip

    elif optimizer.momentum:
        momentum = tf.constant(optimizer.momentum, tf.float32)

        def update(grads: Sequence[tf.Tensor], learning_rate: tf.Tensor) -> None:
            for var, grad, k in zip(variables, grads, index, strict=True):
                tf.raw_ops.ResourceApplyKerasMomentum(
                    var=_handle(var), accum=_handle(optimizer.momentums[k]), lr=learning_rate, grad=grad,
                    momentum=momentum, use_nesterov=optimizer.nesterov,
                )  # fmt: skip

    else:

        def update(grads: Sequence[tf.Tensor], learning_rate: tf.Tensor) -> None:
            for var, grad in zip(variables, grads, strict=True):
                tf.raw_ops.ResourceApplyGradientDescent(
                    var=_handle(var), alpha=learning_rate, delta=grad
                )

    def fused_apply(grads: Sequence[tf.Tensor], learning_rate: tf.Tensor) -> None:
        update([tf.convert_to_tensor(g) for g in grads], tf.cast(learning_rate, tf.float32))
        for var in constrained:  # as Keras does, after the update
            var.assign(var.constraint(var))
        optimizer.iterations.assign_add(1)

    return fused_apply
