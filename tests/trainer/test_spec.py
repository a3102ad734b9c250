"""The job spec: defaults, every kind of mistake named by field, and no TensorFlow import."""

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from trainer.models import BUILDERS
from trainer.spec import MODEL_NAMES, JobSpec, field_errors, options_not_read, without_unread

SYNTHETIC = {"format": "synthetic"}


def errors_of(raw: dict) -> dict[str, str]:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(raw)
    return {e["field"]: e["message"] for e in field_errors(info.value)}


def test_parse_spec_defaults():
    spec = JobSpec.model_validate({"data": SYNTHETIC})
    assert spec.steps == 1000 and spec.epochs is None
    assert spec.model.name == "cnn" and spec.model.params == {
        "filters": (32, 64),
        "dense": 512,
        "dropout": 0.4,
    }
    assert spec.summaries.trace_steps == [20, 21, 22]
    assert spec.data.params["shape"] == [28, 28, 1]


def test_parse_spec_design_example():
    # The example of ../shared/design/JOB_SPEC.md, which users copy.
    raw = {
        "name": "mnist-cnn-2towers",
        "priority": 0,
        "model": {"name": "cnn", "params": {"dropout": 0.4}},
        "data": {
            "format": "idx",
            "path": "/data/mnist",
            "eval_fraction": 0.2,
            "shuffle_buffer": 10000,
            "augment": {
                "flip_left_right": False,
                "random_crop_padding": 0,
                "brightness": 0.0,
                "contrast": 0.0,
            },
        },
        "towers": 2,
        "parameter_device": "cpu",
        "batch_size": 256,
        "steps": 2000,
        "optimizer": {
            "name": "adam",
            "learning_rate": 0.001,
            "schedule": {
                "name": "exponential_decay",
                "decay_steps": 1000,
                "decay_rate": 0.96,
                "staircase": True,
            },
            "warmup_steps": 0,
        },
        "weight_decay": 0.0001,
        "clip_norm": None,
        "ema_decay": None,
        "eval": {"every_steps": 500, "batches": 20},
        "summaries": {
            "scalars_every": 10,
            "histograms_every": 500,
            "images_every": 500,
            "max_images": 8,
            "trace_steps": [20, 21, 22],
        },
        "checkpoint": {"every_steps": 500, "every_seconds": 300, "keep": 5},
        "seed": 0,
        "deterministic": False,
    }
    spec = JobSpec.model_validate(raw)
    assert spec.towers == 2 and spec.optimizer.schedule.staircase is True
    # A dumped spec reads back to the same spec (the service writes spec.json this way).
    assert JobSpec.model_validate(json.loads(spec.model_dump_json())) == spec
    assert options_not_read(spec) == []  # the example sets only options its choices use


@pytest.mark.parametrize(
    ("optimizer", "fields"),
    [
        ({"name": "sgd", "momentum": 0.9}, ["optimizer.momentum"]),
        ({"name": "momentum", "beta_1": 0.5, "epsilon": 1e-3},
         ["optimizer.beta_1", "optimizer.epsilon"]),
        ({"name": "adam", "schedule": {"name": "constant", "decay_steps": 10}},
         ["optimizer.schedule.decay_steps"]),
        ({"schedule": {"name": "polynomial", "alpha": 0.1, "staircase": True}},
         ["optimizer.schedule.staircase", "optimizer.schedule.alpha"]),
        ({"name": "momentum", "momentum": 0.5,
          "schedule": {"name": "cosine", "decay_steps": 10, "alpha": 0.1}}, []),
    ],
)  # fmt: skip
def test_options_not_read_names_each_option_that_would_be_ignored(optimizer, fields):
    spec = JobSpec.model_validate({"data": SYNTHETIC, "optimizer": optimizer})
    assert [error["field"] for error in options_not_read(spec)] == fields


def test_spec_without_unread_options_reads_back_the_same_and_passes_the_check():
    spec = JobSpec.model_validate(
        {"data": SYNTHETIC, "optimizer": {"name": "sgd", "schedule": {"name": "cosine"}}}
    )
    stored = without_unread(spec.model_dump(mode="json"))
    assert set(stored["optimizer"]) == {"name", "learning_rate", "schedule", "warmup_steps"}
    assert set(stored["optimizer"]["schedule"]) == {"name", "decay_steps", "alpha"}
    again = JobSpec.model_validate(stored)
    assert again == spec and options_not_read(again) == []


def test_parse_spec_unknown_key():
    assert errors_of({"data": SYNTHETIC, "tower": 2}) == {
        "tower": "Unknown key. Did you mean `towers`?"
    }
    assert errors_of({"data": {**SYNTHETIC, "augment": {"flip": True}}}) == {
        "data.augment.flip": "Unknown key. Did you mean `flip_left_right`?"
    }


UNKNOWN_KEYS = {
    "misspelt": ({"summaries": {"histogram_every": 5}}, "summaries.histogram_every",
                 "Unknown key. Did you mean `histograms_every`?"),
    "in capitals": ({"BATCH_SIZE": 8}, "BATCH_SIZE", "Unknown key. Did you mean `batch_size`?"),
    "cut short": ({"optimizer": {"warmup": 5}}, "optimizer.warmup",
                  "Unknown key. Did you mean `warmup_steps`?"),
    "two alike": ({"optimizer": {"beta": 0.9}}, "optimizer.beta",
                  "Unknown key. Did you mean `beta_1` or `beta_2`?"),
    "another library's name": ({"optimizer": {"lr": 0.1}}, "optimizer.lr",
                               "Unknown key. Did you mean `learning_rate`?"),
    # A key of another level: where it belongs, before any name like it here.
    "another level": ({"learning_rate": 0.1}, "learning_rate",
                      "Unknown key here: `learning_rate` is a key of `optimizer`."),
    "another level, not a name like it here": (
        {"optimizer": {"schedule": {"learning_rate": 0.1}}}, "optimizer.schedule.learning_rate",
        "Unknown key here: `learning_rate` is a key of `optimizer`."),
    "two other levels": ({"every_steps": 5}, "every_steps",
                         "Unknown key here: `every_steps` is a key of `eval` and `checkpoint`."),
    "the top level": ({"eval": {"steps": 5}}, "eval.steps",
                      "Unknown key here: `steps` is a top-level key."),
    "misspelt, of another level": ({"learning_rat": 0.1}, "learning_rat",
                                   "Unknown key here. Did you mean `optimizer.learning_rate`?"),
    "a model's params": ({"model": {"name": "mlp", "hidden": [8]}}, "model.hidden",
                         "Unknown key here: `hidden` is a key of `model.params`."),
    # An object's key is not suggested for a number: `"checkpoint": 3` is refused too.
    "a number for an object": ({"checkpoints": 3}, "checkpoints",
                               "Unknown key. Remove it or check its spelling. Expected one of: "
                               + ", ".join(JobSpec.model_fields) + "."),
    "a path for a key": ({"optimizer.learning_rate": 0.1}, "'optimizer.learning_rate'",
                         'Unknown key: a key is one name, not a path. Nest it: '
                         '`{"optimizer": {"learning_rate": ...}}`.'),
    "a blank in it": ({"towers ": 2}, "'towers '", "Unknown key. Did you mean `towers`?"),
    # A model's and a data format's own parameters.
    "model params": ({"model": {"name": "cnn", "params": {"dens": 64}}}, "model.params.dens",
                     "Unknown key. Did you mean `dense`?"),
    "model params, nothing close": (
        {"model": {"name": "mlp", "params": {"width": 64}}}, "model.params.width",
        "Unknown key. Remove it or check its spelling. Expected one of: hidden, dropout."),
    "a model that takes none": (
        {"model": {"name": "logistic", "params": {"x": 1}}}, "model.params.x",
        "Unknown key: nothing is taken here. Remove it."),
    "data params, of another level": (
        {"data": {**SYNTHETIC, "params": {"eval_fraction": 0.1}}}, "data.params.eval_fraction",
        "Unknown key here: `eval_fraction` is a key of `data`."),
}  # fmt: skip


@pytest.mark.parametrize(("spec", "field", "message"), UNKNOWN_KEYS.values(), ids=UNKNOWN_KEYS)
def test_an_unknown_key_gets_the_key_it_is_closest_to(spec, field, message):
    assert errors_of({"data": SYNTHETIC, **spec}) == {field: message}


def test_thousands_of_unknown_keys_are_matched_only_so_far():
    # Matching costs the product of two keys' lengths: a 1 MB body of 1 KB keys took 17 s
    # in the service's event loop. Long keys and keys past the first 20 are not matched.
    spec = {"data": SYNTHETIC, "t" * 100_000: 1, **{f"towers_{i:04}": 1 for i in range(1000)}}
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate(spec)
    errors = field_errors(caught.value)
    assert errors[0] == {
        "field": f"{'t' * 64}... (100,000 characters)",
        "message": "Unknown key. Remove it or check its spelling. Expected one of: "
        + ", ".join(JobSpec.model_fields)
        + ".",
    }
    assert errors[1]["message"] == "Unknown key. Did you mean `towers`?"
    assert {e["message"] for e in errors[20:]} == {"Unknown key. Remove it or check its spelling."}
    assert len(errors) == 1001


def test_parse_spec_missing_data():
    assert errors_of({}) == {"data": "Expected `data`, which is required. Received: no `data`"}


def test_parse_spec_bad_ranges_lists_every_field():
    errors = errors_of(
        {"data": SYNTHETIC, "towers": 0, "batch_size": -1, "optimizer": {"learning_rate": 0}}
    )
    assert errors == {
        "towers": "Input should be greater than or equal to 1. Received: 0",
        "batch_size": "Input should be greater than or equal to 1. Received: -1",
        "optimizer.learning_rate": "Input should be greater than 0. Received: 0",
    }


# Values of another JSON type: pydantic's lax mode read each as the type the field takes
# (`"towers": true` ran on 1 tower, `"flip_left_right": "yes"` flipped), without a word.
WRONG_TYPES = {
    "bool for int": ({"towers": True}, "towers", "Input should be a valid integer. Received: true"),
    "string for int": ({"steps": "500"}, "steps",
                       "Input should be a valid integer. Received: '500'"),
    "string for bool": ({"data": {**SYNTHETIC, "augment": {"flip_left_right": "yes"}}},
                        "data.augment.flip_left_right",
                        "Input should be a valid boolean. Received: 'yes'"),
    "bool for seed": ({"seed": True}, "seed", "Input should be a valid integer. Received: true"),
    "number for bool": ({"deterministic": 1}, "deterministic",
                        "Input should be a valid boolean. Received: 1"),
    "string for priority": ({"priority": "3"}, "priority",
                            "Input should be a valid integer. Received: '3'"),
    "number for string": ({"name": 123}, "name", "Input should be a valid string. Received: 123"),
    "bool for float": ({"weight_decay": False}, "weight_decay",
                       "Input should be a valid number. Received: false"),
    "string for float": ({"optimizer": {"learning_rate": "0.1"}}, "optimizer.learning_rate",
                         "Input should be a valid number. Received: '0.1'"),
    "string for optional float": ({"clip_norm": "1"}, "clip_norm",
                                  "Input should be a valid number. Received: '1'"),
    "bool for optional int": ({"steps": None, "epochs": True}, "epochs",
                              "Input should be a valid integer. Received: true"),
    "float for bool": ({"optimizer": {"schedule": {"name": "exponential_decay", "staircase": 1.0}}},
                       "optimizer.schedule.staircase",
                       "Input should be a valid boolean. Received: 1.0"),
    "bool in an int list": ({"summaries": {"trace_steps": [True]}}, "summaries.trace_steps.0",
                            "Input should be a valid integer. Received: true"),
    "string in an int tuple": ({"model": {"name": "cnn", "params": {"filters": [32, "64"]}}},
                               "model.params.filters.1",
                               "Input should be a valid integer. Received: '64'"),
    "bool in model params": ({"model": {"name": "mlp", "params": {"dropout": True}}},
                             "model.params.dropout",
                             "Input should be a valid number. Received: true"),
    "bool in synthetic params": ({"data": {**SYNTHETIC, "params": {"classes": True}}},
                                 "data.params.classes",
                                 "Input should be a valid integer. Received: true"),
}  # fmt: skip


@pytest.mark.parametrize(("spec", "field", "message"), WRONG_TYPES.values(), ids=WRONG_TYPES)
def test_parse_spec_value_of_another_json_type_is_refused(spec, field, message):
    assert errors_of({"data": SYNTHETIC, **spec}) == {field: message}
    # The worker reads spec.json as JSON: the same errors there.
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate_json(json.dumps({"data": SYNTHETIC, **spec}))
    assert {e["field"]: e["message"] for e in field_errors(caught.value)} == {field: message}


def test_parse_spec_integer_where_a_number_is_expected():
    # JSON has one number type: 1 is a learning rate as much as 1.0 is, and 2000.0 (as
    # Python's json writes a computed float) a step count, as JSON Schema's "integer" says.
    spec = JobSpec.model_validate(
        {
            "data": {**SYNTHETIC, "eval_fraction": 0, "params": {"noise": 1}},
            "model": {"name": "mlp", "params": {"dropout": 0}},
            "optimizer": {"learning_rate": 1, "schedule": {"name": "polynomial", "power": 2}},
            "weight_decay": 0,
            "clip_norm": 5,
            "steps": 2000.0,
        }
    )
    assert spec.optimizer.learning_rate == 1.0 and type(spec.optimizer.learning_rate) is float
    assert type(spec.weight_decay) is float and type(spec.clip_norm) is float
    assert type(spec.model.params["dropout"]) is float and type(spec.data.params["noise"]) is float
    assert spec.steps == 2000 and type(spec.steps) is int
    assert errors_of({"data": SYNTHETIC, "steps": 2.5}) == {
        "steps": "Input should be a valid integer, got a number with a fractional part. "
        "Received: 2.5"
    }


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        # Past float32's range: finite here, infinite in the step. A clip by it scaled by
        # inf * 0 = NaN, and the job failed "non-finite loss at step 2".
        ('{"clip_norm": 1e39}', "clip_norm",
         "Expected a number a 32-bit float holds, at most 3.403e+38 in size (training "
         "computes in float32). Received: 1e+39"),
        ('{"clip_norm": 1e400}', "clip_norm", "Input should be a finite number. Received: inf"),
        ('{"clip_norm": Infinity}', "clip_norm",
         "Input should be a finite number. Received: inf"),
        ('{"optimizer": {"epsilon": NaN}}', "optimizer.epsilon",
         "Input should be a finite number. Received: nan"),
        ('{"optimizer": {"schedule": {"name": "polynomial", "power": 1e39}}}',
         "optimizer.schedule.power",
         "Expected a number a 32-bit float holds, at most 3.403e+38 in size (training "
         "computes in float32). Received: 1e+39"),
        # Past `> 0` as a double, 0 as training's float32 (flushed to 0 as a subnormal).
        ('{"optimizer": {"epsilon": 1e-40}}', "optimizer.epsilon",
         "Expected 0 or a number of at least 1.175e-38 in size: smaller, a 32-bit float "
         "(which training computes in) is 0. Received: 1e-40"),
        # Past `< 1` as a double, 1.0 as float32: Adam's bias correction divided by 0.
        ('{"optimizer": {"beta_2": 0.99999999}}', "optimizer.beta_2",
         "Expected a number under 1 in a 32-bit float, which training computes in: this one "
         "rounds to 1.0 there (0.9999999 does not). Received: 0.99999999"),
        ('{"ema_decay": 0.999999999}', "ema_decay",
         "Expected a number under 1 in a 32-bit float, which training computes in: this one "
         "rounds to 1.0 there (0.9999999 does not). Received: 0.999999999"),
    ],
)  # fmt: skip
def test_parse_spec_number_a_float32_cannot_hold(text, field, message):
    # Python's json (the service's and the worker's) reads NaN, Infinity and 1e400.
    spec = {"data": SYNTHETIC, **json.loads(text)}
    assert errors_of(spec) == {field: message}
    assert JobSpec.model_validate({"data": SYNTHETIC, "clip_norm": 1e38}).clip_norm == 1e38
    near_one = {"beta_2": 0.9999999, "epsilon": 1e-30}
    assert JobSpec.model_validate({"data": SYNTHETIC, "optimizer": near_one}).optimizer.beta_2
    # A share of the examples, computed in doubles: float32's limits are not its own.
    for fraction in (1e-39, 0.99999999):
        data = {**SYNTHETIC, "eval_fraction": fraction}
        assert JobSpec.model_validate({"data": data}).data.eval_fraction == fraction
    assert errors_of({"data": {**SYNTHETIC, "eval_fraction": float("nan")}}) == {
        "data.eval_fraction": "Input should be a finite number. Received: nan"
    }


def test_parse_spec_lists_for_tuples_and_strings_for_choices_still_read():
    # What model-wide strict mode would refuse in Python mode, which JSON cannot say otherwise.
    spec = JobSpec.model_validate(
        {
            "data": SYNTHETIC,
            "model": {"name": "cnn", "params": {"filters": [4, 8]}},
            "parameter_device": "gpu0",
            "optimizer": {"name": "sgd", "schedule": {"name": "cosine"}},
        }
    )
    assert spec.model.params["filters"] == (4, 8) and spec.parameter_device == "gpu0"
    # A stored spec (dumped as JSON, as the service stores it and resumes from) reads back.
    assert JobSpec.model_validate(spec.model_dump(mode="json")) == spec


def test_spec_schema_states_every_bound_in_json_schema_words():
    # A bound placed after the type check of `JsonInt` is written by pydantic as its own
    # `ge`/`gt`, which no OpenAPI reader knows, instead of `minimum`/`exclusiveMinimum`.
    def keys(node):
        if isinstance(node, dict):
            for key, value in node.items():
                yield key
                yield from keys(value)
        elif isinstance(node, list):
            for value in node:
                yield from keys(value)

    schema = JobSpec.model_json_schema()
    assert not {"ge", "gt", "le", "lt"} & set(keys(schema))
    assert schema["properties"]["steps"]["anyOf"][0] == {
        "maximum": 100_000_000, "minimum": 1, "type": "integer"
    }  # fmt: skip


@pytest.mark.parametrize("name", ["   ", "\u200b", "\t\n", "\x01"])
def test_parse_spec_name_that_shows_nothing(name):
    assert errors_of({"data": SYNTHETIC, "name": name}) == {
        "name": f"Expected a name with a visible character. Received: {name!r}"
    }
    JobSpec.model_validate({"data": SYNTHETIC, "name": " \u200b a"})  # one is enough


@pytest.mark.parametrize(
    "name", ["bad\x00name", "two\nlines", "a\tb", "del\x7f", "line\u2028break"]
)
def test_parse_spec_name_with_a_control_character(name):
    assert errors_of({"data": SYNTHETIC, "name": name}) == {
        "name": "Expected a name without control characters or line breaks (a tab, a "
        f"newline, a NUL). Received: {name!r}"
    }
    # A zero-width joiner (a format character, not a control) is part of an emoji.
    assert JobSpec.model_validate({"data": SYNTHETIC, "name": "run \U0001f469\u200d\U0001f52c"})


def test_parse_spec_custom_model_params_that_the_worker_gives():
    model = {"name": "mine:build", "params": {"num_classes": 10, "depth": 3}}
    assert errors_of({"data": SYNTHETIC, "model": model}) == {
        "model": "Expected `params` without `input_shape` or `num_classes`, which the worker "
        "gives a custom model from the data. Received: num_classes"
    }


def test_parse_spec_custom_model_params_nested_too_deep():
    def nested(levels: int) -> dict:
        """`params` of `levels` levels: itself, then lists and dicts in turn."""
        inner: object = 8
        for level in range(levels - 1, 0, -1):
            inner = [inner] if level % 2 else {"inner": inner}
        return {"width": inner}

    model = {"name": "mine:build", "params": nested(33)}
    assert errors_of({"data": SYNTHETIC, "model": model}) == {
        "model.params": "Expected `params` nested at most 32 levels deep (the keyword "
        "arguments of a builder). Received: more than 32"
    }
    # At the limit it passes, and a spec that passes writes back as JSON.
    kept = JobSpec.model_validate(
        {"data": SYNTHETIC, "model": {"name": "m:b", "params": nested(32)}}
    )
    assert json.loads(kept.model_dump_json())["model"]["params"] == nested(32)


def test_parse_spec_unknown_model_name():
    assert errors_of({"data": SYNTHETIC, "model": {"name": "transformer"}}) == {
        "model.name": "Expected one of mlp, cnn, resnet, logistic or 'module:function'. Received: 'transformer'"
    }


def test_parse_spec_bad_model_params():
    assert errors_of({"data": SYNTHETIC, "model": {"name": "cnn", "params": {"dropout": 1.5}}}) == {
        "model.params.dropout": "Input should be less than 1. Received: 1.5"
    }
    assert errors_of({"data": {**SYNTHETIC, "params": {"classes": 1, "colour": 1}}}) == {
        "data.params.classes": "Input should be greater than or equal to 2. Received: 1",
        "data.params.colour": "Unknown key. Remove it or check its spelling. Expected one of: "
        "shape, classes, size, noise.",
    }


@pytest.mark.parametrize("filters", [[32], [32, 64, 128], []])
def test_parse_spec_cnn_filters_must_be_two(filters):
    # [32] was refused as "model.params.filters.1: Field required".
    cnn = {"name": "cnn", "params": {"filters": filters}}
    assert errors_of({"data": SYNTHETIC, "model": cnn}) == {
        "model.params.filters": "Expected two filter counts, one for each conv layer "
        f"(default [32, 64]). Received: {filters}"
    }


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"data": SYNTHETIC, "model": {"name": "x" * 100_000}}, "model.name"),
        ({"data": {**SYNTHETIC, "path": "p" * 100_000}}, "data.path"),
        ({"data": SYNTHETIC, "name": " " * 100_000}, "name"),
    ],
)
def test_a_refused_string_is_echoed_cut_short(raw, field):
    # A 100,000-character model name came back whole in its 422, and in result.json.
    message = errors_of(raw)[field]
    assert message.endswith("... (100,002 characters in all)"), message[-80:]
    # A path is shown up to PATH_MAX (a real one deep in a data root names its file).
    assert len(message) < (4_500 if field == "data.path" else 500)


def test_parse_spec_model_too_large_to_build():
    # Typos that would hang the worker building a million layers, or run it out of memory,
    # are refused by field; the message shows the start of what it refuses, not all of it.
    errors = errors_of(
        {"data": SYNTHETIC, "model": {"name": "mlp", "params": {"hidden": [1] * 100_000}}}
    )
    assert errors == {
        "model.params.hidden": "List should have at most 64 items after validation, not 100000. Received: "
        f"{str([1] * 100_000)[:200]}... (300,000 characters in all)"
    }
    assert errors_of({"data": SYNTHETIC, "model": {"name": "cnn", "params": {"dense": 10**9}}}) == {
        "model.params.dense": "Input should be less than or equal to 65536. Received: 1000000000"
    }
    resnet = {"name": "resnet", "params": {"width": 4096, "blocks_per_stage": [1000]}}
    assert errors_of({"data": SYNTHETIC, "model": resnet}) == {
        "model.params.width": "Input should be less than or equal to 1024. Received: 4096",
        "model.params.blocks_per_stage.0": "Input should be less than or equal to 64. Received: 1000",
    }


def test_parse_spec_model_of_capped_widths_but_too_many_parameters():
    # Each width under its cap, the whole far over any memory: a 3x3 kernel of 65,536 x
    # 65,536 is 155 GB. The worker died building it (OOM-killed, so the service ran it again).
    cnn = {"name": "cnn", "params": {"filters": [65_536, 65_536]}}
    assert errors_of({"data": SYNTHETIC, "model": cnn}) == {
        "model.params": "Expected a model of at most 1,073,741,824 parameters (4 GiB of float32 "
        "weights). Received: cnn with params {'filters': (65536, 65536), 'dense': 512, "
        "'dropout': 0.4} has 40,299,599,370 on 28x28x1 images of 10 classes"
    }
    # File data is not read here: what no image size can make smaller is refused.
    mlp = {"name": "mlp", "params": {"hidden": [65_536, 65_536]}}
    assert errors_of({"data": {"format": "npz", "path": "/x.npz"}, "model": mlp}) == {
        "model.params": "Expected a model of at most 1,073,741,824 parameters (4 GiB of float32 "
        "weights). Received: mlp with params {'hidden': [65536, 65536], 'dropout': 0.0} has "
        "4,295,294,978 on 1x1x1 images of 2 classes, the least any data gives"
    }
    wide = {"name": "resnet", "params": {"width": 1024, "blocks_per_stage": [1, 1, 1, 1]}}
    assert list(errors_of({"data": SYNTHETIC, "model": wide})) == ["model.params"]


def test_parse_spec_accepts_large_models_under_the_parameter_cap():
    # The widest resnet base the field allows, on RGB: 317 million parameters.
    rgb = {**SYNTHETIC, "params": {"shape": [32, 32, 3]}}
    JobSpec.model_validate({"data": rgb, "model": {"name": "resnet", "params": {"width": 1024}}})
    # A custom model's size is its own business: it is not counted.
    JobSpec.model_validate({"data": SYNTHETIC, "model": {"name": "big:build", "params": {}}})


def test_parse_spec_synthetic_data_too_large_for_memory():
    # 10M examples of 64x64x3 would be 123 billion float32 values: refused here, not by a
    # MemoryError in the worker after the job was queued.
    errors = errors_of(
        {"data": {**SYNTHETIC, "params": {"size": 10_000_000, "shape": [64, 64, 3]}}}
    )
    assert errors == {
        "data.params": "Expected synthetic data of at most 268,435,456 values (1 GiB of float32). "
        "Received: size 10000000 x shape [64, 64, 3] = 122,880,000,000 values"
    }


def test_parse_spec_synthetic_crop_padding_of_a_whole_side_is_refused():
    # A shift of 8 or more pixels moves every pixel out of an 8x8 image: padding 64 trained
    # on blank images (98% of them) under their labels, without a word.
    data = {**SYNTHETIC, "params": {"shape": [8, 8]}, "augment": {"random_crop_padding": 64}}
    assert errors_of({"data": data}) == {
        "data": "Expected `random_crop_padding` below the images' height and width (8x8), so "
        "that a shifted image keeps some of its pixels. Received: 64, which would leave about "
        "99% of the training images blank"
    }
    data["augment"] = {"random_crop_padding": 7}
    JobSpec.model_validate({"data": data})


def test_parse_spec_unknown_data_format():
    errors = errors_of({"data": {"format": "csv", "path": "/x"}})
    assert errors == {
        "data.format": "Input should be 'synthetic', 'idx', 'npz' or 'tfrecord'. Received: 'csv'"
    }


def test_parse_spec_file_data_needs_path():
    # Named as the field, which the form marks (it was `data`, the whole part).
    assert errors_of({"data": {"format": "idx"}}) == {
        "data.path": "`path` is required for 'idx' data. Received: None"
    }


def test_parse_spec_synthetic_data_takes_an_empty_path_as_none():
    # An empty path was refused as "`path` must be empty for synthetic data. Received: ''".
    assert JobSpec.model_validate({"data": {**SYNTHETIC, "path": ""}}).data.path is None
    assert errors_of({"data": {**SYNTHETIC, "path": "/data/mnist"}}) == {
        "data.path": "Expected no `path` for synthetic data (leave it out, or null). "
        "Received: '/data/mnist'"
    }


def test_parse_spec_steps_and_epochs_conflict():
    assert errors_of({"data": SYNTHETIC, "steps": 10, "epochs": 2}) == {
        "(spec)": "Give `steps` or `epochs`, not both. Received: steps=10, epochs=2"
    }


def test_parse_spec_batch_smaller_than_towers():
    assert errors_of({"data": SYNTHETIC, "towers": 4, "batch_size": 2}) == {
        "(spec)": "Expected `batch_size` to be at least `towers`, so every tower gets an example. "
        "Received: batch_size=2, towers=4"
    }


def test_parse_spec_logistic_needs_two_classes():
    assert errors_of({"data": SYNTHETIC, "model": {"name": "logistic"}}) == {
        "(spec)": "Model `logistic` needs two-class data. Received: data.params.classes=10"
    }


def test_registry_names_match_builders():
    assert set(MODEL_NAMES) == set(BUILDERS)


def test_import_spec_without_tensorflow():
    code = "import sys, trainer.spec, trainer.rundir, trainer.datafiles, trainer.modelsize, trainer.errors; print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'tensorboard')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
