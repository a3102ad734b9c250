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
The weights are the EMA's when the job kept one. The directory is written whole under a
temporary name and then renamed, so a reader never sees half an export.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import keras
import tensorflow as tf

from trainer.towers import TowerTrainer


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


def export_model(trainer: TowerTrainer, image_shape: Sequence[int], export_dir: Path) -> None:
    """Write `trainer.model` (EMA weights when enabled) as a SavedModel at `export_dir`."""
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
    shutil.rmtree(export_dir, ignore_errors=True)
    os.replace(tmp, export_dir)
