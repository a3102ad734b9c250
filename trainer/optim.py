"""Optimizers and learning-rate schedules (with linear warm-up) from the spec."""

from __future__ import annotations

import keras
import tensorflow as tf

from trainer.spec import OptimizerSpec


class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to the base schedule's initial rate, then the base schedule.

    The base schedule starts counting when warm-up ends, so a decay of `decay_steps` means
    the same thing with or without warm-up.
    """

    def __init__(
        self,
        base: keras.optimizers.schedules.LearningRateSchedule | float,
        warmup_steps: int,
        peak: float,
    ):
        self.base = base
        self.warmup_steps = warmup_steps
        self.peak = peak

    def __call__(self, step: tf.Tensor) -> tf.Tensor:
        step = tf.cast(step, tf.float32)
        after = step - self.warmup_steps
        base = self.base(after) if callable(self.base) else tf.constant(self.base, tf.float32)
        if not self.warmup_steps:
            return tf.cast(base, tf.float32)
        warm = self.peak * (step + 1.0) / float(self.warmup_steps)
        return tf.where(step < self.warmup_steps, warm, tf.cast(base, tf.float32))

    def get_config(self) -> dict:
        base = self.base
        if isinstance(base, keras.optimizers.schedules.LearningRateSchedule):
            base = keras.optimizers.schedules.serialize(base)
        return {"base": base, "warmup_steps": self.warmup_steps, "peak": self.peak}

    @classmethod
    def from_config(cls, config: dict) -> WarmupSchedule:
        base = config["base"]
        if isinstance(base, dict):
            base = keras.optimizers.schedules.deserialize(base)
        return cls(base, config["warmup_steps"], config["peak"])


def make_schedule(spec: OptimizerSpec) -> WarmupSchedule:
    """The learning rate as a function of the step, as the spec describes it."""
    lr, s = spec.learning_rate, spec.schedule
    schedules = keras.optimizers.schedules
    base: keras.optimizers.schedules.LearningRateSchedule | float
    if s.name == "constant":
        base = lr
    elif s.name == "exponential_decay":
        base = schedules.ExponentialDecay(lr, s.decay_steps, s.decay_rate, staircase=s.staircase)
    elif s.name == "polynomial":
        base = schedules.PolynomialDecay(lr, s.decay_steps, s.end_learning_rate, power=s.power)
    elif s.name == "cosine":
        base = schedules.CosineDecay(lr, s.decay_steps, alpha=s.alpha)
    else:  # the spec's Literal makes this unreachable; kept so a new name fails loudly
        raise ValueError(f"Unknown schedule {s.name!r}")
    return WarmupSchedule(base, spec.warmup_steps, lr)


def make_optimizer(spec: OptimizerSpec) -> keras.optimizers.Optimizer:
    """A Keras optimizer driven by the spec's schedule. Its `iterations` counts the updates
    applied: the step, less a float16 model's skipped steps (`trainer.lossscale`)."""
    schedule = make_schedule(spec)
    if spec.name == "sgd":
        return keras.optimizers.SGD(learning_rate=schedule)
    if spec.name == "momentum":
        return keras.optimizers.SGD(learning_rate=schedule, momentum=spec.momentum)
    if spec.name == "adam":
        return keras.optimizers.Adam(
            learning_rate=schedule, beta_1=spec.beta_1, beta_2=spec.beta_2, epsilon=spec.epsilon
        )
    raise ValueError(f"Unknown optimizer {spec.name!r}")
