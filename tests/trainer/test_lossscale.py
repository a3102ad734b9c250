"""Dynamic loss scaling of a model that computes in float16, against Keras's own
`LossScaleOptimizer`, on real logical CPU devices."""

import logging
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

from tests.trainer.test_multiworker import finish, start_cluster, worker_dirs
from tests.trainer.test_run import REPO, TINY, run_worker, with_
from trainer.checkpoints import Checkpointer
from trainer.lossscale import GROWTH_STEPS, INITIAL_SCALE, computes_in_float16
from trainer.models import build_model
from trainer.optim import make_optimizer
from trainer.spec import CheckpointSpec, ModelSpec, OptimizerSpec
from trainer.towers import SCALARS, TowerTrainer

SHAPE = (8, 8, 1)
CLASSES = 4
# A warm-up, so that the rate of each update says how many updates the optimizer counted
# (a skipped step counts as none, in Keras's `LossScaleOptimizer` as here).
MOMENTUM = OptimizerSpec(name="momentum", learning_rate=0.05, warmup_steps=10)


def float16_model(policy: str = "mixed_float16") -> keras.Model:
    """A small MLP computing in float16 (float32 weights), the policy set per layer so that
    other tests keep the global one. Its last kernel is small, so the gradients that flow
    back through it are float16's subnormals and smaller: without a loss scale they are
    rounded coarsely or flushed to zero."""
    keras.utils.set_random_seed(7)
    inputs = keras.Input(SHAPE)
    x = keras.layers.Flatten(dtype=policy)(inputs)
    x = keras.layers.Dense(16, activation="relu", dtype=policy)(x)
    small = keras.initializers.RandomNormal(stddev=1e-3)
    return keras.Model(
        inputs, keras.layers.Dense(CLASSES, kernel_initializer=small, dtype=policy)(x)
    )


def trainer(towers: int, spec: OptimizerSpec = MOMENTUM, **kw) -> TowerTrainer:
    with tf.device("/CPU:0"):
        return TowerTrainer(
            model=float16_model(),
            optimizer=make_optimizer(spec),
            tower_devices=[f"/CPU:{i}" for i in range(towers)],
            parameter_device="/CPU:0",
            **kw,
        )


def keras_reference(spec: OptimizerSpec = MOMENTUM) -> keras.Model:
    """The same model trained by Keras's `fit` step, under its `LossScaleOptimizer`."""
    model = float16_model()
    model.compile(
        optimizer=keras.optimizers.LossScaleOptimizer(make_optimizer(spec)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.optimizer.build(model.trainable_variables)
    return model


def batch(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.random((n, *SHAPE), dtype=np.float32), rng.integers(0, CLASSES, n).astype(np.int32)


def weights(model: keras.Model) -> list[np.ndarray]:
    return [v.numpy().copy() for v in model.trainable_variables]


def scale_of(t: TowerTrainer) -> tuple[float, int]:
    assert t.loss_scale is not None
    return float(t.loss_scale.scale.numpy()), int(t.loss_scale.good_steps.numpy())


def test_which_models_are_loss_scaled():
    assert computes_in_float16(float16_model())
    assert not computes_in_float16(float16_model("float32"))
    # bfloat16 has float32's range: Keras's `fit` scales only under mixed_float16.
    assert not computes_in_float16(float16_model("mixed_bfloat16"))
    # One float16 layer is enough, whatever the model's own policy says.
    inputs = keras.Input(SHAPE)
    x = keras.layers.Flatten()(inputs)
    one = keras.Model(inputs, keras.layers.Dense(CLASSES, dtype="mixed_float16")(x))
    assert one.dtype_policy.name == "float32" and computes_in_float16(one)


def test_a_float32_model_trains_without_a_loss_scale(tmp_path):
    # Its step, scalars and checkpoint stay as they were: no finiteness check, no cond.
    with tf.device("/CPU:0"):
        net = build_model(ModelSpec(name="cnn"), SHAPE, CLASSES).model
        plain = TowerTrainer(
            model=net,
            optimizer=make_optimizer(MOMENTUM),
            tower_devices=["/CPU:0", "/CPU:1"],
            parameter_device="/CPU:0",
        )
    assert plain.loss_scale is None and plain.scalar_names == SCALARS
    graph = plain.train_function.get_concrete_function().graph
    assert "IsFinite" not in {op.type for op in graph.get_operations()}
    checkpointer = Checkpointer(
        tmp_path, plain, iter(tf.data.Dataset.range(1)), CheckpointSpec(every_steps=1, keep=1)
    )
    assert "loss_scale" not in checkpointer.checkpoint._trackable_children()


@pytest.mark.parametrize("fused", [True, False], ids=["fused kernels", "through Keras"])
def test_a_float16_model_on_one_tower_trains_as_keras_loss_scale_optimizer_does(fused):
    # Keras's `fit` step on one device, with its LossScaleOptimizer around the same
    # optimizer, and the tower step on one tower: the same bits at every step, through
    # overflowing steps (skipped, the scale halved, no update counted: the warm-up's rate
    # says so) and a growth (the scale doubled after GROWTH_STEPS finite steps).
    mine, theirs = trainer(1, fused_updates=fused), keras_reference()
    assert mine.loss_scale is not None
    lso = theirs.optimizer
    huge = 2.0**21  # times the loss: float16's range (65504) overflows in the backward pass
    for s in (mine.loss_scale.scale, lso.dynamic_scale):
        s.assign(huge)
    history = []
    for step in range(12):
        if step == 11:  # the next finite step is the GROWTH_STEPS-th in a row
            for c in (mine.loss_scale.good_steps, lso.step_counter):
                c.assign(GROWTH_STEPS - 1)
        x, y = batch(32, seed=step)
        mine.train_step(x, y)
        theirs.train_on_batch(x, y)
        history.append(scale_of(mine))
        assert history[-1] == (float(lso.dynamic_scale.numpy()), int(lso.step_counter.numpy()))
        assert int(mine.optimizer.iterations.numpy()) == int(lso.iterations.numpy())
        for a, b in zip(weights(mine.model), weights(theirs), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"step {step + 1}")
    scales = [s for s, _ in history]
    skipped = sum(b < a for a, b in zip([huge, *scales], scales, strict=False))
    assert skipped >= 2, history  # it went through overflows...
    assert scales[-2] < scales[-1] == 2 * scales[-2], history  # ...and a growth
    assert history[-1][1] == 0
    assert int(mine.step.numpy()) == 12  # each skipped step counted as a step
    assert int(mine.optimizer.iterations.numpy()) == 12 - skipped


def relative_update_error(mine: keras.Model, theirs: keras.Model, start: list[np.ndarray]):
    """The largest, over the variables, of |my update - Keras's| / |Keras's| (2-norms)."""
    return max(
        float(np.linalg.norm((a - w) - (b - w)) / np.linalg.norm(b - w))
        for a, b, w in zip(weights(mine), weights(theirs), start, strict=True)
    )


# The tolerance for two towers: each tower's gradients come out of its float16 backward pass
# rounded to float16 (2**-11 = 4.9e-4 relative), one rounding per tower where one device
# rounds once, and the towers' sums partly cancel, which makes that relative difference
# larger in their sum. Measured on this test's model: 3.7e-3 with the loss scaled, and
# 3.5e-2 with it held at 1 (the step without loss scaling): 1e-2 lies between, a factor
# of about 3 from each.
TWO_TOWERS_TOLERANCE = 1e-2


def test_a_float16_model_on_two_towers_matches_keras_loss_scale_optimizer():
    sgd = OptimizerSpec(name="sgd", learning_rate=0.05)
    mine, theirs, unscaled = trainer(2, sgd), keras_reference(sgd), trainer(2, sgd)
    assert unscaled.loss_scale is not None
    unscaled.loss_scale.scale.assign(1.0)  # stays 1: it would grow only after 2000 steps
    start = weights(theirs)
    for step in range(3):
        x, y = batch(256, seed=step)
        out = mine.train_step(x, y)
        unscaled.train_step(x, y)
        keras_loss = theirs.train_on_batch(x, y)
        # The step's loss is the real one, not the scaled one.
        assert float(out["loss"]) == pytest.approx(keras_loss, rel=1e-3)
    assert scale_of(mine) == (INITIAL_SCALE, 3)
    assert relative_update_error(mine.model, theirs, start) < TWO_TOWERS_TOLERANCE
    # What the tolerance tells apart: float16 gradients without a loss scale.
    assert relative_update_error(unscaled.model, theirs, start) > TWO_TOWERS_TOLERANCE


def test_an_overflowing_step_is_skipped_counted_and_halves_the_scale():
    adam = OptimizerSpec(name="adam", learning_rate=0.01)
    t = trainer(2, adam, ema_decay=0.9, clip_norm=1.0, weight_decay=1e-3)
    assert t.loss_scale is not None
    x, y = batch(32)
    t.train_step(x, y)  # a finite step, so that the slots are not zeros
    assert scale_of(t) == (INITIAL_SCALE, 1)
    before = [v.numpy().copy() for v in t.model.trainable_variables + t.optimizer.variables]
    assert t.ema is not None
    shadows = [s.numpy().copy() for s in t.ema.shadows]
    t.loss_scale.scale.assign(2.0**40)
    out = t.train_step(x, y, with_scalars=True)
    after = [v.numpy() for v in t.model.trainable_variables + t.optimizer.variables]
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)  # weights, slots and iteration count
    assert int(t.step.numpy()) == 2
    # The EMA moves on as on any step, towards weights that did not: its decay at step 2
    # is min(0.9, 3 / 12).
    for shadow, old, var in zip(t.ema.shadows, shadows, before, strict=False):
        np.testing.assert_allclose(shadow.numpy(), 0.25 * old + 0.75 * var, rtol=1e-6)
    moved = zip(t.ema.shadows, shadows, strict=True)
    assert any(not np.array_equal(shadow.numpy(), old) for shadow, old in moved)
    assert scale_of(t) == (2.0**39, 0)
    assert not all(np.isfinite(g.numpy()).all() for g in out["grads"])
    # Its loss is the real one (the weights did not move, so it is the step before's too).
    logits = tf.cast(t.model(x, training=True), tf.float32)
    real = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    assert float(out["loss"]) == pytest.approx(float(real), rel=1e-3)
    # The scalars carry the scale the step used, after the others, before the towers' losses.
    assert t.scalar_names == (*SCALARS, "loss_scale")
    packed = out["scalars"].numpy()
    assert packed[len(SCALARS)] == 2.0**40 and len(packed) == len(SCALARS) + 1 + 2
    assert packed[0] == pytest.approx(float(out["loss"]))

    # The next step, at a scale it does not overflow at, is finite and trains.
    t.loss_scale.scale.assign(INITIAL_SCALE)
    t.train_step(x, y)
    assert scale_of(t) == (INITIAL_SCALE, 1)
    assert int(t.optimizer.iterations.numpy()) == 2
    assert not np.array_equal(t.model.trainable_variables[0].numpy(), before[0])


def test_a_float16_run_resumes_with_its_scale_exactly(tmp_path):
    adam = OptimizerSpec(name="adam", learning_rate=0.01)

    def fresh() -> TowerTrainer:
        return trainer(2, adam)

    def checkpointer(t: TowerTrainer) -> Checkpointer:
        data = iter(tf.data.Dataset.range(1))
        return Checkpointer(tmp_path, t, data, CheckpointSpec(every_steps=1, keep=1))

    def started(t: TowerTrainer) -> TowerTrainer:
        # Not the fresh values, and the growth falls after the resume, at step 5.
        assert t.loss_scale is not None
        t.loss_scale.scale.assign(2.0**12)
        t.loss_scale.good_steps.assign(GROWTH_STEPS - 5)
        return t

    whole = started(fresh())
    for step in range(1, 7):
        whole.train_step(*batch(16, seed=step))
    assert scale_of(whole) == (2.0**13, 1)

    first = started(fresh())
    for step in range(1, 4):
        first.train_step(*batch(16, seed=step))
    checkpointer(first).save(3)
    resumed = fresh()
    assert checkpointer(resumed).restore_latest() == 3
    assert scale_of(resumed) == (2.0**12, GROWTH_STEPS - 2)
    for step in range(4, 7):
        resumed.train_step(*batch(16, seed=step))
    assert scale_of(resumed) == scale_of(whole)
    for a, b in zip(
        resumed.model.variables + resumed.optimizer.variables,
        whole.model.variables + whole.optimizer.variables,
        strict=True,
    ):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


# A custom model under Keras's mixed-precision recipe, whose logits are 64 times a Dense
# layer's: at the first steps its scaled gradients overflow float16 (65504) in the backward
# pass, until the scale has come down.
OVERFLOWING = """
import keras
def build(input_shape, num_classes):
    keras.mixed_precision.set_global_policy("mixed_float16")
    inputs = keras.Input(input_shape)
    x = keras.layers.Dense(16, activation="relu")(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Rescaling(64.0)(keras.layers.Dense(num_classes)(x)))
"""
JOB = with_(
    TINY,
    model={"name": "overflowing:build"},
    batch_size=30,
    steps=30,
    deterministic=True,
    eval={"every_steps": 0, "batches": 1},
    summaries={"scalars_every": 5, "histograms_every": 5, "images_every": 0, "trace_steps": []},
    checkpoint={"every_steps": 10, "every_seconds": 0, "keep": 3},
)


def checkpoint_values(job_dir: Path, step: int) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(job_dir / "checkpoints" / f"ckpt-{step}"))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if name.startswith(("model/", "optimizer/", "step/", "loss_scale/"))
    }


def scale_in(values: dict[str, np.ndarray]) -> float:
    return float(values["loss_scale/scale/.ATTRIBUTES/VARIABLE_VALUE"])


@pytest.fixture(scope="module")
def two_towers(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("float16")
    (folder / "overflowing.py").write_text(OVERFLOWING)
    code, result, log = run_worker(folder / "job", JOB, env={"PYTHONPATH": f"{folder}:{REPO}"})
    assert code == 0, log
    assert result["outcome"] == "succeeded" and result["step"] == 30, result
    return folder


def test_a_float16_job_skips_its_overflowing_steps_and_charts_its_loss_scale(two_towers):
    # An overflow of the scaled gradients is not the model's: the job neither fails as a
    # non-finite loss nor trains on infinite gradients. The scale each step used is charted.
    acc = event_accumulator.EventAccumulator(
        str(two_towers / "job" / "tb" / "train"), size_guidance={"tensors": 0}
    )
    acc.Reload()
    charted = {e.step: float(tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors("loss_scale")}
    assert sorted(charted) == [1, 5, 10, 15, 20, 25, 30]
    assert "float16" in acc.SummaryMetadata("loss_scale").summary_description
    assert charted.pop(1) == INITIAL_SCALE  # what the first step used
    assert all(s < INITIAL_SCALE and np.log2(s) == int(np.log2(s)) for s in charted.values())
    saved = checkpoint_values(two_towers / "job", 30)
    assert scale_in(saved) < INITIAL_SCALE
    assert "loss_scale/good_steps/.ATTRIBUTES/VARIABLE_VALUE" in saved
    # Each skipped step halved the scale (no growth in 30 steps) and counts as a step, not
    # as an update (the optimizer's iteration count, as in Keras's LossScaleOptimizer).
    skipped = int(np.log2(INITIAL_SCALE / scale_in(saved)))
    assert int(saved["step/.ATTRIBUTES/VARIABLE_VALUE"]) == 30
    assert int(saved["optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"]) == 30 - skipped


def test_two_workers_take_the_same_loss_scale_decisions_as_two_towers(two_towers, tmp_path):
    # Each worker decides from the all-reduced sum of the towers' scaled gradients: the
    # same sum on every worker, so the same skips, the same scale, and bit for bit one
    # machine's two towers.
    hosts = [tmp_path / "host-a", tmp_path / "host-b"]
    for host in hosts:
        host.mkdir()
        (host / "overflowing.py").write_text(OVERFLOWING)  # each worker imports its own
    job_dir = tmp_path / "job"
    spec = with_(JOB, towers=1)
    for code, log in finish(start_cluster(job_dir, [spec, spec], cwds=hosts)):
        assert code == 0, log
    for step in (10, 30):
        one = checkpoint_values(two_towers / "job", step)
        chief, worker = (checkpoint_values(d, step) for d in worker_dirs(job_dir, 2))
        assert one.keys() == chief.keys() == worker.keys()
        for name in one:
            np.testing.assert_array_equal(chief[name], worker[name], err_msg=f"{name}, {step}")
            np.testing.assert_array_equal(chief[name], one[name], err_msg=f"{name}, {step}")
    assert scale_in(one) < INITIAL_SCALE


def test_a_float16_checkpoint_from_before_loss_scaling_resumes_with_a_fresh_scale(tmp_path, caplog):
    # A job checkpointed by a worker without loss scaling, resumed by one with it: it
    # failed as a checkpoint "that does not fit this job's model or optimizer".
    def checkpointer(t: TowerTrainer) -> Checkpointer:
        data = iter(tf.data.Dataset.range(1))
        return Checkpointer(tmp_path, t, data, CheckpointSpec(every_steps=1, keep=1))

    caplog.set_level(logging.INFO, logger="trainer.checkpoints")
    old = trainer(2)
    old.train_step(*batch(16))
    old.loss_scale = None  # what the checkpoint held before
    checkpointer(old).save(1)
    assert not any(k.startswith("loss_scale/") for k, _ in tf.train.list_variables(str(tmp_path)))

    resumed = trainer(2)
    assert resumed.loss_scale is not None
    resumed.loss_scale.scale.assign(2.0**5)  # so that the restore is seen to leave it
    assert checkpointer(resumed).restore_latest() == 1
    for a, b in zip(resumed.model.variables, old.model.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert scale_of(resumed) == (2.0**5, 0)
    assert "holds no loss scale (written before float16 models had one)" in caplog.text
    # Saved again, it holds one, and restores it.
    resumed.train_step(*batch(16, seed=1))
    checkpointer(resumed).save(2)
    again = trainer(2)
    assert checkpointer(again).restore_latest() == 2
    assert scale_of(again) == scale_of(resumed) == (2.0**5, 1)


def test_a_float16_job_whose_loss_is_infinite_still_fails_naming_the_step(tmp_path):
    # Its logits overflow float16 in the forward pass: the loss itself is infinite, which
    # no loss scale makes finite. The step is skipped as any overflow is, and the job
    # fails as a non-finite loss, as before.
    (tmp_path / "infinite.py").write_text(OVERFLOWING.replace("Rescaling(64.0)", "Rescaling(1e6)"))
    spec = with_(JOB, model={"name": "infinite:build"})
    code, result, log = run_worker(tmp_path / "job", spec, env={"PYTHONPATH": f"{tmp_path}:{REPO}"})
    assert code == 1, log
    assert result["message"].startswith("Loss became non-finite ("), result
    assert result["message"].endswith(" at step 1."), result
