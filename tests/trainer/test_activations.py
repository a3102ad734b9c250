"""The activation histograms' probe (`trainer.activations`), on real models and towers."""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.trainer.test_towers import CLASSES, SHAPE, batch, make_trainer
from trainer.activations import EXAMPLES, MAX_VALUES, _sampled, activation_probe


@pytest.mark.parametrize(
    "model, params",
    [
        ("cnn", {"filters": [4, 8], "dense": 16, "dropout": 0.5}),  # dropout's seed state
        ("resnet", {"width": 4, "blocks_per_stage": [1, 1]}),  # batch norm's statistics
    ],
)
def test_activation_probe_leaves_training_as_it_was(model: str, params: dict) -> None:
    # Run between two steps of one trainer and not the other: every variable (weights,
    # moving statistics, dropout's seeds, the optimizer's) ends bit for bit the same. In
    # training mode the probe would update batch norm's statistics and draw dropout seeds.
    probed, plain = (make_trainer(2, model=model, params=params) for _ in range(2))
    x, y = batch(24)
    for trainer in (probed, plain):
        trainer.train_step(x, y)
    probe = activation_probe(probed.model, probed.tower_devices[0])
    assert probe is not None
    outputs = probe(tf.constant(x))
    assert outputs and all(v.shape[0] == 24 for v in outputs.values())  # fewer than EXAMPLES
    for trainer in (probed, plain):
        trainer.train_step(*batch(24, seed=1))
    for a, b in zip(probed.model.variables, plain.model.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    for a, b in zip(probed.optimizer.variables, plain.optimizer.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


def test_activation_probe_charts_non_linearities_and_logits_of_the_first_examples() -> None:
    trainer = make_trainer(1, model="cnn", params={"filters": [4, 8], "dense": 16})
    model = trainer.model
    probe = activation_probe(model, "/CPU:1")
    assert probe is not None
    images = np.random.default_rng(0).random((EXAMPLES + 8, *SHAPE), dtype=np.float32)

    outputs = probe(tf.constant(images))

    # The two ReLU convs, the ReLU dense and the logits; not the pools, flatten or dropout.
    assert list(outputs) == [
        f"activations/{layer.name}"
        for layer in model.layers
        if layer.name.startswith(("conv2d", "dense", "logits"))
    ]
    assert all(v.shape[0] == EXAMPLES for v in outputs.values())
    # On the device it was given (tower 0's), as the model's compute in the step.
    assert all(v.device.endswith("/device:CPU:1") for v in outputs.values())
    # The logits are the model's own for those examples, in inference.
    np.testing.assert_allclose(
        outputs["activations/logits"], model(images[:EXAMPLES], training=False), rtol=1e-6
    )
    assert outputs["activations/logits"].shape == (EXAMPLES, CLASSES)


def test_activation_probe_of_a_sequential_model_with_activation_layers() -> None:
    model = keras.Sequential(
        [
            keras.Input(SHAPE),
            keras.layers.Flatten(),
            keras.layers.Dense(6),
            keras.layers.LeakyReLU(),
            keras.layers.Dense(CLASSES, name="out"),
        ]
    )
    probe = activation_probe(model, "/CPU:0")
    assert probe is not None

    outputs = probe(tf.zeros([3, *SHAPE]))

    leaky = next(layer.name for layer in model.layers if layer.name.startswith("leaky"))
    assert {tag: tuple(v.shape) for tag, v in outputs.items()} == {
        f"activations/{leaky}": (3, 6),
        "activations/out": (3, CLASSES),
    }


def test_a_zero_fraction_is_charted_for_each_rectifier_alone() -> None:
    # ReLUs of every spelling count their zeros; a leaky ReLU, a tanh and the logits never
    # put out 0 for a unit switched off, so a zero fraction of theirs would chart nothing.
    inputs = keras.Input(SHAPE)
    x = keras.layers.Flatten()(inputs)
    for layer in [
        keras.layers.Dense(4, activation="relu", name="relu_string"),
        keras.layers.Dense(4, activation=tf.nn.relu, name="relu_tf"),
        keras.layers.Dense(4, activation="relu6", name="relu6"),
        keras.layers.ReLU(name="relu_layer"),
        keras.layers.ReLU(threshold=0.5, name="relu_threshold"),
        keras.layers.Activation("relu", name="relu_activation"),
        keras.layers.Dense(4, activation=keras.layers.ReLU(), name="relu_as_activation"),
        keras.layers.Dense(4, activation=keras.layers.ReLU(negative_slope=0.2), name="leaky_as"),
        keras.layers.ReLU(negative_slope=0.1, name="leaky_slope"),
        keras.layers.LeakyReLU(name="leaky"),
        keras.layers.Dense(4, activation="tanh", name="tanh"),
    ]:
        x = layer(x)
    model = keras.Model(inputs, keras.layers.Dense(CLASSES, name="logits")(x))

    probe = activation_probe(model, "/CPU:0")

    assert probe is not None
    assert len(probe.tags) == 12  # every layer but the flatten
    rectifiers = ["relu_string", "relu_tf", "relu6", "relu_layer", "relu_threshold"]
    assert probe.zero_fractions == {
        f"activations/{name}": f"zero_fraction/{name}"
        for name in [*rectifiers, "relu_activation", "relu_as_activation"]
    }


def test_activation_probe_of_a_subclassed_model_is_none_and_says_why(caplog) -> None:
    class Subclassed(keras.Model):
        def __init__(self) -> None:
            super().__init__(name="mine")
            self.dense = keras.layers.Dense(CLASSES, activation="relu")

        def call(self, x):
            return self.dense(keras.ops.reshape(x, (-1, 64)))

    with caplog.at_level(logging.INFO, logger="trainer.activations"):
        assert activation_probe(Subclassed(), "/CPU:0") is None

    assert caplog.messages == [
        "activations: no histograms of mine's activations: it is a subclassed model, whose "
        "layers' outputs cannot be read (a functional or Sequential one's can)"
    ]


def test_a_layers_outputs_past_max_values_are_sampled_across_every_channel() -> None:
    # 5 examples of 64 x 64 x 64, each value its channel's index: 1.3M values, sampled to
    # every 3rd (prime to an example's 262,144). A stride a channel count divides (2, 4,
    # ..., 64) would draw some channels alone.
    channels = tf.broadcast_to(tf.range(64, dtype=tf.float32), [5, 64, 64, 64])

    sample = _sampled(channels).numpy()

    assert sample.ndim == 1 and 0 < sample.size <= MAX_VALUES
    counts = np.bincount(sample.astype(int), minlength=64)
    assert counts.max() - counts.min() <= 1, counts
    small = tf.zeros([EXAMPLES, 28, 28, 32])  # the `cnn`'s first conv: copied whole
    assert _sampled(small) is small


def test_activation_probe_leaves_out_layers_called_more_than_once(caplog) -> None:
    # `encoder` was called first on an input of its own (a model built from another's
    # layers): its `output` is of that graph, and a probe over it was refused by Keras
    # ("not connected to `inputs`"), failing the job at its first histograms. `twice` is
    # called twice in this model: its `output`, the first call's, is not all it puts out.
    encoder = keras.layers.Dense(6, activation="relu", name="encoder")
    keras.Model(own := keras.Input((int(np.prod(SHAPE)),)), encoder(own))
    twice = keras.layers.Dense(6, activation="relu", name="twice")
    images = keras.Input(SHAPE)
    hidden = twice(twice(encoder(keras.layers.Flatten()(images))))
    model = keras.Model(images, keras.layers.Dense(CLASSES, name="logits")(hidden))

    with caplog.at_level(logging.INFO, logger="trainer.activations"):
        probe = activation_probe(model, "/CPU:0")
    assert probe is not None

    outputs = probe(tf.zeros([3, *SHAPE]))

    assert list(outputs) == ["activations/logits"]
    np.testing.assert_allclose(outputs["activations/logits"], model(tf.zeros([3, *SHAPE])))
    assert caplog.messages == [
        "activations: no histograms of layers encoder, twice: each is called more than "
        "once, so has no one output to chart"
    ]
