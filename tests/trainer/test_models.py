"""The model registry: built-in models on any image size."""

import numpy as np
import pytest

from trainer.models import build_model
from trainer.spec import ModelSpec


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 3, 1), (1, 9, 3), (2, 5, 2)])
def test_cnn_builds_and_runs_on_small_images(shape):
    # Two 2x2 pools took a 3x3 image to nothing: Keras refused to build it with a page of
    # message, while the contract says images of any height and width work.
    model = build_model(ModelSpec(name="cnn", params={"filters": [4, 8], "dense": 8}), shape, 3)
    assert model(np.zeros((2, *shape), np.float32)).shape == (2, 3)


def test_cnn_on_mnist_sized_images_is_the_classic_model():
    # The small-image change must not touch the model that checkpoints already exist for.
    model = build_model(ModelSpec(name="cnn"), (28, 28, 1), 10)
    pools = [layer for layer in model.layers if "pooling" in layer.name]
    assert [layer.output.shape[1:3] for layer in pools] == [(14, 14), (7, 7)]
    assert model.count_params() == 1_630_090  # as before the change
