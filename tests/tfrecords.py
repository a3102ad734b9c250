"""TFRecord files as TensorFlow writes them, for the worker's reader and the service's check."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import tensorflow as tf


def write_tfrecord(
    path: Path, x: np.ndarray, y: np.ndarray | list[int], shape_features: str = "hwc"
) -> Path:
    """`image_raw` bytes, `label`, and `pixels` or `height`/`width`/`channels` per record
    (gzip'd where the name ends `.gz`, in any case)."""

    def ints(*values: int) -> tf.train.Feature:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))

    features = []
    for image, label in zip(x, y, strict=True):
        feature = {
            "image_raw": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[image.astype(np.uint8).tobytes()])
            ),
            "label": ints(int(label)),
        }
        if shape_features == "pixels":
            feature["pixels"] = ints(image.size)
        elif shape_features == "hwc":
            height, width, channels = image.shape
            feature |= {"height": ints(height), "width": ints(width), "channels": ints(channels)}
        features.append(feature)
    return write_examples(path, features)


def write_examples(path: Path, features: Sequence[Mapping[str, tf.train.Feature]]) -> Path:
    """One `tf.train.Example` of each feature map per record (gzip'd where named `.gz`)."""

    gz = path.name.lower().endswith(".gz")
    options = tf.io.TFRecordOptions(compression_type="GZIP" if gz else "")
    with tf.io.TFRecordWriter(str(path), options) as writer:
        for feature in features:
            example = tf.train.Example(features=tf.train.Features(feature=dict(feature)))
            writer.write(example.SerializeToString())
    return path
