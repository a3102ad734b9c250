"""The SavedModel a successful job leaves in `export/`: what it takes and what it answers.

Two endpoints, both taking `images`, float32 of shape (batch, H, W, C) in [0, 1] as the
job trained on them (integer pixels divided by 255; float data as it was given):
- `serving_default` (TF Serving's default signature) answers a dict: `logits`,
  `probabilities` (softmax; for a one-logit binary model, the sigmoid of shape (batch, 1))
  and `classes` (the predicted class id, int32 of shape (batch,)).
- `serve` answers the logits alone, the one output of Keras's own `model.export`.
Both check each batch's shape against the job's image shape first, in the graph, as a
loaded signature does not (images of (batch, H, W) without their channel axis would
otherwise reach a convolution, which aborts the caller's whole process on a CPU host):
a wrong shape is an InvalidArgumentError naming the shape expected.
The weights are the EMA's when the job kept one. Beside the SavedModel, `model.json` says
all this of this export (its input's shape and pixel scale, what each output is, the class
ids, which weights, the step), as a file that whoever is handed the folder finds without
this service's README: a signature shows float32 and a shape, not that the pixels are to
be divided by 255 first. The directory is written whole under a temporary name and then
renamed, so a reader never sees half an export.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from trainer.rundir import write_json_atomic
from trainer.towers import TowerTrainer

DESCRIPTION = "model.json"  # beside saved_model.pb; loaders and TF Serving ignore it


def predictions(logits: tf.Tensor, binary: bool) -> dict[str, tf.Tensor]:
    """Logits, class probabilities and the predicted class of each example, in float32
    whatever the model computes in (as its loss was: `TowerTrainer._per_example`)."""
    logits = tf.cast(logits, tf.float32)
    if binary:
        probabilities = tf.sigmoid(logits)
        classes = tf.cast(tf.squeeze(logits, -1) > 0, tf.int32)
    else:
        probabilities = tf.nn.softmax(logits)
        classes = tf.argmax(logits, -1, output_type=tf.int32)
    return {"logits": logits, "probabilities": probabilities, "classes": classes}


def describe(
    trainer: TowerTrainer, image_shape: Sequence[int], *, classes: int, uint8_pixels: bool
) -> dict[str, Any]:
    """`model.json`: what the export takes and answers, in the words a user needs to feed it
    their own images and read its answers. `uint8_pixels`: the job's data held uint8 pixels,
    which it trained on divided by 255 (`trainer.data`); float data was fed as given."""
    height, width, channels = image_shape
    width_out = 1 if trainer.binary else classes
    if trainer.binary:
        outputs = {
            "logits": "float32 (batch, 1): the one logit, of class 1",
            "probabilities": "float32 (batch, 1): the sigmoid of the logit, the probability "
            "of class 1",
            "classes": "int32 (batch,): 1 where the logit is above 0, else 0",
        }
    else:
        outputs = {
            "logits": f"float32 (batch, {classes}): one per class id, before softmax",
            "probabilities": f"float32 (batch, {classes}): the softmax of the logits; "
            "column k is class id k",
            "classes": "int32 (batch,): the class id of the largest logit",
        }
    ema = trainer.ema
    return {
        "format": "towerboard-savedmodel",
        "version": 1,
        "step": int(trainer.step.numpy()),
        "inputs": {
            "images": {
                "dtype": "float32",
                "shape": [None, height, width, channels],
                "layout": "batch, height, width, channels (a channel axis even for gray images)",
                "range": [0.0, 1.0],
                "scaling": (
                    "the job's data was uint8 pixels, trained on divided by 255: divide "
                    "yours by 255 (0-255 values fed as they are give wrong answers, not an "
                    "error)"
                    if uint8_pixels
                    else "the job's data was float pixels in [0, 1], trained on as given: "
                    "give yours the same way"
                ),
            }
        },
        "classes": classes,
        "class_ids": f"0 to {classes - 1}: the label values of the job's data, as given",
        "signatures": {
            "serving_default": {"inputs": ["images"], "outputs": outputs},
            "serve": {
                "inputs": ["images"],
                "outputs": {"output_0": f"the logits alone, float32 (batch, {width_out})"},
            },
        },
        "inference": "dropout off, batch norm's moving statistics",
        "weights": "ema" if ema is not None else "trained",
        "ema_decay": ema.decay if ema is not None else None,
    }


def export_model(
    trainer: TowerTrainer,
    image_shape: Sequence[int],
    export_dir: Path,
    *,
    classes: int,
    uint8_pixels: bool,
) -> None:
    """Write `trainer.model` (EMA weights when enabled) as a SavedModel at `export_dir`,
    with its `model.json` (`describe`)."""
    model = trainer.model
    shape = [None, *image_shape]
    signature = [tf.TensorSpec(shape, tf.float32, name="images")]

    def logits(images: tf.Tensor) -> tf.Tensor:
        return model(tf.ensure_shape(images, shape), training=False)

    tmp = export_dir.with_name(f".{export_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    archive = keras.export.ExportArchive()
    archive.track(model)
    # Keras would alias the first endpoint as `serving_default`; naming one so keeps it
    # from doing that.
    archive.add_endpoint("serve", logits, input_signature=signature)
    archive.add_endpoint(
        "serving_default",
        lambda images: predictions(logits(images), trainer.binary),
        input_signature=signature,
    )
    with trainer.eval_weights():  # the variables' values are read as the archive is written
        archive.write_out(str(tmp), verbose=False)
    write_json_atomic(
        tmp / DESCRIPTION,
        describe(trainer, image_shape, classes=classes, uint8_pixels=uint8_pixels),
    )
    shutil.rmtree(export_dir, ignore_errors=True)
    os.replace(tmp, export_dir)
