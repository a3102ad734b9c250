"""The model registry: built-in models on any image size, and custom `module:function`
models that are wrong in the ways user code is wrong, each refused with one line."""

import importlib
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.trainer.test_run import TINY, run_custom_model, run_worker, with_
from trainer.errors import one_line
from trainer.models import ModelError, build_model
from trainer.modelsize import parameter_count
from trainer.spec import ModelSpec

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 3, 1), (1, 9, 3), (2, 5, 2)])
def test_cnn_builds_and_runs_on_small_images(shape):
    # Two 2x2 pools took a 3x3 image to nothing: Keras refused to build it with a page of
    # message, while the contract says images of any height and width work.
    model = build_model(
        ModelSpec(name="cnn", params={"filters": [4, 8], "dense": 8}), shape, 3
    ).model
    assert model(np.zeros((2, *shape), np.float32)).shape == (2, 3)


def test_cnn_on_mnist_sized_images_is_the_classic_model():
    # The small-image change must not touch the model that checkpoints already exist for.
    model = build_model(ModelSpec(name="cnn"), (28, 28, 1), 10).model
    pools = [layer for layer in model.layers if "pooling" in layer.name]
    assert [layer.output.shape[1:3] for layer in pools] == [(14, 14), (7, 7)]
    assert model.count_params() == 1_630_090  # as before the change


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("mlp", {}),
        ("mlp", {"hidden": [7, 5, 3], "dropout": 0.1}),
        ("cnn", {}),
        ("cnn", {"filters": [3, 5], "dense": 7, "dropout": 0.0}),
        ("resnet", {}),
        ("resnet", {"width": 3, "blocks_per_stage": [2, 1, 3]}),
        ("logistic", {}),
    ],
)
@pytest.mark.parametrize("shape", [(28, 28, 1), (1, 1, 1), (3, 7, 3), (9, 2, 5)])
def test_parameter_count_from_the_spec_is_what_keras_builds(name, params, shape):
    # The spec (no TensorFlow) refuses models by this count: it must be the real one.
    spec = ModelSpec(name=name, params=params)
    classes = 2 if name == "logistic" else 10
    model = build_model(spec, shape, classes).model
    assert parameter_count(name, spec.params, shape, classes) == model.count_params()


def test_built_in_models_are_built_as_the_contract_and_their_params_say():
    # JOB_SPEC.md: `mlp` a 784-500-10 perceptron, `cnn` conv3x3x32, pool, conv3x3x64,
    # pool, dense 512 with dropout (0.4), logits. A rate or momentum a builder dropped
    # leaves the parameter count as it was: each is read off its layers.
    def layers(model: keras.Model, kind: type) -> list:
        return [layer for layer in model.layers if isinstance(layer, kind)]

    mlp = build_model(ModelSpec(name="mlp"), (28, 28, 1), 10).model
    assert [layer.units for layer in layers(mlp, keras.layers.Dense)] == [500, 10]
    assert layers(mlp, keras.layers.Dropout) == []  # dropout 0 by default
    cnn = build_model(ModelSpec(name="cnn"), (28, 28, 1), 10).model
    convs = layers(cnn, keras.layers.Conv2D)
    assert [(c.filters, c.kernel_size) for c in convs] == [(32, (3, 3)), (64, (3, 3))]
    assert [layer.units for layer in layers(cnn, keras.layers.Dense)] == [512, 10]
    assert [layer.rate for layer in layers(cnn, keras.layers.Dropout)] == [0.4]

    mlp = build_model(
        ModelSpec(name="mlp", params={"hidden": [6, 5], "dropout": 0.3}), (4, 4, 1), 3
    )
    assert [layer.rate for layer in layers(mlp.model, keras.layers.Dropout)] == [0.3, 0.3]
    cnn = build_model(ModelSpec(name="cnn", params={"dropout": 0.25}), (4, 4, 1), 3)
    assert [layer.rate for layer in layers(cnn.model, keras.layers.Dropout)] == [0.25]
    resnet = build_model(ModelSpec(name="resnet", params={"bn_momentum": 0.7}), (4, 4, 1), 3)
    momenta = {layer.momentum for layer in layers(resnet.model, keras.layers.BatchNormalization)}
    assert momenta == {0.7}


def test_model_too_large_for_its_images_is_refused_before_it_is_built():
    # Under the cap on the smallest images (the service's check), over it on these: the
    # worker counts before allocating 12 GB of first-layer kernel.
    spec = ModelSpec(name="mlp", params={"hidden": [16_384]})
    with pytest.raises(ModelError) as error:
        build_model(spec, (300, 200, 3), 10)
    assert str(error.value) == (
        "Expected a model of at most 1,073,741,824 parameters (4 GiB of float32 weights). "
        "Received: mlp with params {'hidden': [16384], 'dropout': 0.0} has 2,949,300,234 "
        "on 300x200x3 images of 10 classes"
    )


CUSTOM = """
import sys
import keras

def flat(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs)))

def spatial(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    return keras.Model(inputs, keras.layers.Conv2D(num_classes, 1)(inputs))

def two_outputs(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    x = keras.layers.Flatten()(inputs)
    return keras.Model(inputs, [keras.layers.Dense(num_classes)(x), keras.layers.Dense(1)(x)])

def exits(input_shape, num_classes):
    sys.exit(5)

def positional(shape, classes):
    return flat(shape, classes)

def typo_inside(input_shape, num_classes, width=8):
    return flat(input_shape, num_classes, width)

def one_logit(input_shape, num_classes):
    return flat(input_shape, 1)

class Picky(keras.layers.Layer):
    def call(self, x, training=False):
        raise ValueError("wants colour\\nimages only")

def picky_layer(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    return keras.Model(inputs, Picky()(keras.layers.Flatten()(inputs)))

class PickyModel(keras.Model):
    def call(self, x, training=False):
        raise ValueError("subclassed says no")

def picky_model(input_shape, num_classes):
    return PickyModel()

def softmaxed(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    x = keras.layers.Flatten()(inputs)
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax", name="out")(x))

def softmax_layer(input_shape, num_classes):
    return keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(num_classes), keras.layers.Softmax()])

def sigmoid_logit(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    x = keras.layers.Dense(1)(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Activation("sigmoid", name="squash")(x))

def log_softmaxed(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    x = keras.layers.Flatten()(inputs)
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="log_softmax")(x))

def int_input(input_shape, num_classes):
    inputs = keras.Input(input_shape, dtype="int32")
    x = keras.layers.Flatten()(keras.layers.Lambda(lambda t: keras.ops.cast(t, "float32"))(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))

def uint8_sequential(input_shape, num_classes):
    return keras.Sequential([keras.Input(input_shape, dtype="uint8"), keras.layers.Flatten(),
                             keras.layers.Dense(num_classes)])

def half_input(input_shape, num_classes):
    inputs = keras.Input(input_shape, dtype="float16")
    x = keras.layers.Flatten(dtype="float16")(inputs)
    return keras.Model(inputs, keras.layers.Dense(num_classes, dtype="float16")(x))

class Subclassed(keras.Model):
    def __init__(self, units):
        super().__init__()
        self.flatten, self.dense = keras.layers.Flatten(), keras.layers.Dense(units)

    def call(self, x, training=False):
        return self.dense(self.flatten(x))

def subclassed(input_shape, num_classes, units=0):
    return Subclassed(units or num_classes)

def named(input_shape, num_classes, name="hidden"):
    inputs = keras.Input(input_shape)
    x = keras.layers.Dense(4, name=name)(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes, name="logits")(x))

class _Scale(keras.layers.Layer):
    def build(self, shape):
        self.scale = self.add_weight(shape=(), initializer="ones", name="scale")

    def call(self, x):
        return x * self.scale

def private_layer(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    x = _Scale()(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))

class HiddenInside(keras.Model):
    def __init__(self, units):
        super().__init__()
        self.flatten, self.dense = keras.layers.Flatten(), keras.layers.Dense(units, name="_hidden")

    def call(self, x, training=False):
        return self.dense(self.flatten(x))

def hidden_inside(input_shape, num_classes):
    return HiddenInside(num_classes)

def model_named(input_shape, num_classes, name):
    inputs = keras.Input(input_shape)
    logits = keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, logits, name=name)

def nested_underscores(input_shape, num_classes):
    inputs = keras.Input(input_shape, name="_images")
    logits = keras.layers.Dense(num_classes)(keras.layers.Flatten(name="_flat")(inputs))
    return keras.Model(inputs, logits)

def functional_layer_named(input_shape, num_classes, name):
    inputs = keras.Input(input_shape)
    logits = keras.layers.Dense(num_classes)(keras.layers.Flatten(name=name)(inputs))
    return keras.Model(inputs, logits)

class Wraps(keras.Model):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def call(self, x, training=False):
        return self.inner(x)

def wraps_hidden_inside(input_shape, num_classes):
    return Wraps(HiddenInside(num_classes))
"""


@pytest.fixture
def custom(tmp_path, monkeypatch):
    (tmp_path / "qa_custom.py").write_text(CUSTOM)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("qa_custom", None)


@pytest.fixture
def saves_keras_models():
    """For a test that saves subclassed Keras models with `tf.saved_model.save`: a save
    leaves Keras's name scopes entered (one that fails, and some that do not), and every
    variable the process made after it was named under them (`hidden_inside/_m/wraps/
    wraps_1/dense_55/kernel`), so a later test in the same worker found no `logits/kernel`.
    Keras's own reset of its global state closes them."""
    yield
    keras.backend.clear_session()


def refusal(name: str, params: dict | None = None) -> str:
    with pytest.raises(ModelError) as error:
        build_model(ModelSpec(name=f"qa_custom:{name}", params=params or {}), (4, 4, 1), 3)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_custom_model_with_a_map_of_logits_is_refused_before_training(custom):
    # (1, 4, 4, 3) ends in 3 classes too: it passed the check, and the job then failed in
    # its first step with TensorFlow's traceback (exit 1, not 2).
    assert refusal("spatial") == (
        "Expected model 'qa_custom:spatial' to output logits of shape (batch, 3). "
        "Received: output shape (batch, 4, 4, 3)"
    )


def test_custom_model_with_two_outputs_is_refused_saying_so(custom):
    assert refusal("two_outputs") == (
        "Expected model 'qa_custom:two_outputs' to output one tensor of logits. "
        "Received: a list of 2 outputs"
    )


def test_custom_model_of_one_logit_on_three_classes_is_refused(custom):
    assert refusal("one_logit") == (
        "Expected model 'qa_custom:one_logit' to output logits of shape (batch, 3). "
        "Received: output shape (batch, 1)"
    )


def test_custom_model_of_one_logit_on_labels_from_one_is_told_ids_count_from_zero(custom):
    with pytest.raises(ModelError) as error:
        build_model(ModelSpec(name="qa_custom:one_logit"), (4, 4, 1), 3, labels=(1, 2))
    assert str(error.value) == (
        "Expected model 'qa_custom:one_logit' to output logits of shape (batch, 3) (labels "
        "1..2: class ids count from 0, so 3 classes). Received: output shape (batch, 1)"
    )


@pytest.mark.parametrize(
    ("classes", "labels", "received"),
    [
        (
            3,
            (1, 2),
            "labels 1..2: class ids count from 0, so 3 classes; give labels 0 and 1 (y - 1)",
        ),
        # Five labels: no advice to make them two.
        (8, (3, 7), "labels 3..7: class ids count from 0, so 8 classes"),
        (10, (0, 9), "labels 0..9, so 10 classes"),
        (3, None, "3 classes"),
    ],
)
def test_logistic_on_other_than_two_classes_names_the_labels(classes, labels, received):
    # Labels 1 and 2, two classes to their user, were refused as "Received: 3 classes".
    with pytest.raises(ModelError) as error:
        build_model(ModelSpec(name="logistic"), (4, 4, 1), classes, labels=labels)
    assert str(error.value) == f"Model `logistic` needs two-class data. Received: {received}"


def test_custom_model_that_outputs_probabilities_is_refused(custom):
    # Taken for logits, softmax outputs trained on without a word: on MNIST, 75% where the
    # same model's logits reach 91%, and an export whose probabilities are near uniform.
    assert refusal("softmaxed") == (
        "Expected model 'qa_custom:softmaxed' to output logits, with no activation after its "
        "last layer (the trainer's loss applies softmax or sigmoid itself). "
        "Received: an output already passed through softmax (from layer 'out')"
    )
    assert "already passed through softmax (from layer 'softmax" in refusal("softmax_layer")
    message = build_refusal("sigmoid_logit", classes=2)
    assert message.endswith(
        "Received: an output already passed through sigmoid (from layer 'squash')"
    )


def test_custom_model_of_integer_input_is_refused(custom):
    # Fed float32 pixels in [0, 1], an int32 input cast them to 0 (1 for a pixel of 255):
    # the job trained on that, and its eval said 100% on data whose saturated pixels gave
    # the classes away, without a word.
    assert refusal("int_input") == (
        "Expected model 'qa_custom:int_input' to take float images (float32 pixels in "
        "[0, 1], as the job feeds them: integer pixels divided by 255). Received: an input "
        "of dtype int32, which would read every pixel as 0 or 1"
    )
    assert "Received: an input of dtype uint8," in refusal("uint8_sequential")
    # A float input of another width is cast without loss of meaning: accepted.
    model = build_model(ModelSpec(name="qa_custom:half_input"), (4, 4, 1), 3).model
    assert model.output_shape == (None, 3)


def test_custom_model_of_log_softmax_outputs_is_logits_enough(custom):
    # log-probabilities are logits (softmax gives back the same probabilities): accepted.
    model = build_model(ModelSpec(name="qa_custom:log_softmaxed"), (4, 4, 1), 3).model
    assert model.output_shape == (None, 3)


@pytest.mark.parametrize(
    ("name", "params", "binary"),
    [
        ("logistic", {}, True),
        ("mlp", {}, False),
        # A custom model, of no output shape until it has run: its run on the zero batch
        # that checks it says.
        ("qa_custom:subclassed", {"units": 1}, True),  # one sigmoid logit
        ("qa_custom:subclassed", {}, False),  # two logits, softmax
        ("qa_custom:one_logit", {}, True),
        ("qa_custom:flat", {}, False),
    ],
)
def test_a_built_model_says_whether_it_gives_one_sigmoid_logit(custom, name, params, binary):
    assert build_model(ModelSpec(name=name, params=params), (4, 4, 1), 2).binary is binary


def build_refusal(name: str, classes: int) -> str:
    with pytest.raises(ModelError) as error:
        build_model(ModelSpec(name=f"qa_custom:{name}"), (4, 4, 1), classes)
    return str(error.value)


def test_worker_with_a_softmax_model_exits_2_naming_the_layer(tmp_path):
    code, result, log = run_custom_model(
        tmp_path,
        "probs",
        "import keras\n"
        "def build(input_shape, num_classes):\n"
        "    inputs = keras.Input(input_shape)\n"
        "    x = keras.layers.Flatten()(inputs)\n"
        "    return keras.Model(inputs, keras.layers.Dense(num_classes, activation='softmax', name='probs')(x))\n",
    )
    assert code == 2, log
    assert result["message"].endswith("already passed through softmax (from layer 'probs')")
    assert result["errors"][0]["field"] == "model"
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == [
        "progress.jsonl",  # its preparation's lines (tests/trainer/test_run.py)
        "result.json",
        "spec.json",
    ]


def test_custom_builder_that_calls_sys_exit_is_a_model_error(custom):
    assert refusal("exits") == (
        "Model 'qa_custom:exits' failed to build: SystemExit: 5 (qa_custom.py, line 19, in exits)"
    )


def test_custom_builder_with_other_argument_names_is_told_the_names(custom):
    # It said "rejected its params {}", though the spec gave no params.
    assert refusal("positional") == (
        "Expected model 'qa_custom:positional' to take the keyword arguments "
        "input_shape, num_classes. Received: a function positional(shape, classes) "
        "(missing a required argument: 'shape')"
    )


def test_custom_builder_told_which_param_it_does_not_take(custom):
    message = refusal("flat", {"widht": 3})
    assert message.startswith(
        "Expected model 'qa_custom:flat' to take the keyword arguments "
        "input_shape, num_classes, widht. Received: a function flat(input_shape, num_classes)"
    )


def test_type_error_inside_a_builder_is_its_own_failure_not_the_params(custom):
    message = refusal("typo_inside", {"width": 4})
    assert message.startswith("Model 'qa_custom:typo_inside' failed to build: TypeError: ")


def test_custom_layer_that_raises_is_one_line_naming_the_layer(custom):
    # Keras's page (the reason in ANSI bold between "Exception encountered when calling"
    # and the arguments the layer received) was the job's message as it was.
    assert refusal("picky_layer") == (
        "Model 'qa_custom:picky_layer' failed to build: ValueError: wants colour images only "
        "(in Picky.call()) (qa_custom.py, line 32, in call)"
    )
    assert refusal("picky_model") == (
        "Model 'qa_custom:picky_model' failed on a batch of shape (1, 4, 4, 1): "
        "ValueError: subclassed says no (in PickyModel.call()) (qa_custom.py, line 40, in call)"
    )


def test_one_line_of_an_error_raised_in_a_traced_step():
    # What a layer that fails only when training gives inside a tf.function: autograph's
    # traceback, then Keras's page. One line keeps the error and the layer.
    class TrainBoom(keras.layers.Layer):
        def call(self, x, training=False):
            if training:
                raise ValueError("only fails when training")
            return x

    layer = TrainBoom()
    step = tf.function(lambda x: layer(x, training=True))
    with pytest.raises(ValueError) as error:
        step(tf.zeros([2, 3]))
    assert "in user code:" in str(error.value) and "\x1b[" in str(error.value)
    assert one_line(error.value) == "ValueError: only fails when training (in TrainBoom.call())"


def test_worker_with_a_builder_that_exits_ends_with_exit_2_and_a_result(tmp_path):
    # sys.exit() in user code ended the worker with the user's exit code and no
    # result.json, which the service would take for a crash and run again.
    code, result, log = run_custom_model(
        tmp_path, "quitter", "import sys\ndef build(input_shape, num_classes):\n    sys.exit(5)\n"
    )
    assert code == 2, log
    assert result["message"] == (
        "Model 'quitter:build' failed to build: SystemExit: 5 (quitter.py, line 3, in build)"
    )
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == [
        "progress.jsonl",  # its preparation's lines (tests/trainer/test_run.py)
        "result.json",
        "spec.json",
    ]


def test_worker_log_has_the_traceback_of_a_builder_that_raises(tmp_path):
    # The message is one line without the line that raised, and worker.log said only that
    # line again: no file told the user where in their builder it failed.
    code, result, log = run_custom_model(
        tmp_path,
        "broken",
        "def _layers(width):\n"
        "    raise ValueError(f'no layer of width {width}')\n"
        "def build(input_shape, num_classes):\n"
        "    return _layers(3)\n",
    )
    assert code == 2, log
    # The job's error names the innermost line of the module that raised, worker.log all.
    assert result["message"] == (
        "Model 'broken:build' failed to build: ValueError: no layer of width 3 "
        "(broken.py, line 2, in _layers)"
    )
    assert "Traceback (most recent call last):" in log
    assert 'broken.py", line 4, in build' in log and 'broken.py", line 2, in _layers' in log


def test_worker_names_the_line_of_a_builder_that_raises_in_the_jobs_error(tmp_path):
    # The job's error (result.json, the API's `error`, which the dashboard shows) named
    # the exception alone: which line of the user's module raised it was in worker.log.
    code, result, log = run_custom_model(
        tmp_path,
        "mymod",
        "import keras\n"
        "\n"
        "def build(input_shape, num_classes):\n"
        "    inputs = keras.Input(input_shape)\n"
        "    x = keras.layers.Flatten()(inputs)\n"
        "    return keras.Model(inputs, keras.layers.Dense(num_clases)(x))\n",
    )
    assert code == 2, log
    message = (
        "Model 'mymod:build' failed to build: NameError: name 'num_clases' is not defined "
        "(mymod.py, line 6, in build)"
    )
    assert result["message"] == message
    assert result["errors"] == [{"field": "model", "message": message}]


def test_worker_names_the_line_of_a_packaged_builder_whose_shapes_do_not_fit(tmp_path):
    # A shape mistake raises inside Keras: the innermost line in the user's module is the
    # call that made it, named as the module's dotted name places its file.
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "__init__.py").write_text("")
    (tmp_path / "team" / "models.py").write_text(
        "import keras\n"
        "\n"
        "def _head(x, num_classes):\n"
        "    return keras.layers.Add()([keras.layers.Dense(7)(x), keras.layers.Dense(num_classes)(x)])\n"
        "\n"
        "def build(input_shape, num_classes):\n"
        "    inputs = keras.Input(input_shape)\n"
        "    return keras.Model(inputs, _head(keras.layers.Flatten()(inputs), num_classes))\n"
    )
    spec = with_(TINY, model={"name": "team.models:build"})
    code, result, log = run_worker(tmp_path / "job", spec, env={"PYTHONPATH": f"{tmp_path}:{REPO}"})
    assert code == 2, log
    assert result["message"].startswith("Model 'team.models:build' failed to build: ValueError: ")
    assert result["message"].endswith(" (team/models.py, line 4, in _head)"), result["message"]


def test_a_module_whose_top_level_raises_names_its_line(tmp_path, monkeypatch):
    # Gone from sys.modules once its import failed: its file is the one its name places.
    (tmp_path / "top_fails.py").write_text("import math\nRATE = math.log(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModelError) as error:
        build_model(ModelSpec(name="top_fails:build"), (4, 4, 1), 3)
    assert str(error.value) == (
        "Cannot import module 'top_fails' of model 'top_fails:build': ValueError: math domain "
        "error (top_fails.py, line 2, in <module>)"
    )


ODD_BATCH_STEP = """
import numpy as np, tensorflow as tf, keras
from trainer.models import build_model
from trainer.spec import ModelSpec
spec = ModelSpec(name="resnet", params={"width": 8, "blocks_per_stage": [1, 1]})
model = build_model(spec, (16, 16, 3), 5).model
x, y = tf.random.uniform((33, 16, 16, 3)), tf.constant(np.arange(33) % 5)
for _ in range(2):
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, True))
    tape.gradient(loss, model.trainable_variables)
print("trained")
"""


def test_resnet_of_few_channels_trains_on_an_odd_batch() -> None:
    # oneDNN's backward pass of a strided 1x1 convolution killed the process (double free
    # or segfault) on a batch of 33 with 8 input channels; in a subprocess, so a crash
    # fails this test rather than ending the test run.
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", ODD_BATCH_STEP], capture_output=True, text=True, timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0 and "trained" in done.stdout, (done.returncode, done.stderr[-2000:])


def test_strided_pointwise_conv_is_a_strided_conv(tmp_path: Path) -> None:
    from trainer.models import StridedPointwiseConv

    def net(layer: keras.layers.Layer, size: int) -> keras.Model:
        inputs = keras.Input((size, size, 8))
        return keras.Model(inputs, keras.layers.Dense(3)(layer(inputs)))

    for size in (16, 15):  # SAME and VALID agree for a 1x1 kernel, odd sizes included
        keras.utils.set_random_seed(size)
        strided = net(keras.layers.Conv2D(16, 1, strides=2, use_bias=False), size)
        pointwise = net(StridedPointwiseConv(16, 2, use_bias=False), size)
        # A checkpoint of the strided convolution (what older workers saved) restores.
        path = tf.train.Checkpoint(model=strided).save(str(tmp_path / f"ckpt{size}"))
        tf.train.Checkpoint(model=pointwise).restore(path).assert_existing_objects_matched()
        x = tf.random.uniform((4, size, size, 8))
        assert pointwise.output_shape == strided.output_shape
        np.testing.assert_array_equal(pointwise(x).numpy(), strided(x).numpy())


def test_resnet_layers_are_named_for_their_place() -> None:
    # Keras's counters named them `conv2d_3`, `re_lu_4`: the job's TensorBoard tags
    # (`weights/`, `activations/`) said nothing of where a layer sat, and the numbers of
    # a block's conv and its ReLU drifted apart.
    spec = ModelSpec(name="resnet", params={"width": 4, "blocks_per_stage": [1, 2]})
    model = build_model(spec, (8, 8, 1), 3).model

    assert [layer.name for layer in model.layers[1:]] == [
        "stem_conv", "stem_bn", "stem_relu",
        "stage1_block1_conv1", "stage1_block1_bn1", "stage1_block1_relu1",
        "stage1_block1_conv2", "stage1_block1_bn2", "stage1_block1_add", "stage1_block1_out",
        "stage2_block1_conv1", "stage2_block1_bn1", "stage2_block1_relu1",
        "stage2_block1_conv2", "stage2_block1_shortcut", "stage2_block1_bn2",
        "stage2_block1_shortcut_bn", "stage2_block1_add", "stage2_block1_out",
        "stage2_block2_conv1", "stage2_block2_bn1", "stage2_block2_relu1",
        "stage2_block2_conv2", "stage2_block2_bn2", "stage2_block2_add", "stage2_block2_out",
        "pool", "logits",
    ]  # fmt: skip


def test_a_resnet_checkpoint_of_keras_counted_names_restores_into_the_named_layers(
    tmp_path: Path,
) -> None:
    # Jobs checkpointed before the layers had names resume: a checkpoint holds the layers
    # by their order, not their names.
    spec = ModelSpec(name="resnet", params={"width": 4, "blocks_per_stage": [1, 1]})
    named = build_model(spec, (8, 8, 1), 3).model
    inputs = keras.Input((8, 8, 1))
    clone = keras.models.clone_model(
        named,
        input_tensors=inputs,
        clone_function=lambda layer: layer.__class__.from_config(
            {**layer.get_config(), "name": f"counted_{id(layer)}"}
        ),
    )
    for layer in clone.layers[1:]:
        assert layer.name.startswith("counted_")
    for variable in clone.weights:
        variable.assign(tf.random.uniform(variable.shape, seed=1) + 1.0)
    path = tf.train.Checkpoint(model=clone).save(str(tmp_path / "ckpt"))

    tf.train.Checkpoint(model=named).restore(path).assert_existing_objects_matched()

    for a, b in zip(clone.weights, named.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_custom_model_whose_variables_the_export_cannot_save_is_refused(custom, tmp_path):
    # A layer named "_hidden" trained every step of its job, which then failed in its
    # export ("'_hidden/bias' is not a valid root scope name"), and so did each resume.
    message = refusal("named", {"name": "_hidden"})
    assert message == (
        "Expected model 'qa_custom:named' to name its layers as TensorFlow can save them in "
        "the exported model: a letter, digit or '.' first, then letters, digits and "
        "'_', '.', '-', '/', '>'. Received: a variable named '_hidden/kernel': give its "
        "layer another name (Keras names a layer after its class unless given `name=`)"
    )
    assert "Received: a variable named 'my layer/kernel'" in refusal("named", {"name": "my layer"})
    # A layer class named with a leading underscore names its layers so by itself.
    assert "Received: a variable named '__scale/scale'" in refusal("private_layer")
    # Names TensorFlow does save are built, and export.
    for name in ("hidden_", "x-y", ".x", "h2"):
        model = build_model(ModelSpec(name="qa_custom:named", params={"name": name}), (4, 4, 1), 3)
        tf.saved_model.save(model.model, str(tmp_path / name))
    # The premise: TensorFlow itself refuses to save a refused one.
    refused = importlib.import_module("qa_custom").named((4, 4, 1), 3, name="_hidden")
    with pytest.raises(ValueError, match="not a valid root scope name"):
        tf.saved_model.save(refused, str(tmp_path / "refused"))


def test_custom_model_whose_layer_names_the_export_cannot_save_is_refused(
    custom, saves_keras_models, tmp_path
):
    # Names no variable path begins with: a subclassed model's `_hidden` layer holds
    # `hidden_inside/_hidden/kernel`, a functional model named `_m` holds `dense/kernel`.
    # Both passed the variables' check, trained every step, and failed in their export.
    assert refusal("hidden_inside").endswith(
        "Received: a layer named '_hidden': give it another name (Keras names a layer "
        "after its class unless given `name=`)"
    )
    assert "Received: the model itself, named '_m': give it" in refusal(
        "model_named", {"name": "_m"}
    )
    build_model(ModelSpec(name="qa_custom:model_named", params={"name": "m_"}), (4, 4, 1), 3)
    # The premise: TensorFlow itself refuses to save either (the model called first, as
    # `build_model` does, to build the subclassed one).
    module = importlib.import_module("qa_custom")
    for refused in (module.hidden_inside((4, 4, 1), 3), module.model_named((4, 4, 1), 3, "_m")):
        refused(tf.zeros((1, 4, 4, 1)))
        with pytest.raises(ValueError, match="not a valid root scope name"):
            tf.saved_model.save(refused, str(tmp_path / f"refused-{refused.name}"))


def test_layer_names_in_a_scope_of_their_own_need_only_its_rule(
    custom, saves_keras_models, tmp_path
):
    # A functional model calls its layers inside its own scope, as a subclassed model does
    # its layers' layers: a `_` first is fine there (TensorFlow saves them), and was refused.
    module = importlib.import_module("qa_custom")
    for name in ("nested_underscores", "wraps_hidden_inside"):
        build_model(ModelSpec(name=f"qa_custom:{name}"), (4, 4, 1), 3)
        accepted = getattr(module, name)((4, 4, 1), 3)
        accepted(tf.zeros((1, 4, 4, 1)))
        tf.saved_model.save(accepted, str(tmp_path / name))
    # A space is no nested scope's name either: refused, as its first step failed.
    assert "Received: a layer named 'flat x': give it" in refusal(
        "functional_layer_named", {"name": "flat x"}
    )
