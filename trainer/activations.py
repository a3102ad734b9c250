"""What a model's non-linearities put out, for the `activations/` histograms.

Dead ReLUs (a layer whose outputs are all 0), saturation and activations that grow step
after step show here before they show in the loss. The probe is a Keras model over the
trained model's own layers, with their outputs as its outputs: no variable of its own,
no copy of the weights. It runs in inference (`training=False`), so batch norm reads its
moving statistics and updates none, dropout drops nothing and no seed advances: a job
with these histograms trains bit for bit as one without.

Charted: each layer that applies a non-linearity (an activation layer such as `ReLU`, or
a layer given an `activation` other than linear, as `Dense(512, activation="relu")`),
and the model's output (the logits). A conv without an activation, batch norm and
pooling are left out: their outputs are charted where the next non-linearity takes them.
So is a layer called more than once (shared), which has no one output (logged).

A rectifier's histogram says little of its dead units: its spike at 0 dwarfs the rest, and a
histogram does not say which units sit there. So each layer that rectifies (ReLU, ReLU6)
also gets a `zero_fraction/<layer>` scalar beside it: the fraction of the same outputs that
are exactly 0, counted with the bucketing (the classic multi-GPU CIFAR-10 trainer's
`sparsity`). Climbing toward 1 step after step, a layer is going dead.

Cost: one eager forward pass of at most `EXAMPLES` examples (tower 0's first, the
examples its `inputs` images show) on tower 0's device at each histograms step, and a
host copy of each output, bucketed on the summaries' background thread with the weights
and gradients. For the `cnn` at 32 examples: 1.2M values, against the 3.3M of its
weights and gradients. A layer's outputs past `MAX_VALUES` are sampled on the device
before the copy (`_sampled`): a conv of 64 channels at 224 x 224 gives 103M values for
32 examples, 411 MB a copy, and seconds of bucketing, where a sample of 1M draws the
same histogram.
"""

from __future__ import annotations

import logging
import math

import keras
import tensorflow as tf

log = logging.getLogger(__name__)

# Examples the probe runs on: enough for a histogram of each layer's outputs (a `cnn`'s
# first conv alone gives 800,000 values of 32), and a cost that does not grow with the batch.
EXAMPLES = 32

# Values a layer's histogram is drawn from at most (a bucketing chunk's worth: 4 MB of
# float32 a copy); the built-in models' layers give fewer at 28 x 28, and are copied whole.
MAX_VALUES = 1 << 20

# Layers that are a non-linearity and nothing else (`PReLU` learns its slope, and counts).
_ACTIVATION_LAYERS = (
    keras.layers.Activation,
    keras.layers.ReLU,
    keras.layers.LeakyReLU,
    keras.layers.ELU,
    keras.layers.PReLU,
    keras.layers.Softmax,
)


# Activations that put out exactly 0 for every input below a threshold: Keras's and
# `tf.nn`'s alike, by name (`Dense(activation=tf.nn.relu)` is as common as "relu").
_RECTIFIERS = frozenset({"relu", "relu6"})


def _applies_non_linearity(layer: keras.layers.Layer) -> bool:
    if isinstance(layer, _ACTIVATION_LAYERS):
        return True
    activation = getattr(layer, "activation", None)
    return callable(activation) and activation is not keras.activations.linear


def _rectifies(layer: keras.layers.Layer) -> bool:
    """Whether `layer`'s outputs are 0 wherever its input is below a threshold, so that
    their zero fraction counts units switched off (a leaky one's are never 0)."""
    activation = getattr(layer, "activation", None)
    for relu in (layer, activation):  # a `ReLU` layer, or one given as an activation
        if isinstance(relu, keras.layers.ReLU):
            return not relu.negative_slope
    return getattr(activation, "__name__", None) in _RECTIFIERS


class ActivationProbe:
    """The outputs of a model's charted layers (see the module doc) for some images."""

    def __init__(self, model: keras.Model, device: str, layers: list[str]) -> None:
        """Use `activation_probe`, which says why a model has none."""
        outputs = [model.get_layer(name).output for name in layers]
        self.tags = [f"activations/{name}" for name in layers]
        # Each rectifier's histogram tag, and its `zero_fraction/` scalar's (the module doc).
        self.zero_fractions = {
            f"activations/{name}": f"zero_fraction/{name}"
            for name in layers
            if _rectifies(model.get_layer(name))
        }
        self._probe = keras.Model(model.inputs, outputs, name=f"{model.name}_activations")
        self._device = device

    def warm(self) -> None:
        """One call on `EXAMPLES` blank images, its outputs read back: the first eager call
        of a worker's ops takes 20-35 ms here (the `cnn`, the `mlp`), 1.5-6 after, so the
        job's start pays it and its first histograms step does not. Of the shape most
        calls take: a kernel is made for its shapes (one image left the next call of 32
        at 10-19 ms)."""
        blank = tf.zeros([EXAMPLES, *self._probe.inputs[0].shape[1:]])
        for values in self(blank).values():
            values.numpy()

    def __call__(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
        """The charted layers' outputs for the first `EXAMPLES` of `images`, by tag.

        Eager: a `tf.function` of it took 100-120 ms to trace at a worker's first
        histograms (the `cnn`, the `resnet`), where eager calls take 30-45 ms the first
        time and 3-13 ms more than a traced one after, so a job pays less eagerly up to
        about 12,000 steps at the default cadence, and a GPU job of 1000 steps 70 ms less
        (2% of its 3.8 s on an H200). Its ops, unnamed by any `tower_i` scope, are not
        counted in a trace's tower times (`profiling.tower_times_ms`)."""
        with tf.device(self._device):
            # A list of one output comes back as the tensor alone.
            outputs = tf.nest.flatten(self._probe(images[:EXAMPLES], training=False))
            return dict(zip(self.tags, map(_sampled, outputs), strict=True))


def _sampled(values: tf.Tensor) -> tf.Tensor:
    """`values` as they are, or, past `MAX_VALUES`, every s-th of them, flattened: s is
    prime to an example's size, so the sample draws every channel and position alike
    (a stride that a channel count divides would draw one channel alone)."""
    count = math.prod(values.shape)
    if count <= MAX_VALUES:
        return values
    per_example = math.prod(values.shape[1:])
    stride = math.ceil(count / MAX_VALUES)
    while math.gcd(stride, per_example) != 1:
        stride += 1
    return tf.reshape(values, [-1])[::stride]


def activation_probe(model: keras.Model, device: str) -> ActivationProbe | None:
    """A probe of `model`'s activations on `device`, or None (logged, with why) for a
    model whose layers' outputs cannot be read: a subclassed model (its `call` is Python,
    with no graph of layers to read them from)."""
    if not getattr(model, "inputs", None):  # a subclassed model has no `inputs`
        log.info(
            "activations: no histograms of %s's activations: it is a subclassed model, "
            "whose layers' outputs cannot be read (a functional or Sequential one's can)",
            model.name,
        )
        return None
    layers: list[str] = []
    shared: list[str] = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        if len(layer._inbound_nodes) != 1:
            # Called more than once: it has as many outputs, and Keras's `output` is its
            # first call's, which may be in another model's graph (a layer called first
            # on an input of its own): a probe over that one was refused by Keras, and
            # the job failed at its first histograms.
            shared.append(layer.name)
            continue
        if _applies_non_linearity(layer) or any(layer.output is o for o in model.outputs):
            layers.append(layer.name)
    if shared:
        log.info(
            "activations: no histograms of layers %s: each is called more than once, "
            "so has no one output to chart",
            ", ".join(shared),
        )
    return ActivationProbe(model, device, layers)
