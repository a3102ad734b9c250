"""The job spec: the public JSON contract between users, the service and the trainer.

Defined once, here, as pydantic models. This module must never import TensorFlow: the
service validates submissions with exactly the code the worker runs. Unknown keys are
errors everywhere, every field except ``data`` has a default, a value of the wrong JSON
type is an error too (``true`` is no 1, ``"500"`` no 500; an integer is a number), and
every error names the field, what was expected and what was received.
"""

from __future__ import annotations

import functools
import math
import re
import struct
import unicodedata
from typing import Annotated, Any, Literal

from pydantic import (
    AllowInfNan,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError, PydanticKnownError

from trainer.modelsize import too_large
from trainer.unknown_keys import UNKNOWN, Known, UnknownKeys, known_keys, model_of, shown_path

# The built-in models: the trainer's builders are keyed by exactly these names, and a test
# checks that the two stay in step.
MODEL_NAMES = ("mlp", "cnn", "resnet", "logistic")
MAX_SYNTHETIC_VALUES = 2**28  # 1 GiB of float32

# `package.module:function`, each part a Python identifier.
_CUSTOM_MODEL = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_]\w*$")


def _not_bool_or_str(value: Any) -> Any:
    # Pydantic's lax mode reads JSON's `true` as 1 and "500" as 500: a spec that says
    # `"towers": true` ran on one tower without a word. Raised as pydantic's own error,
    # so the message reads as any other type error's.
    if isinstance(value, (bool, str)):
        raise PydanticKnownError("int_type")
    return value


# The JSON types each field takes, and no other: a bool is no number, a string is no
# number or bool, a number is no bool. Per field, not the models' `strict=True`: that, in
# Python mode (how the service and the worker validate parsed JSON), also refuses a list
# for a tuple and a string for an enum, which is all JSON has for them.
# An integer is a JSON number without a fraction: 2000, and 2000.0 as Python clients
# write it (JSON Schema's "integer" takes both; 2.5 stays an error). Bounds go in the
# field's `Field(...)` of a `JsonInt`, or before the check (`Annotated[int, Field(...),
# _INTEGER]`) inside a list, an `Annotated` or `| None`: after it, pydantic writes them
# into the OpenAPI schema as its own `ge`, not `minimum` (a test checks the schema).
_INTEGER = BeforeValidator(_not_bool_or_str)
JsonInt = Annotated[int, _INTEGER]
# What a float32, which training computes in, holds: a larger number (1e39, or JSON's
# 1e400, which reads as infinity) would pass a bound like `clip_norm`'s `> 0` and then be
# infinite in the step (a clip by an infinite norm scales by inf * 0 = NaN, and the job
# failed "non-finite loss at step 2").
FLOAT32_MAX = 3.4028234663852886e38


# float32's smallest normal number: a smaller one is 0 to a CPU that flushes subnormals
# (TensorFlow's kernels do), so an `epsilon` of 1e-40 divided by zero.
FLOAT32_TINY = 1.1754943508222875e-38


def _float32(value: Any) -> Any:
    """Refuses a number a float32 cannot hold: too large, or too small to tell from 0.
    Before the type check, as `JsonInt`'s (see there: after it, pydantic writes the field's
    bounds into the schema in its own words). NaN and infinity are left to `AllowInfNan`,
    which says so."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value  # the type check says what it is
    if isinstance(value, float) and not math.isfinite(value):
        return value
    if abs(value) > FLOAT32_MAX:
        raise ValueError(
            f"Expected a number a 32-bit float holds, at most {FLOAT32_MAX:.4g} in size "
            "(training computes in float32)"
        )
    if value and abs(value) < FLOAT32_TINY:
        raise ValueError(
            f"Expected 0 or a number of at least {FLOAT32_TINY:.4g} in size: smaller, a 32-bit "
            "float (which training computes in) is 0"
        )
    return value


def _under_one_in_float32(value: Any) -> Any:
    """Refuses a number under 1 that a float32 rounds to 1 (0.99999999): a `beta_2` of 1
    divides Adam's bias correction by 0, a dropout rate of 1 drops every unit."""
    if (
        isinstance(value, float)
        and value < 1
        and struct.unpack("f", struct.pack("f", value))[0] >= 1
    ):
        raise ValueError(
            "Expected a number under 1 in a 32-bit float, which training computes in: "
            "this one rounds to 1.0 there (0.9999999 does not)"
        )
    return value


# Strict float still takes an int: 1 is 1.0. NaN and infinity are refused (JSON has
# neither, but Python's json reads `NaN`, `Infinity` and 1e400 as them).
_FLOAT = (Strict(), AllowInfNan(False), BeforeValidator(_float32))
JsonFloat = Annotated[float, *_FLOAT]
# One of the fields whose bound is `< 1`: under 1 as training computes it, too.
UnderOne = Annotated[float, *_FLOAT, BeforeValidator(_under_one_in_float32)]
# A number the trainer computes with in Python's doubles alone (`eval_fraction`, a share of
# the examples): float32's limits are not its own, and 0.99999999 holds out all but one.
Fraction = Annotated[float, Strict(), AllowInfNan(False)]
# Where it may be null, its bounds go before the check, as `JsonInt`'s do.
ClipNorm = Annotated[float, Field(gt=0.0), *_FLOAT]
EmaDecay = Annotated[float, Field(gt=0.0, lt=1.0), *_FLOAT, BeforeValidator(_under_one_in_float32)]
JsonBool = Annotated[bool, Strict()]  # true or false, not 1 or "yes"

PositiveInt = Annotated[int, Field(gt=0), _INTEGER]
# Caps on the built-in models' sizes: far beyond what they are for, and low enough that a
# typo (a million hidden layers, a width of 10^9) is refused here, not by a worker that
# hangs building the model or runs out of memory after the job waited its turn.
MAX_LAYERS = 64
LayerWidth = Annotated[int, Field(gt=0, le=65_536), _INTEGER]
NonNegativeInt = Annotated[int, Field(ge=0), _INTEGER]


def _error_at(field: str, message: str, value: Any) -> ValidationError:
    """An error of a model's `field`, raised from its model validator (which pydantic
    would report at the model itself): the service's 422 and the form name the field."""
    error = PydanticCustomError("field_error", "{message}", {"message": message})
    return ValidationError.from_exception_data(
        "DataSpec", [{"type": error, "loc": (field,), "input": value}]
    )


def _validate_nested(model: type[BaseModel], raw: dict[str, Any], at: tuple[str, str]) -> BaseModel:
    """Validate a free-form dict field (at path `at`) against `model`, reporting errors
    under `params.`; an unknown key is said here, where the keys `model` takes are known."""
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        unknown = UnknownKeys(_known_keys(JobSpec))
        level = known_keys(model)

        def kind(err: Any) -> Any:
            if err["type"] != "extra_forbidden":
                return err["type"]
            message = unknown.message((*at, *err["loc"]), err["input"], level)
            return PydanticCustomError("unknown_key", "{message}", {"message": message})

        line_errors = [
            {
                "type": kind(err),
                "loc": (at[-1], *err["loc"]),
                "input": err["input"],
                "ctx": err.get("ctx", {}),
            }
            for err in e.errors(include_url=False)
        ]
        raise ValidationError.from_exception_data(model.__name__, line_errors) from None  # type: ignore[arg-type]


class _Strict(BaseModel):
    """Base of every spec model: unknown keys are errors, defaults are validated."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


# --- model ---------------------------------------------------------------------------


class MlpParams(_Strict):
    """`mlp`: flatten, hidden dense layers with ReLU, logits."""

    hidden: list[LayerWidth] = Field(
        default_factory=lambda: [500], min_length=1, max_length=MAX_LAYERS
    )
    dropout: UnderOne = Field(0.0, ge=0.0, lt=1.0)


class CnnParams(_Strict):
    """`cnn`: the classic MNIST tower model (conv32, pool, conv64, pool, dense, logits)."""

    filters: tuple[LayerWidth, LayerWidth] = (32, 64)
    dense: LayerWidth = 512
    dropout: UnderOne = Field(0.4, ge=0.0, lt=1.0)

    @field_validator("filters", mode="before")
    @classmethod
    def _two_filters(cls, filters: Any) -> Any:
        # Pydantic says "filters.1: Field required" for [32], which does not say why.
        if isinstance(filters, (list, tuple)) and len(filters) != 2:
            raise ValueError(
                "Expected two filter counts, one for each conv layer (default [32, 64]). "
                f"Received: {list(filters)}"
            )
        return filters


class ResnetParams(_Strict):
    """`resnet`: a small residual network with batch norm."""

    width: Annotated[int, Field(gt=0, le=1024), _INTEGER] = 16  # doubles at each stage
    blocks_per_stage: list[Annotated[int, Field(gt=0, le=MAX_LAYERS), _INTEGER]] = Field(
        default_factory=lambda: [1, 1, 1], min_length=1, max_length=8
    )
    bn_momentum: UnderOne = Field(0.9, gt=0.0, lt=1.0)


class LogisticParams(_Strict):
    """`logistic`: one sigmoid output, for two-class data."""


_MODEL_PARAMS: dict[str, type[_Strict]] = {
    "mlp": MlpParams,
    "cnn": CnnParams,
    "resnet": ResnetParams,
    "logistic": LogisticParams,
}


MAX_PARAMS_NESTING = 32


def _nesting(value: Any) -> int:
    """How many levels of lists and dicts `value` holds, counted up to one past
    MAX_PARAMS_NESTING (deeper is refused alike), with no recursion: a body may nest as
    deep as Python's JSON reader goes."""
    depth, level = 0, [value]
    while level and depth <= MAX_PARAMS_NESTING:
        depth += 1
        level = [
            inner
            for outer in level
            for inner in (outer.values() if isinstance(outer, dict) else outer)
            if isinstance(inner, dict | list)
        ]
    return depth


class ModelSpec(_Strict):
    """Which model to build and the parameters its builder takes."""

    name: str = "cnn"
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _known_model(cls, name: str) -> str:
        if name in MODEL_NAMES or _CUSTOM_MODEL.match(name):
            return name
        raise ValueError(
            f"Expected one of {', '.join(MODEL_NAMES)} or 'module:function'. Received: {shown_value(name)}"
        )

    @model_validator(mode="after")
    def _check_params(self) -> ModelSpec:
        # Built-in models check their params here, so the service rejects a bad one;
        # a custom builder checks its own when the worker calls it.
        params_model = _MODEL_PARAMS.get(self.name)
        if params_model is not None:
            self.params = _validate_nested(
                params_model, self.params, ("model", "params")
            ).model_dump()
        elif _nesting(self.params) > MAX_PARAMS_NESTING:
            # Stored and sent back as JSON, which pydantic will not write past 255 levels:
            # a job nested deeper was checked, then failed the submit with a 500.
            raise _error_at(
                "params",
                f"Expected `params` nested at most {MAX_PARAMS_NESTING} levels deep (the "
                f"keyword arguments of a builder). Received: more than {MAX_PARAMS_NESTING}",
                self.params,
            )
        elif given := sorted(set(self.params) & {"input_shape", "num_classes"}):
            # The worker passes these from the data: given twice, the call would fail.
            raise ValueError(
                "Expected `params` without `input_shape` or `num_classes`, which the worker "
                f"gives a custom model from the data. Received: {', '.join(given)}"
            )
        return self

    @property
    def is_custom(self) -> bool:
        return self.name not in MODEL_NAMES


# --- data ----------------------------------------------------------------------------


class AugmentSpec(_Strict):
    """Augmentations applied to training images (never to eval images)."""

    flip_left_right: JsonBool = False
    random_crop_padding: Annotated[int, Field(ge=0, le=64), _INTEGER] = 0
    brightness: JsonFloat = Field(0.0, ge=0.0, le=1.0)
    contrast: UnderOne = Field(0.0, ge=0.0, lt=1.0)

    @property
    def any(self) -> bool:
        return (
            self.flip_left_right
            or self.random_crop_padding > 0
            or self.brightness > 0
            or self.contrast > 0
        )

    def crop_problem(self, height: int, width: int) -> str | None:
        """Why `random_crop_padding` does not fit images of `height` x `width`, or None.

        A shift of a whole side or more moves every pixel out of the image: a padding of
        at least the shorter side trains on blank images under their labels.
        """
        pad, side = self.random_crop_padding, min(height, width)
        if pad == 0 or pad < side:
            return None
        shifts = 2 * pad + 1
        kept = min(shifts, 2 * height - 1) * min(shifts, 2 * width - 1) / shifts**2
        return (
            f"Expected `random_crop_padding` below the images' height and width ({height}x{width}), "
            "so that a shifted image keeps some of its pixels. "
            f"Received: {pad}, which would leave about {1 - kept:.0%} of the training images blank"
        )


class SyntheticParams(_Strict):
    """`synthetic` data: class prototypes plus noise, learnable, generated from the seed."""

    shape: list[PositiveInt] = Field(
        default_factory=lambda: [28, 28, 1], min_length=2, max_length=3
    )
    classes: JsonInt = Field(10, ge=2, le=10_000)
    size: JsonInt = Field(4096, ge=2, le=10_000_000)
    noise: JsonFloat = Field(0.3, ge=0.0, le=10.0)

    @model_validator(mode="after")
    def _check_memory(self) -> SyntheticParams:
        # The worker holds the whole set as float32 in memory: refuse here what would
        # only fail there, after the job was queued, with a MemoryError.
        values = self.size * math.prod(self.shape)
        if values > MAX_SYNTHETIC_VALUES:
            raise ValueError(
                f"Expected synthetic data of at most {MAX_SYNTHETIC_VALUES:,} values (1 GiB of float32). "
                f"Received: size {self.size} x shape {self.shape} = {values:,} values"
            )
        return self


class DataSpec(_Strict):
    """Where training data comes from and how it is fed."""

    format: Literal["synthetic", "idx", "npz", "tfrecord"]
    path: str | None = None
    eval_fraction: Fraction = Field(0.2, ge=0.0, lt=1.0)
    # Kept for the public contract. The pipeline shuffles every epoch fully with a seeded
    # index permutation, which needs no buffer (and keeps checkpoints tiny).
    shuffle_buffer: PositiveInt = 10_000
    augment: AugmentSpec = Field(default_factory=AugmentSpec)
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_source(self) -> DataSpec:
        if self.format == "synthetic":
            if self.path == "":  # a form's unused path field: nothing named, as with null
                self.path = None
            if self.path is not None:
                raise _error_at(
                    "path",
                    "Expected no `path` for synthetic data (leave it out, or null). "
                    f"Received: {shown_value(self.path, PATH_CHARS)}",
                    self.path,
                )
            self.params = _validate_nested(
                SyntheticParams, self.params, ("data", "params")
            ).model_dump()
            height, width = self.params["shape"][:2]
            problem = self.augment.crop_problem(height, width)
            if problem is not None:
                raise ValueError(problem)
        else:
            if not self.path:
                raise _error_at(
                    "path",
                    f"`path` is required for {self.format!r} data. Received: {shown_value(self.path, PATH_CHARS)}",
                    self.path,
                )
            if self.params:
                raise ValueError(
                    f"`params` is only for synthetic data. Received: {sorted(self.params)}"
                )
        return self


# --- optimisation --------------------------------------------------------------------


class ScheduleSpec(_Strict):
    """Learning-rate schedule after warm-up (its step 0 is the first after warm-up)."""

    name: Literal["constant", "exponential_decay", "polynomial", "cosine"] = "constant"
    decay_steps: PositiveInt = 1000
    decay_rate: JsonFloat = Field(0.96, gt=0.0, le=1.0)
    staircase: JsonBool = False
    power: JsonFloat = Field(1.0, gt=0.0)
    end_learning_rate: JsonFloat = Field(0.0, ge=0.0)
    alpha: JsonFloat = Field(0.0, ge=0.0, le=1.0)  # cosine: final LR as a fraction of the initial


class OptimizerSpec(_Strict):
    """Optimizer, learning rate and its schedule."""

    name: Literal["sgd", "momentum", "adam"] = "adam"
    learning_rate: JsonFloat = Field(0.001, gt=0.0, le=10.0)
    momentum: UnderOne = Field(0.9, ge=0.0, lt=1.0)
    beta_1: UnderOne = Field(0.9, ge=0.0, lt=1.0)
    beta_2: UnderOne = Field(0.999, ge=0.0, lt=1.0)
    epsilon: JsonFloat = Field(1e-7, gt=0.0)
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    warmup_steps: NonNegativeInt = 0


# Which optimizers and schedules read each option. Any other ignores it, so a user's
# `{"name": "sgd", "momentum": 0.9}` (Keras's SGD with momentum) would train as plain SGD.
_READ_BY: dict[str, dict[str, tuple[str, ...]]] = {
    "optimizer": {
        "momentum": ("momentum",),
        "beta_1": ("adam",),
        "beta_2": ("adam",),
        "epsilon": ("adam",),
    },
    "optimizer.schedule": {
        "decay_steps": ("exponential_decay", "polynomial", "cosine"),
        "decay_rate": ("exponential_decay",),
        "staircase": ("exponential_decay",),
        "power": ("polynomial",),
        "end_learning_rate": ("polynomial",),
        "alpha": ("cosine",),
    },
}


def _unread_keys(where: str, name: str) -> list[str]:
    """The options of the optimizer (or schedule) `name` that it ignores."""
    return [key for key, readers in _READ_BY[where].items() if name not in readers]


def options_not_read(spec: JobSpec) -> list[dict[str, str]]:
    """A field error for each optimizer or schedule option given that the chosen optimizer
    or schedule would ignore. Given: set in the input, so only on a spec as a person wrote
    it (a submitted body, a `--spec` file), never on one stored with every default."""
    errors = []
    parts: dict[str, OptimizerSpec | ScheduleSpec] = {
        "optimizer": spec.optimizer,
        "optimizer.schedule": spec.optimizer.schedule,
    }
    for where, part in parts.items():
        for key in _unread_keys(where, part.name):
            if key in part.model_fields_set:
                readers = " or ".join(repr(name) for name in _READ_BY[where][key])
                kind = "optimizer" if where == "optimizer" else "schedule"
                hint = ' (SGD with momentum is "name": "momentum")' if key == "momentum" else ""
                errors.append({
                    "field": f"{where}.{key}",
                    "message": f"Expected no `{key}` with {kind} {part.name!r}, which does not "
                    f"use it: only {readers} does{hint}. Received: {shown_value(getattr(part, key))}",
                })  # fmt: skip
    return errors


def without_unread(spec: dict[str, Any]) -> dict[str, Any]:
    """A spec dict (a dump) without the options its optimizer and schedule ignore: as
    stored, written to spec.json and shown, so that it can be submitted again as it is."""
    optimizer = spec.get("optimizer")
    if not isinstance(optimizer, dict):
        return spec
    optimizer = {
        key: value
        for key, value in optimizer.items()
        if key not in _unread_keys("optimizer", optimizer.get("name", ""))
    }
    if isinstance(schedule := optimizer.get("schedule"), dict):
        unread = _unread_keys("optimizer.schedule", schedule.get("name", ""))
        optimizer["schedule"] = {k: v for k, v in schedule.items() if k not in unread}
    return {**spec, "optimizer": optimizer}


# --- cadences ------------------------------------------------------------------------


class EvalSpec(_Strict):
    """How often, and on how much held-out data, to evaluate."""

    every_steps: NonNegativeInt = 500
    batches: PositiveInt = 20


class SummariesSpec(_Strict):
    """TensorBoard cadence per kind; 0 turns a kind off."""

    scalars_every: NonNegativeInt = 10
    histograms_every: NonNegativeInt = 500
    images_every: NonNegativeInt = 500
    max_images: JsonInt = Field(8, ge=1, le=64)
    trace_steps: list[PositiveInt] = Field(default_factory=lambda: [20, 21, 22], max_length=100)
    graph: JsonBool = True
    # With the histograms (at their cadence): what each non-linearity puts out
    # (`trainer.activations`). An extension of the contract, on by default.
    activations: JsonBool = True

    @field_validator("trace_steps")
    @classmethod
    def _sorted_unique(cls, steps: list[int]) -> list[int]:
        return sorted(set(steps))


class CheckpointSpec(_Strict):
    """Checkpoint cadence (steps and/or seconds; 0 turns one off) and retention."""

    every_steps: NonNegativeInt = 500
    every_seconds: NonNegativeInt = 300
    keep: PositiveInt = 5


# --- the job -------------------------------------------------------------------------

# A job's `priority`, at submission, on a resume or changed later (`PATCH
# /api/v1/jobs/{id}`): one range for all three.
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000


class JobSpec(_Strict):
    """A whole training job: the body of `POST /api/v1/jobs` and the worker's spec.json."""

    name: str = Field("job", min_length=1, max_length=200)
    priority: JsonInt = Field(0, ge=PRIORITY_MIN, le=PRIORITY_MAX)
    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec
    towers: JsonInt = Field(1, ge=1, le=64)
    parameter_device: Literal["cpu", "gpu0"] = "cpu"
    batch_size: JsonInt = Field(256, ge=1, le=1_000_000)
    steps: Annotated[int, Field(ge=1, le=100_000_000), _INTEGER] | None = None
    epochs: Annotated[int, Field(ge=1, le=1_000_000), _INTEGER] | None = None
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    weight_decay: JsonFloat = Field(0.0, ge=0.0, le=1.0)
    clip_norm: ClipNorm | None = None
    ema_decay: EmaDecay | None = None
    eval: EvalSpec = Field(default_factory=EvalSpec)
    summaries: SummariesSpec = Field(default_factory=SummariesSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    seed: JsonInt = Field(0, ge=0, le=2**31 - 1)
    deterministic: JsonBool = False

    @field_validator("name")
    @classmethod
    def _visible_name(cls, name: str) -> str:
        # A name of spaces, controls or zero-width characters shows as nothing: in the
        # dashboard's table it was a link with no height, nothing to click.
        if not any(unicodedata.category(char)[0] not in "CZ" for char in name):
            raise ValueError(
                f"Expected a name with a visible character. Received: {shown_value(name)}"
            )
        # A newline or a NUL in a name broke the CLI's table and the service's log lines,
        # and a tab its columns. Format characters (a zero-width joiner in an emoji) stay.
        # Unicode's line and paragraph separators (U+2028, U+2029) break lines as well.
        if any(unicodedata.category(char) in ("Cc", "Zl", "Zp") for char in name):
            raise ValueError(
                "Expected a name without control characters or line breaks (a tab, a "
                f"newline, a NUL). Received: {shown_value(name)}"
            )
        return name

    @model_validator(mode="after")
    def _check_job(self) -> JobSpec:
        if self.steps is not None and self.epochs is not None:
            raise ValueError(
                f"Give `steps` or `epochs`, not both. Received: steps={self.steps}, epochs={self.epochs}"
            )
        if self.steps is None and self.epochs is None:
            self.steps = 1000
        if self.batch_size < self.towers:
            raise ValueError(
                "Expected `batch_size` to be at least `towers`, so every tower gets an example. "
                f"Received: batch_size={self.batch_size}, towers={self.towers}"
            )
        if self.model.name == "logistic" and self.data.format == "synthetic":
            classes = self.data.params["classes"]
            if classes != 2:
                raise ValueError(
                    "Model `logistic` needs two-class data. "
                    f"Received: data.params.classes={classes}"
                )
        if not self.model.is_custom:
            self._check_model_size()
        return self

    def _check_model_size(self) -> None:
        """Refuses a built-in model too large for any worker to build (`trainer.modelsize`)."""
        if self.data.format == "synthetic":
            # The exact size: synthetic data's shape and classes are known here.
            shape, classes = [*self.data.params["shape"], 1][:3], self.data.params["classes"]
            data = None
        else:
            # Files are not read here: count on the smallest images and two classes. What
            # is too large even then is too large for any data; the worker counts again
            # with the real shape before it builds the model.
            shape, classes = [1, 1, 1], 2
            data = "on 1x1x1 images of 2 classes, the least any data gives"
        reason = too_large(self.model.name, self.model.params, shape, classes, data)
        if reason is not None:
            # Under `model.params`, where the fix goes; the message is a template's value
            # because it holds braces (the params).
            error = PydanticCustomError("model_too_large", "{reason}", {"reason": reason})
            details = InitErrorDetails(type=error, loc=("model", "params"), input=self.model.params)
            raise ValidationError.from_exception_data(type(self).__name__, [details])


@functools.cache
def _known_keys(model: type[BaseModel]) -> list[Known]:
    """Every key `model` takes; a job spec's with its built-in models' and synthetic data's
    params (whose keys depend on the model's name and the data's format)."""
    if model is not JobSpec:
        return known_keys(model)
    params: dict[tuple[str, ...], tuple[type[BaseModel], ...]] = {
        ("model", "params"): tuple(_MODEL_PARAMS.values()),
        ("data", "params"): (SyntheticParams,),
    }
    return known_keys(JobSpec, params)


_SHOWN_CHARS = 200
# A file's path is shown whole up to the longest one Linux resolves (PATH_MAX): cut at
# `_SHOWN_CHARS`, a real path deep in a data root lost the part that names the file.
PATH_CHARS = 4096


def shown_value(value: Any, limit: int = _SHOWN_CHARS) -> str:
    """`repr(value)`, cut short: a message echoes what it refuses, not all 300 KB of it."""
    if isinstance(value, bool):
        return "true" if value else "false"  # as the JSON it came as, not Python's True
    return cut_short(repr(value), limit)


def cut_short(text: str, limit: int = _SHOWN_CHARS) -> str:
    """`text`, or its first `limit` characters and how many there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters in all)"


def field_errors(error: ValidationError, model: Any = None) -> list[dict[str, str]]:
    """Every error of a failed validation as ``{"field": "a.b", "message": ...}``. An
    unknown key gets the key it was probably meant to be (`trainer.unknown_keys`), where
    the model validated is known: `model` (a model, or a type that holds one: `X | None`),
    or a `JobSpec` the error names (FastAPI's errors name none)."""
    errors = []
    named = JobSpec if getattr(error, "title", None) == JobSpec.__name__ else None
    root = model_of(model) or named
    unknown = UnknownKeys(_known_keys(root)) if root is not None else None
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        field = shown_path(loc) or "(spec)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = unknown.message(loc, item.get("input")) if unknown else UNKNOWN
        elif item["type"] == "unknown_key":
            pass  # said where the keys were known (`_validate_nested`)
        elif item["type"] == "missing" and loc and isinstance(loc[-1], str):
            # Pydantic's "Field required" said neither what to give nor what came.
            message = f"Expected `{loc[-1]}`, which is required. Received: no `{loc[-1]}`"
        elif "input" in item and item["type"] not in ("missing",) and "Received" not in message:
            message = f"{message}. Received: {shown_value(item['input'])}"
        errors.append({"field": field, "message": message})
    return errors


def format_errors(errors: list[dict[str, str]]) -> str:
    """One line per field error (`field_errors`), for logs and `result.json`."""
    return "\n".join(f"{e['field']}: {e['message']}" for e in errors)
