"""The SavedModel a job exports: its endpoints answer what the trained model answers, with
the EMA's weights when the job kept one."""

import json
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.trainer.test_towers import CLASSES, SHAPE, batch, make_trainer
from trainer.export import export_model
from trainer.models import build_model
from trainer.optim import make_optimizer
from trainer.spec import ModelSpec, OptimizerSpec
from trainer.towers import TowerTrainer


def test_export_serving_default_answers_logits_probabilities_and_classes(tmp_path: Path) -> None:
    trainer = make_trainer(2, lr=0.5)
    x, y = batch(32)
    for _ in range(3):
        trainer.train_step(x, y)
    expected = trainer.model(x, training=False).numpy()

    export_model(trainer, SHAPE, tmp_path / "export", classes=CLASSES, uint8_pixels=False)

    loaded = tf.saved_model.load(str(tmp_path / "export"))
    assert not (tmp_path / ".export.tmp").exists()
    np.testing.assert_allclose(loaded.serve(x).numpy(), expected, atol=1e-6)
    answer = loaded.signatures["serving_default"](images=tf.constant(x))
    assert set(answer) == {"logits", "probabilities", "classes"}
    np.testing.assert_allclose(answer["logits"].numpy(), expected, atol=1e-6)
    probabilities = answer["probabilities"].numpy()
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(probabilities, tf.nn.softmax(expected).numpy(), atol=1e-6)
    assert answer["classes"].dtype == tf.int32
    np.testing.assert_array_equal(answer["classes"].numpy(), expected.argmax(-1))


def test_keras_takes_the_export_as_a_layer_as_the_readme_says(tmp_path: Path) -> None:
    # Keras 3's load_model reads no SavedModel; README points to TFSMLayer instead.
    trainer = make_trainer(2, lr=0.5, model="resnet")  # batch norm: inference mode shows
    x, y = batch(32)
    for _ in range(3):
        trainer.train_step(x, y)
    expected = trainer.model(x, training=False).numpy()
    export_model(trainer, SHAPE, tmp_path / "export", classes=CLASSES, uint8_pixels=False)

    logits = keras.layers.TFSMLayer(str(tmp_path / "export"), call_endpoint="serve")
    inputs = keras.Input(SHAPE)
    wrapped = keras.Model(inputs, logits(inputs))
    np.testing.assert_allclose(wrapped(x).numpy(), expected, atol=1e-5)
    answer = keras.layers.TFSMLayer(str(tmp_path / "export"), call_endpoint="serving_default")(x)
    np.testing.assert_array_equal(answer["classes"].numpy(), expected.argmax(-1))


def test_export_holds_the_ema_weights(tmp_path: Path) -> None:
    trainer = make_trainer(2, lr=0.5, ema_decay=0.9)
    x, y = batch(32)
    for _ in range(3):
        trainer.train_step(x, y)
    raw = trainer.model(x, training=False).numpy()
    assert trainer.ema is not None
    with trainer.ema.swapped_in():
        averaged = trainer.model(x, training=False).numpy()
    assert np.abs(raw - averaged).max() > 1e-3  # otherwise this test could not tell them apart

    export_model(trainer, SHAPE, tmp_path / "export", classes=CLASSES, uint8_pixels=False)

    loaded = tf.saved_model.load(str(tmp_path / "export"))
    np.testing.assert_allclose(loaded.serve(x).numpy(), averaged, atol=1e-6)
    # Exporting put the trained weights back.
    np.testing.assert_allclose(trainer.model(x, training=False).numpy(), raw, atol=1e-6)


def test_export_of_a_binary_model_answers_sigmoid_and_a_class_per_example(tmp_path: Path) -> None:
    keras.utils.set_random_seed(3)
    with tf.device("/CPU:0"):
        trainer = TowerTrainer(
            model=build_model(ModelSpec(name="logistic"), SHAPE, 2).model,
            optimizer=make_optimizer(OptimizerSpec(name="sgd", learning_rate=0.5)),
            tower_devices=["/CPU:0", "/CPU:1"],
            parameter_device="/CPU:0",
            binary=True,
        )
    x, _ = batch(16)
    y = (x.reshape(16, -1).mean(-1) > 0.5).astype(np.int32)
    trainer.train_step(x, y)
    logits = trainer.model(x, training=False).numpy()

    export_model(trainer, SHAPE, tmp_path / "export", classes=2, uint8_pixels=False)

    answer = tf.saved_model.load(str(tmp_path / "export")).signatures["serving_default"](
        images=tf.constant(x)
    )
    assert answer["probabilities"].shape == (16, 1)
    np.testing.assert_allclose(
        answer["probabilities"].numpy(), tf.sigmoid(logits).numpy(), atol=1e-6
    )
    assert answer["classes"].shape == (16,)
    np.testing.assert_array_equal(answer["classes"].numpy(), (logits[:, 0] > 0).astype(np.int32))


def test_export_replaces_an_earlier_export_whole(tmp_path: Path) -> None:
    # A worker restarted after dying mid-export writes the export again over what it left.
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "stale.txt").write_text("left by a killed worker")
    (tmp_path / ".export.tmp").mkdir()
    (tmp_path / ".export.tmp" / "half.pb").write_text("half written")
    export_model(make_trainer(1), SHAPE, tmp_path / "export", classes=CLASSES, uint8_pixels=False)
    assert not (tmp_path / "export" / "stale.txt").exists()
    assert (tmp_path / "export" / "saved_model.pb").exists()
    assert not (tmp_path / ".export.tmp").exists()


def test_export_refuses_images_of_another_shape_naming_the_one_it_takes(tmp_path: Path) -> None:
    # A loaded signature does not check its input's shape: images without their channel
    # axis reached the model (a CPU convolution then aborts the caller's process; an mlp
    # flattened them and answered as if nothing were wrong).
    export_model(make_trainer(1), SHAPE, tmp_path / "export", classes=CLASSES, uint8_pixels=False)
    loaded = tf.saved_model.load(str(tmp_path / "export"))
    x, _ = batch(4)
    for wrong in (x[..., 0], np.zeros((4, 9, 9, 1), np.float32)):
        for endpoint in ("serving_default", "serve"):
            with pytest.raises(
                tf.errors.InvalidArgumentError, match=r"expected shape \[\?,8,8,1\]"
            ):
                loaded.signatures[endpoint](images=tf.constant(wrong))
    assert loaded.signatures["serve"](images=tf.constant(x))["output_0"].shape == (4, CLASSES)


def test_export_model_json_says_what_the_signatures_take_and_answer(tmp_path: Path) -> None:
    # A signature shows float32 and a shape, not that the job's uint8 pixels were divided
    # by 255: fed 0-255 values, the model answers wrongly and says nothing.
    trainer = make_trainer(2, lr=0.5, ema_decay=0.9)
    x, y = batch(32)
    for _ in range(3):
        trainer.train_step(x, y)

    export_model(trainer, SHAPE, tmp_path / "export", classes=CLASSES, uint8_pixels=True)

    about = json.loads((tmp_path / "export" / "model.json").read_text())
    loaded = tf.saved_model.load(str(tmp_path / "export"))
    images = about["inputs"]["images"]
    for name, described in about["signatures"].items():
        signature = loaded.signatures[name]
        spec = signature.structured_input_signature[1]["images"]
        assert described["inputs"] == ["images"] and spec.name == "images"
        assert images["shape"] == spec.shape.as_list() == [None, *SHAPE]
        assert images["dtype"] == spec.dtype.name == "float32"
        assert set(described["outputs"]) == set(signature.structured_outputs), name
    assert images["range"] == [0.0, 1.0]
    assert "divide yours by 255" in images["scaling"]
    assert about["classes"] == CLASSES and about["class_ids"].startswith("0 to 3:")
    outputs = about["signatures"]["serving_default"]["outputs"]
    assert outputs["probabilities"].endswith("column k is class id k")
    assert about["step"] == 3
    assert (about["weights"], about["ema_decay"]) == ("ema", 0.9)


def test_export_model_json_of_trained_weights_float_pixels_and_one_logit(tmp_path: Path) -> None:
    keras.utils.set_random_seed(3)
    with tf.device("/CPU:0"):
        trainer = TowerTrainer(
            model=build_model(ModelSpec(name="logistic"), SHAPE, 2).model,
            optimizer=make_optimizer(OptimizerSpec(name="sgd", learning_rate=0.5)),
            tower_devices=["/CPU:0"],
            parameter_device="/CPU:0",
            binary=True,
        )

    export_model(trainer, SHAPE, tmp_path / "export", classes=2, uint8_pixels=False)

    about = json.loads((tmp_path / "export" / "model.json").read_text())
    assert (about["weights"], about["ema_decay"], about["step"]) == ("trained", None, 0)
    assert "float pixels in [0, 1], trained on as given" in about["inputs"]["images"]["scaling"]
    outputs = about["signatures"]["serving_default"]["outputs"]
    assert outputs["probabilities"].startswith("float32 (batch, 1): the sigmoid")
    assert about["signatures"]["serve"]["outputs"]["output_0"].endswith("(batch, 1)")
