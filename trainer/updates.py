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
    strategy: tf.distribute.Strategy | None = None,
) -> Apply:
    """A function `apply(grads, learning_rate)` that updates `variables` in place.

    `optimizer` must already be built on `variables`. `learning_rate` is the rate of this
    update (the schedule at the optimizer's iteration count); the iteration count goes up
    by one per call, as with `optimizer.apply_gradients`. `fused=False` always applies
    through Keras (the benchmark's comparison, or to rule the kernels out).

    Under a `strategy` (its variables mirrored), `apply` is called in cross-replica
    context with per-replica `grads` and `learning_rate`, and updates every copy of every
    variable with its own device's values.
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

    adam = kind is keras.optimizers.Adam
    # The kernels' constants, made once; one the optimizer lacks (SGD's betas) is never read.
    beta_1, beta_2, epsilon, momentum = (
        tf.constant(getattr(optimizer, name, 0.0) or 0.0, tf.float32)
        for name in ("beta_1", "beta_2", "epsilon", "momentum")
    )

    def beta_powers() -> tuple[tf.Tensor, ...]:
        """What Adam computes once per update for every variable; nothing for SGD."""
        if not adam:
            return ()
        t = tf.cast(optimizer.iterations + 1, tf.float32)
        return tf.pow(beta_1, t), tf.pow(beta_2, t)

    def kernel(
        var: keras.Variable, k: int, grad: tf.Tensor, lr: tf.Tensor, powers: tuple[tf.Tensor, ...]
    ) -> None:
        """Update variable `var` (slot index `k`). Its handles are read here, where it
        runs: under a strategy, that is the copy on this device."""
        # The kernels take their scalars in the variable's type: a custom model's float64
        # weights failed at step 1 with a TypeError. A cast to the same type is no op.
        dtype = grad.dtype
        lr = tf.cast(lr, dtype)
        if adam:
            beta_1_, beta_2_, epsilon_ = (tf.cast(c, dtype) for c in (beta_1, beta_2, epsilon))
            tf.raw_ops.ResourceApplyAdam(
                var=_handle(var), m=_handle(optimizer._momentums[k]), v=_handle(optimizer._velocities[k]),
                beta1_power=tf.cast(powers[0], dtype), beta2_power=tf.cast(powers[1], dtype), lr=lr,
                beta1=beta_1_, beta2=beta_2_, epsilon=epsilon_, grad=grad,
            )  # fmt: skip
        elif optimizer.momentum:
            tf.raw_ops.ResourceApplyKerasMomentum(
                var=_handle(var), accum=_handle(optimizer.momentums[k]), lr=lr, grad=grad,
                momentum=tf.cast(momentum, dtype), use_nesterov=optimizer.nesterov,
            )  # fmt: skip
        else:
            tf.raw_ops.ResourceApplyGradientDescent(var=_handle(var), alpha=lr, delta=grad)

    def fused_apply(grads: Sequence[tf.Tensor], learning_rate: tf.Tensor) -> None:
        prepared = beta_powers()
        for var, grad, k in zip(variables, grads, index, strict=True):
            if strategy is None:
                kernel(
                    var, k, tf.convert_to_tensor(grad), tf.cast(learning_rate, tf.float32), prepared
                )
            else:
                # Once per copy, on its device, with that device's gradient and rate: inside
                # `update`, every mirrored variable's handle is the copy on that device.
                strategy.extended.update(
                    var.value,
                    lambda _, grad, lr, var=var, k=k: kernel(
                        var, k, tf.convert_to_tensor(grad), tf.cast(lr, tf.float32), prepared
                    ),
                    args=(grad, learning_rate),
                    group=False,
                )
        for var in constrained:  # as Keras does, after the update
            var.assign(var.constraint(var))
        optimizer.iterations.assign_add(1)

    return fused_apply
