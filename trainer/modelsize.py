"""How many parameters a built-in model has, from its spec alone (no TensorFlow here).

The caps on each width and layer count do not bound a model's size: 64 hidden layers of
65,536 are 275 billion parameters, a `cnn` with filters (65,536, 65,536) has a 155 GB
kernel. Such a worker dies building the model (the kernel's OOM killer, and the service
then runs it again). So the spec refuses a built-in model over `MAX_PARAMETERS` where its
size is known without reading data (the service's 422), and the worker checks again with
the real image shape and class count before it builds one (exit 2).

Counts are exact: what Keras's `count_params` gives for the model `trainer/models.py`
builds, batch-norm statistics included (tests/trainer/test_models.py holds the two together).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# 4 GiB of float32 weights; training holds about four times that (gradients, Adam's two
# slots). Far beyond what the built-in models are for (the classic cnn has 1.6 million).
MAX_PARAMETERS = 2**30


def _pooled(side: int) -> int:
    """A side after the cnn's 2x2 pool, which leaves a side of 1 pixel as it is."""
    return side // 2 if side >= 2 else 1


def parameter_count(
    name: str, params: Mapping[str, Any], input_shape: Sequence[int], num_classes: int
) -> int:
    """Parameters of built-in model `name` with validated `params` on (H, W, C) images."""
    height, width, channels = input_shape
    if name == "mlp":
        count, inputs = 0, height * width * channels
        for units in params["hidden"]:
            count += inputs * units + units
            inputs = units
        return count + inputs * num_classes + num_classes
    if name == "cnn":
        first, second = params["filters"]
        dense = params["dense"]
        pixels = _pooled(_pooled(height)) * _pooled(_pooled(width))
        return (
            (9 * channels * first + first)
            + (9 * first * second + second)
            + (pixels * second * dense + dense)
            + (dense * num_classes + num_classes)
        )
    if name == "resnet":
        base = params["width"]
        count = 9 * channels * base + 4 * base  # stem conv (no bias) and its batch norm
        inputs = base
        for stage, blocks in enumerate(params["blocks_per_stage"]):
            out = base * 2**stage
            for block in range(blocks):
                count += 9 * inputs * out + 4 * out + 9 * out * out + 4 * out
                if (stage > 0 and block == 0) or inputs != out:  # a projected shortcut
                    count += inputs * out + 4 * out
                inputs = out
        return count + inputs * num_classes + num_classes
    if name == "logistic":
        return math.prod(input_shape) + 1
    raise ValueError(f"Unknown built-in model {name!r}")


def too_large(
    name: str,
    params: Mapping[str, Any],
    input_shape: Sequence[int],
    num_classes: int,
    data: str | None = None,
) -> str | None:
    """Why the model is too large to train, or None when it fits under `MAX_PARAMETERS`.

    `data` says what the count is of, for the message (default: the shape and classes).
    """
    count = parameter_count(name, params, input_shape, num_classes)
    if count <= MAX_PARAMETERS:
        return None
    if data is None:
        shape = "x".join(str(side) for side in input_shape)
        data = f"on {shape} images of {num_classes} classes"
    return (
        f"Expected a model of at most {MAX_PARAMETERS:,} parameters (4 GiB of float32 weights). "
        f"Received: {name} with params {dict(params)} has {count:,} {data}"
    )
