"""The model registry: builders keyed by the names in `trainer.spec.MODEL_NAMES`.

A builder takes the input shape (H, W, C), the class count and the validated params, and
returns a Keras model that outputs logits: `num_classes` of them, or one for `logistic`
(a custom model on two-class data may also give one: a sigmoid logit).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras.src.models.functional import Functional  # a functional model's class (no public name)

from trainer.errors import innermost_frame, one_line
from trainer.modelsize import too_large
from trainer.spec import ModelSpec

log = logging.getLogger(__name__)


class ModelError(ValueError):
    """A model that cannot be built from its spec (bad custom builder, wrong data)."""


def _mlp(
    input_shape: tuple[int, ...], num_classes: int, hidden: list[int], dropout: float
) -> keras.Model:
    inputs = keras.Input(input_shape, name="images")
    x = keras.layers.Flatten()(inputs)
    for width in hidden:
        x = keras.layers.Dense(width, activation="relu")(x)
        if dropout:
            x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, name="logits")(x), name="mlp")


def _halve(x: keras.KerasTensor) -> keras.KerasTensor:
    """A 2x2 max-pool of each side that has 2 pixels or more.

    A side of 1 pixel is left as it is: a 2x2 pool would leave it no pixels, which Keras
    refuses to build, and the contract says images of any size train. Images whose sides
    are all 2 or more get exactly the classic model, so their checkpoints still fit.
    """
    height, width = x.shape[1], x.shape[2]
    size = (min(2, height), min(2, width))
    return x if size == (1, 1) else keras.layers.MaxPooling2D(pool_size=size)(x)


def _cnn(
    input_shape: tuple[int, ...],
    num_classes: int,
    filters: tuple[int, int],
    dense: int,
    dropout: float,
) -> keras.Model:
    inputs = keras.Input(input_shape, name="images")
    x = keras.layers.Conv2D(filters[0], 3, padding="same", activation="relu")(inputs)
    x = _halve(x)
    x = keras.layers.Conv2D(filters[1], 3, padding="same", activation="relu")(x)
    x = _halve(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(dense, activation="relu")(x)
    if dropout:
        x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, name="logits")(x), name="cnn")


@keras.saving.register_keras_serializable(package="towerboard")
class StridedPointwiseConv(keras.layers.Conv2D):
    """A 1x1 convolution with a stride, as a strided slice and then a 1x1 convolution:
    the same values, and the same variables (a checkpoint of either restores into the
    other). oneDNN's backward pass of a strided 1x1 convolution crashes the whole process
    (a double free, or a segfault) on a batch of odd size with few input channels, as
    8 of a `resnet` of width 8 has (TensorFlow 2.21 on an x86 CPU); an uneven split over
    towers, or an epoch's last batch, gives such batches."""

    def __init__(self, filters: int, stride: int, **kwargs: Any) -> None:
        kwargs.pop("kernel_size", None)
        kwargs.pop("strides", None)
        super().__init__(filters, 1, **kwargs)
        self.stride = stride

    def call(self, inputs: Any) -> Any:
        return super().call(inputs[:, :: self.stride, :: self.stride, :])

    def compute_output_shape(self, input_shape: tuple[int | None, ...]) -> tuple[int | None, ...]:
        batch, height, width, _ = input_shape
        step = self.stride
        return (
            batch,
            None if height is None else -(-height // step),
            None if width is None else -(-width // step),
            self.filters,
        )

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "stride": self.stride}


def _resnet(
    input_shape: tuple[int, ...],
    num_classes: int,
    width: int,
    blocks_per_stage: list[int],
    bn_momentum: float,
) -> keras.Model:
    # Each layer named for its place (`stage2_block1_conv1`), not by Keras's counters
    # (`conv2d_3`, `re_lu_4`), which said nothing of where a layer sat: the names a job's
    # TensorBoard tags (`weights/`, `gradients/`, `activations/`) are read by. A checkpoint
    # holds the layers by their order, so one of the counters' names restores the same.
    def bn(name: str) -> keras.layers.Layer:
        return keras.layers.BatchNormalization(momentum=bn_momentum, name=name)

    inputs = keras.Input(input_shape, name="images")
    x = keras.layers.Conv2D(width, 3, padding="same", use_bias=False, name="stem_conv")(inputs)
    x = keras.layers.ReLU(name="stem_relu")(bn("stem_bn")(x))
    for stage, blocks in enumerate(blocks_per_stage):
        channels = width * 2**stage
        for block in range(blocks):
            at = f"stage{stage + 1}_block{block + 1}"
            stride = 2 if stage > 0 and block == 0 else 1
            shortcut = x
            y = keras.layers.Conv2D(
                channels, 3, strides=stride, padding="same", use_bias=False, name=f"{at}_conv1"
            )(x)
            y = keras.layers.ReLU(name=f"{at}_relu1")(bn(f"{at}_bn1")(y))
            y = keras.layers.Conv2D(
                channels, 3, padding="same", use_bias=False, name=f"{at}_conv2"
            )(y)
            y = bn(f"{at}_bn2")(y)
            if stride != 1 or shortcut.shape[-1] != channels:
                shortcut = StridedPointwiseConv(
                    channels, stride, use_bias=False, name=f"{at}_shortcut"
                )(shortcut)
                shortcut = bn(f"{at}_shortcut_bn")(shortcut)
            x = keras.layers.ReLU(name=f"{at}_out")(
                keras.layers.Add(name=f"{at}_add")([y, shortcut])
            )
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, name="logits")(x), name="resnet")


def _logistic(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    # Two classes only: `build_model` refuses others before it builds, naming the labels.
    inputs = keras.Input(input_shape, name="images")
    x = keras.layers.Flatten()(inputs)
    return keras.Model(inputs, keras.layers.Dense(1, name="logit")(x), name="logistic")


BUILDERS: dict[str, Callable[..., keras.Model]] = {
    "mlp": _mlp,
    "cnn": _cnn,
    "resnet": _resnet,
    "logistic": _logistic,
}


# User code may end the process itself (`sys.exit()` in a builder or at a module's top
# level): that is the model's fault too, and must end the job with a result.json.
_USER_CODE_ERRORS = (Exception, SystemExit)


def _user_code_failed(message: str, error: BaseException, name: str) -> ModelError:
    """The refusal `message` for a failure of the code of model `name` (`module:function`),
    with the line of its module's file that raised (`_where`); the whole traceback goes to
    the log first, as the job's message is one line."""
    log.error("the model's code raised:\n%s", "".join(traceback.format_exception(error)).rstrip())
    where = _where(error, name.partition(":")[0])
    return ModelError(f"{message} ({where})" if where else message)


def _where(error: BaseException, module_name: str) -> str | None:
    """The innermost line of `error`'s traceback in the custom model's module file, as
    "mymod.py, line 12, in build": a job's error (result.json, the API, the dashboard) named
    only the exception, and its line was in worker.log alone. The file is the module's
    `__file__` (one that failed to import is gone from `sys.modules`: the file its dotted
    name places), shown as that name places it (`team/models.py`); None when no frame is
    in it (a module it imports raised as it was imported)."""
    tail = module_name.replace(".", "/")
    ends = (f"/{tail}.py", f"/{tail}/__init__.py")
    path = getattr(sys.modules.get(module_name), "__file__", None)
    if isinstance(path, str):
        wanted = os.path.abspath(path)
        frame = innermost_frame(error, lambda name: os.path.abspath(name) == wanted)
    else:
        frame = innermost_frame(error, lambda name: name.replace(os.sep, "/").endswith(ends))
    if frame is None:
        return None
    filename = frame.filename.replace(os.sep, "/")
    shown = next((end[1:] for end in ends if filename.endswith(end)), filename.rsplit("/", 1)[-1])
    return f"{shown}, line {frame.lineno}, in {frame.name}"


def _custom_builder(name: str) -> Callable[..., Any]:
    module_name, function_name = name.split(":")
    try:
        module = importlib.import_module(module_name)
    except _USER_CODE_ERRORS as e:  # a SyntaxError or a failing top level is user code too
        message = f"Cannot import module {module_name!r} of model {name!r}: {one_line(e)}"
        if isinstance(e, ModuleNotFoundError) and e.name == module_name:
            raise ModelError(message) from e  # no code of its own ran: importlib's frames
        raise _user_code_failed(message, e, name) from e
    builder = getattr(module, function_name, None)
    if not callable(builder):
        raise ModelError(
            f"Module {module_name!r} has no function {function_name!r} (model {name!r})"
        )
    return builder


def _check_signature(
    name: str, builder: Callable[..., Any], params: dict[str, Any], kwargs: dict[str, Any]
) -> None:
    """Says which arguments a builder does not take, before calling it.

    Checked apart from the call, so a TypeError raised inside the builder is reported as
    its own failure, not as a rejection of the spec's params.
    """
    try:
        signature = inspect.signature(builder)
    except (TypeError, ValueError):  # some callables (C functions) have no signature
        return
    try:
        signature.bind(**kwargs, **params)
    except TypeError as e:
        given = ", ".join(["input_shape", "num_classes", *params])
        raise ModelError(
            f"Expected model {name!r} to take the keyword arguments {given}. "
            f"Received: a function {_function_label(builder)}{signature} ({e})"
        ) from None


def _function_label(builder: Callable[..., Any]) -> str:
    return getattr(builder, "__qualname__", None) or type(builder).__name__


def _output_shape(name: str, model: keras.Model, input_shape: tuple[int, ...]) -> tuple:
    """The shape a custom model answers a zero batch of one with (this also builds it)."""
    try:
        output = model(np.zeros((1, *input_shape), np.float32), training=False)
    except _USER_CODE_ERRORS as e:
        raise _user_code_failed(
            f"Model {name!r} failed on a batch of shape {(1, *input_shape)}: {one_line(e)}",
            e,
            name,
        ) from e
    if isinstance(output, (list, tuple, dict)):
        raise ModelError(
            f"Expected model {name!r} to output one tensor of logits. "
            f"Received: a {type(output).__name__} of {len(output)} outputs"
        )
    # Floating logits of any width train (the step computes its loss in float32, as
    # Keras's mixed precision asks); integers have no gradient to give.
    dtype = tf.as_dtype(output.dtype)
    if not dtype.is_floating:
        raise ModelError(
            f"Expected model {name!r} to output floating-point logits. Received: {dtype.name}"
        )
    return tuple(output.shape)


def _check_input_dtype(name: str, model: keras.Model) -> None:
    """Refuses a model whose input is not floating point (`keras.Input(..., dtype="int32")`):
    it is fed float32 pixels in [0, 1], which Keras casts to its input's dtype, so an
    integer input read every pixel as 0 (or 1 where it was 255) and trained on that
    without a word. A subclassed model declares no input: what it does is its own."""
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):  # subclassed, or a Sequential not yet built
        return
    for tensor in inputs or ():
        dtype = tf.as_dtype(tensor.dtype)
        if not dtype.is_floating:
            raise ModelError(
                f"Expected model {name!r} to take float images (float32 pixels in [0, 1], as "
                f"the job feeds them: integer pixels divided by 255). Received: an input of "
                f"dtype {dtype.name}, which would read every pixel as 0 or 1"
            )


# The names TensorFlow's SavedModel writer takes for a variable (its root name scope).
_EXPORTABLE_NAME = re.compile(r"[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*")
# The names TensorFlow takes for a scope inside another (a `_` first is fine there).
_NESTED_NAME = re.compile(r"[A-Za-z0-9_.\\/>-]*")


def _check_variable_names(name: str, model: keras.Model) -> None:
    """Refuses a model with a variable or layer the export cannot save: a layer named
    `_hidden` (or one a class `_Hidden` names by itself) trained every step of its job, and
    the job then failed as it exported ("'_hidden/bias' is not a valid root scope name"), as
    did every resume; a name with a space failed its first step with TensorFlow's message.
    The layers' own names too, the model's included: a subclassed model's `_hidden` layer
    has variables under the model's name (`sub/_hidden/kernel`), and a functional model
    named `_m` none under its own, yet the export enters each as a root scope and failed.
    Only those are root scopes: a functional or Sequential model calls its layers inside
    its own scope, as a layer does its own (a functional model's `Input(name="_images")` or
    variable-less `Flatten(name="_flat")` exports, and was refused), where a name needs no
    more than TensorFlow's rule for a nested scope (no spaces: that failed the first step)."""
    expected = (
        f"Expected model {name!r} to name its layers as TensorFlow can save them in the "
        "exported model: a letter, digit or '.' first, then letters, digits and '_', '.', "
        "'-', '/', '>'. Received: "
    )
    renamed = "(Keras names a layer after its class unless given `name=`)"
    for variable in model.variables:
        path = str(getattr(variable, "path", variable.name))
        if not _EXPORTABLE_NAME.fullmatch(path):
            raise ModelError(
                f"{expected}a variable named {path!r}: give its layer another name {renamed}"
            )
    subclassed = not isinstance(model, Functional | keras.Sequential)
    roots = {id(model)}
    if subclassed:
        roots |= {id(layer) for layer in model._flatten_layers(include_self=False, recursive=False)}
    for layer in model._flatten_layers(include_self=True, recursive=True):
        rule = _EXPORTABLE_NAME if id(layer) in roots else _NESTED_NAME
        if not rule.fullmatch(layer.name):
            what = "the model itself, named" if layer is model else "a layer named"
            raise ModelError(f"{expected}{what} {layer.name!r}: give it another name {renamed}")


def _batch_shape(shape: tuple) -> str:
    """A model's output shape as the expected one is said: its batch axis by name, not as
    the 1 of the zero batch a custom model was run on (or a built-in's None)."""
    if not shape:
        return "()"
    return f"({', '.join(['batch', *(str(d) for d in shape[1:])])}{',' if len(shape) == 1 else ''})"


def _squashed_output(model: keras.Model) -> str | None:
    """How a functional or sequential model's output is squashed ("softmax" from layer
    `dense_1`), or None: logits, or a subclassed model, whose last op cannot be seen."""
    try:
        outputs = model.outputs
    except AttributeError:  # subclassed
        return None
    history = getattr(outputs[0], "_keras_history", None) if len(outputs) == 1 else None
    if history is None:
        return None
    layer = history.operation
    name: str | None
    if isinstance(layer, keras.layers.Softmax):
        name = "softmax"
    else:
        name = getattr(getattr(layer, "activation", None), "__name__", None)
    return f"{name} (from layer {layer.name!r})" if name in ("softmax", "sigmoid") else None


def two_class_refusal(num_classes: int, labels: tuple[int, int] | None = None) -> str:
    """Why `logistic` refuses data of `num_classes` classes; `labels`, the smallest and
    largest label, where known. Labels 1 and 2 are three classes (ids count from 0), and
    "Received: 3 classes" alone left a user with two-class data to wonder why."""
    received = f"{num_classes} classes"
    if labels is not None:
        low, high = labels
        received = f"labels {low}..{high}"
        if low > 0:
            received += f": class ids count from 0, so {num_classes} classes"
            if high - low == 1:  # two labels: one off from 0 and 1
                received += f"; give labels 0 and 1 (y - {low})"
        else:
            received += f", so {num_classes} classes"
    return f"Model `logistic` needs two-class data. Received: {received}"


@dataclass(frozen=True)
class BuiltModel:
    """A model `build_model` accepted, and how its logits are read."""

    model: keras.Model
    binary: bool  # one sigmoid logit (two classes), not one logit per class (softmax)


def build_model(
    spec: ModelSpec,
    input_shape: tuple[int, ...],
    num_classes: int,
    labels: tuple[int, int] | None = None,
) -> BuiltModel:
    """Build the model of `spec` for images of `input_shape` (H, W, C) and `num_classes`.

    A custom model may be functional or subclassed: it is called once on a zero batch of
    one, which builds a subclassed model and checks that it runs and gives logits of shape
    (batch, classes), before any training starts; that shape also says whether it gives
    one sigmoid logit. `labels`, the data's smallest and largest label, where known, are
    named when the class count is refused.
    """
    if spec.name == "logistic" and num_classes != 2:
        raise ModelError(two_class_refusal(num_classes, labels))
    if spec.is_custom:
        builder = _custom_builder(spec.name)
        kwargs = {"input_shape": input_shape, "num_classes": num_classes}
        _check_signature(spec.name, builder, spec.params, kwargs)
        try:
            model = builder(**kwargs, **spec.params)
        except _USER_CODE_ERRORS as e:  # any failure of user code is the model's fault
            message = f"Model {spec.name!r} failed to build: {one_line(e)}"
            raise _user_code_failed(message, e, spec.name) from e
        if not isinstance(model, keras.Model):
            raise ModelError(
                f"Expected {spec.name!r} to return a keras.Model. Received: {type(model).__name__}"
            )
        _check_input_dtype(spec.name, model)
        output_shape = _output_shape(spec.name, model, input_shape)
        _check_variable_names(spec.name, model)  # built now, subclassed ones included
        # The loss applies softmax (or sigmoid) itself: a model that already did trains on
        # squashed probabilities taken for logits, slowly and badly, with no error anywhere
        # (and its export's `probabilities` are a softmax of probabilities, near uniform).
        squashed = _squashed_output(model)
        if squashed is not None:
            raise ModelError(
                f"Expected model {spec.name!r} to output logits, with no activation after its "
                f"last layer (the trainer's loss applies softmax or sigmoid itself). "
                f"Received: an output already passed through {squashed}"
            )
    else:
        # The spec checked the size it could know without the data; this is the real one,
        # counted before a single weight is allocated.
        reason = too_large(spec.name, spec.params, input_shape, num_classes)
        if reason is not None:
            raise ModelError(reason)
        model = BUILDERS[spec.name](input_shape, num_classes, **spec.params)
        output_shape = model.output_shape
    # Two classes may be one sigmoid logit: `logistic` always, a custom model if it likes.
    one_logit_ok = spec.name == "logistic" or (spec.is_custom and num_classes == 2)
    expected = 1 if spec.name == "logistic" else num_classes
    if len(output_shape) != 2 or output_shape[-1] not in {expected, 1 if one_logit_ok else -1}:
        # A (batch, H, W, classes) map would pass a check of the last axis alone, and then
        # fail in the first step's loss with TensorFlow's traceback instead of this line.
        alternative = " or (batch, 1) (one sigmoid logit)" if one_logit_ok and expected != 1 else ""
        # A one-logit model on labels 1 and 2 is asked for 3 logits: say why.
        note = (
            f" (labels {labels[0]}..{labels[1]}: class ids count from 0, so {num_classes} classes)"
            if labels is not None and labels[0] > 0
            else ""
        )
        raise ModelError(
            f"Expected model {spec.name!r} to output logits of shape (batch, {expected})"
            f"{alternative}{note}. Received: output shape {_batch_shape(output_shape)}"
        )
    binary = output_shape[-1] == 1 if spec.is_custom else spec.name == "logistic"
    return BuiltModel(model, binary)
