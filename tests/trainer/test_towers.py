"""The tower step on real logical CPU devices: equivalence with one device, uneven batches,
batch-norm statistics, clipping, weight decay and EMA."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer.models import build_model
from trainer.optim import make_optimizer
from trainer.spec import ModelSpec, OptimizerSpec
from trainer.towers import SCALARS, TowerTrainer, host_tower_sizes, tower_sizes

SHAPE = (8, 8, 1)
CLASSES = 4


def make_trainer(
    towers: int, *, optimizer: str = "sgd", lr: float = 0.01, model: str = "mlp", params=None, **kw
):
    keras.utils.set_random_seed(7)  # same initial weights for every trainer
    with tf.device("/CPU:0"):
        net = build_model(ModelSpec(name=model, params=params or {}), SHAPE, CLASSES).model
        return TowerTrainer(
            model=net,
            optimizer=make_optimizer(OptimizerSpec(name=optimizer, learning_rate=lr)),
            tower_devices=[f"/CPU:{i}" for i in range(towers)],
            parameter_device="/CPU:0",
            **kw,
        )


def batch(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.random((n, *SHAPE), dtype=np.float32), rng.integers(0, CLASSES, n).astype(np.int32)


def max_weight_difference(a: TowerTrainer, b: TowerTrainer) -> float:
    return max(
        float(np.abs(u.numpy() - v.numpy()).max())
        for u, v in zip(a.model.trainable_variables, b.model.trainable_variables, strict=True)
    )


def test_split_tower_sizes_uneven():
    assert tower_sizes(tf.constant(250), 4).numpy().tolist() == [63, 63, 62, 62]
    assert tower_sizes(tf.constant(3), 4).numpy().tolist() == [1, 1, 1, 0]


def test_the_host_splits_a_batch_as_the_step_does():
    # The image summaries show each tower's shard, split on the host.
    for batch in range(0, 20):
        for towers in range(1, 6):
            expected = tower_sizes(tf.constant(batch), towers).numpy().tolist()
            assert host_tower_sizes(batch, towers) == expected


@pytest.mark.parametrize(("optimizer", "tolerance"), [("sgd", 1e-6), ("adam", 1e-5)])
def test_train_step_four_towers_equals_one(optimizer, tolerance):
    one, four = make_trainer(1, optimizer=optimizer), make_trainer(4, optimizer=optimizer)
    x, y = batch(64)
    before = max_weight_difference(one, four)
    out_one, out_four = one.train_step(x, y), four.train_step(x, y)
    assert before == 0.0
    # The step moved the weights, so equality below is not the trivial kind.
    assert max(float(np.abs(v.numpy()).max()) for v in out_one["grads"]) > 1e-4
    assert max_weight_difference(one, four) <= tolerance
    assert float(out_four["loss"]) == pytest.approx(float(out_one["loss"]), abs=1e-6)
    assert out_four["tower_loss"].shape == (4,)


def test_train_step_uneven_batch_weights_towers_by_share():
    one, four = make_trainer(1), make_trainer(4)
    x, y = batch(250)
    one.train_step(x, y)
    out = four.train_step(x, y)
    assert max_weight_difference(one, four) <= 1e-6
    # Tower losses are means over shards of 63, 63, 62, 62; weighted, they are the batch mean.
    shares = np.array([63, 63, 62, 62]) / 250
    assert float(np.dot(shares, out["tower_loss"].numpy())) == pytest.approx(
        float(out["loss"]), abs=1e-5
    )


def test_train_step_batch_smaller_than_towers_stays_finite():
    trainer = make_trainer(4, model="resnet", params={"width": 4, "blocks_per_stage": [1]})
    x, y = batch(3)
    out = trainer.train_step(x, y)
    assert np.isfinite(float(out["loss"]))
    assert all(np.isfinite(v.numpy()).all() for v in trainer.model.variables)


def test_batch_norm_moving_mean_matches_one_device():
    params = {"width": 4, "blocks_per_stage": [1], "bn_momentum": 0.5}
    one = make_trainer(1, model="resnet", params=params)
    two = make_trainer(2, model="resnet", params=params)
    x, y = batch(64)
    one.train_step(x, y)
    two.train_step(x, y)

    def first_bn(t: TowerTrainer) -> keras.layers.BatchNormalization:
        return next(
            layer for layer in t.model.layers if isinstance(layer, keras.layers.BatchNormalization)
        )

    # The first BN layer sees the same conv outputs in both, so the averaged update of the
    # moving mean equals the single-device update on the whole batch.
    m1, m2 = first_bn(one).moving_mean.numpy(), first_bn(two).moving_mean.numpy()
    assert np.abs(m1).max() > 1e-3
    np.testing.assert_allclose(m2, m1, atol=1e-6)
    # Sequential per-tower updates would have given 0.5 * (0.5 * 0 + 0.5 * b0) + 0.5 * b1,
    # visibly different from the average.
    v1, v2 = first_bn(one).moving_variance.numpy(), first_bn(two).moving_variance.numpy()
    np.testing.assert_allclose(v2, v1, rtol=0.1)


def test_clip_norm_bounds_the_update():
    free, clipped = make_trainer(1, lr=1.0), make_trainer(1, lr=1.0, clip_norm=1e-3)
    x, y = batch(32)
    start = [v.numpy().copy() for v in clipped.model.trainable_variables]
    free.train_step(x, y)
    out = clipped.train_step(x, y)
    assert float(out["grad_norm"]) > 1e-3
    moved = np.sqrt(
        sum(
            ((v.numpy() - s) ** 2).sum()
            for v, s in zip(clipped.model.trainable_variables, start, strict=True)
        )
    )
    assert moved == pytest.approx(1e-3, rel=1e-3)


def test_weight_decay_shrinks_kernels_only():
    plain, decayed = make_trainer(1, lr=0.1), make_trainer(1, lr=0.1, weight_decay=0.5)
    x, y = batch(32)
    before = [v.numpy().copy() for v in decayed.model.trainable_variables]
    plain_out = plain.train_step(x, y, with_scalars=True)
    out = decayed.train_step(x, y, with_scalars=True)
    # As the README says: the loss reported leaves the L2 term out, and `grad_norm` (as
    # the `gradients/` histograms) is of the gradient with it.
    assert float(out["loss"]) == float(plain_out["loss"])
    with_decay = [
        g.numpy() + (0.5 * w if w.ndim > 1 else 0.0)
        for g, w in zip(plain_out["grads"], before, strict=True)
    ]
    for mine, expected in zip(out["grads"], with_decay, strict=True):
        np.testing.assert_allclose(mine.numpy(), expected, atol=1e-6)
    norm = np.sqrt(sum(float((g**2).sum()) for g in with_decay))
    assert float(out["grad_norm"]) == pytest.approx(norm, rel=1e-5)
    for p, d, w in zip(
        plain.model.trainable_variables, decayed.model.trainable_variables, before, strict=True
    ):
        if len(p.shape) > 1:
            # SGD: w' = w - lr * (g + wd * w), so decay takes lr * wd * w_before off.
            np.testing.assert_allclose(p.numpy() - d.numpy(), 0.1 * 0.5 * w, atol=1e-6)
        else:
            np.testing.assert_allclose(p.numpy(), d.numpy(), atol=1e-7)


def test_ema_tracks_weights_and_swaps_in():
    trainer = make_trainer(2, lr=0.5, ema_decay=0.9)
    x, y = batch(32)
    for _ in range(3):
        trainer.train_step(x, y)
    trained = [v.numpy().copy() for v in trainer.model.trainable_variables]
    shadows = [s.numpy() for s in trainer.ema.shadows]
    assert any(not np.allclose(a, b) for a, b in zip(trained, shadows, strict=True))
    with trainer.ema.swapped_in():
        for v, s in zip(trainer.model.trainable_variables, shadows, strict=True):
            np.testing.assert_array_equal(v.numpy(), s)
    for v, t in zip(trainer.model.trainable_variables, trained, strict=True):
        np.testing.assert_array_equal(v.numpy(), t)


def test_weight_decay_is_added_to_the_towers_sum_as_a_cluster_adds_it():
    # A cluster's all-reduce gives the towers' sum, then the decay is added: (g0 + g1) + wd * w.
    # One machine's `add_n(towers) + wd * w` was merged by Grappler into one AddN with the
    # decay first, (wd * w + g0) + g1: the two parted in the last bits, where the docs say
    # two workers end a run bit for bit as one machine's two towers.
    trainer = make_trainer(2, lr=0.1, weight_decay=0.01)
    x, y = batch(30)
    before = [v.numpy().copy() for v in trainer.model.trainable_variables]
    towers = []
    for shard in (slice(0, 15), slice(15, 30)):  # the step's split, and its objective
        with tf.GradientTape() as tape:
            logits = trainer.model(x[shard], training=True)
            loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y[shard], logits=logits)
            objective = 1.0 * tf.reduce_sum(loss) / 30.0
        towers.append(
            [g.numpy() for g in tape.gradient(objective, trainer.model.trainable_variables)]
        )
    trainer.train_step(x, y)
    lr, wd = np.float32(0.1), np.float32(0.01)
    for k, (var, w) in enumerate(zip(trainer.model.trainable_variables, before, strict=True)):
        summed = towers[0][k] + towers[1][k]
        expected = w - lr * (summed + wd * w if w.ndim > 1 else summed)
        np.testing.assert_array_equal(var.numpy(), expected, err_msg=var.path)


def test_ema_is_the_readme_average_and_a_checkpoint_resumes_it_exactly(tmp_path):
    from trainer.checkpoints import Checkpointer
    from trainer.spec import CheckpointSpec

    def trainer() -> TowerTrainer:
        return make_trainer(2, optimizer="adam", lr=0.05, ema_decay=0.95)

    whole = trainer()
    expected = [v.numpy().copy() for v in whole.model.trainable_variables]
    for step in range(1, 7):
        whole.train_step(*batch(16, seed=step))
        # README: each step's decay min(ema_decay, (1 + step) / (10 + step)), steps from 1.
        decay = np.float32(min(0.95, (1 + step) / (10 + step)))
        expected = [
            decay * e + (1 - decay) * v.numpy()
            for e, v in zip(expected, whole.model.trainable_variables, strict=True)
        ]
        assert whole.ema is not None
        for shadow, e in zip(whole.ema.shadows, expected, strict=True):
            np.testing.assert_allclose(shadow.numpy(), e, atol=1e-7)

    def checkpointer(t: TowerTrainer) -> Checkpointer:
        data = iter(tf.data.Dataset.range(1))
        return Checkpointer(tmp_path, t, data, CheckpointSpec(every_steps=1, keep=1))

    first = trainer()
    for step in range(1, 4):
        first.train_step(*batch(16, seed=step))
    checkpointer(first).save(3)
    resumed = trainer()
    assert checkpointer(resumed).restore_latest() == 3
    for step in range(4, 7):
        resumed.train_step(*batch(16, seed=step))
    assert resumed.ema is not None and whole.ema is not None
    for a, b in zip(resumed.ema.shadows, whole.ema.shadows, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_checkpoint_names_the_ema_shadows_alone_under_ema(tmp_path):
    # Read by name (`tf.train.load_checkpoint`, `list_variables`), the trained weights were
    # keyed `ema/_variables/<i>` beside the averages' `ema/shadows/<i>`: the wrong weights
    # for anyone after the EMA's.
    from trainer.checkpoints import Checkpointer
    from trainer.spec import CheckpointSpec

    trainer = make_trainer(2, lr=0.5, ema_decay=0.9)
    for step in range(1, 4):
        trainer.train_step(*batch(16, seed=step))
    data = iter(tf.data.Dataset.range(1))
    Checkpointer(tmp_path, trainer, data, CheckpointSpec(every_steps=1, keep=1)).save(3)
    reader = tf.train.load_checkpoint(str(tmp_path / "ckpt-3"))
    keys = set(reader.get_variable_to_shape_map())
    assert trainer.ema is not None
    weights = trainer.model.trainable_variables
    assert {k for k in keys if k.startswith("ema/")} == {
        f"ema/shadows/{i}/.ATTRIBUTES/VARIABLE_VALUE" for i in range(len(weights))
    }
    # README's keys: the averages, and the trained weights by the optimizer's path.
    for i, (shadow, weight) in enumerate(zip(trainer.ema.shadows, weights, strict=True)):
        np.testing.assert_array_equal(
            reader.get_tensor(f"ema/shadows/{i}/.ATTRIBUTES/VARIABLE_VALUE"), shadow.numpy()
        )
        np.testing.assert_array_equal(
            reader.get_tensor(f"optimizer/_trainable_variables/{i}/.ATTRIBUTES/VARIABLE_VALUE"),
            weight.numpy(),
        )


def test_a_checkpoint_whose_ema_held_the_weights_too_still_resumes_exactly(tmp_path):
    # Checkpoints written before the EMA stopped tracking the model's variables hold them
    # under `ema/_variables/<i>`: they restore by object, not by name.
    from trainer.checkpoints import Checkpointer
    from trainer.spec import CheckpointSpec

    old = make_trainer(2, lr=0.5, ema_decay=0.9)
    for step in range(1, 4):
        old.train_step(*batch(16, seed=step))
    assert old.ema is not None
    earlier = tf.Module(name="ema")  # the layout then: the weights, then the shadows
    earlier._variables = list(old.model.trainable_variables)
    earlier.shadows = old.ema.shadows
    ema, old.ema = old.ema, earlier
    data = iter(tf.data.Dataset.range(1))
    Checkpointer(tmp_path, old, data, CheckpointSpec(every_steps=1, keep=1)).save(3)
    old.ema = ema
    keys = tf.train.load_checkpoint(str(tmp_path / "ckpt-3")).get_variable_to_shape_map()
    assert any(k.startswith("ema/_variables/") for k in keys), sorted(keys)

    resumed = make_trainer(2, lr=0.5, ema_decay=0.9)
    data = iter(tf.data.Dataset.range(1))
    checkpointer = Checkpointer(tmp_path, resumed, data, CheckpointSpec(every_steps=1, keep=1))
    assert checkpointer.restore_latest() == 3
    assert resumed.ema is not None
    for a, b in zip(resumed.model.trainable_variables, old.model.trainable_variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for a, b in zip(resumed.ema.shadows, old.ema.shadows, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_learning_rate_warmup_then_schedule():
    from trainer.optim import make_schedule

    spec = OptimizerSpec(
        learning_rate=0.1,
        warmup_steps=10,
        schedule={
            "name": "exponential_decay",
            "decay_steps": 5,
            "decay_rate": 0.5,
            "staircase": True,
        },
    )
    schedule = make_schedule(spec)
    assert float(schedule(0)) == pytest.approx(0.01)
    assert float(schedule(9)) == pytest.approx(0.1)
    assert float(schedule(14)) == pytest.approx(0.1)  # staircase: still the first stair
    assert float(schedule(15)) == pytest.approx(0.05)
    cosine = make_schedule(
        OptimizerSpec(learning_rate=0.1, schedule={"name": "cosine", "decay_steps": 10})
    )
    assert float(cosine(10)) == pytest.approx(0.0, abs=1e-7)
    poly = make_schedule(
        OptimizerSpec(
            learning_rate=0.1,
            schedule={"name": "polynomial", "decay_steps": 10, "end_learning_rate": 0.02},
        )
    )
    assert float(poly(5)) == pytest.approx(0.06)


def test_the_optimizer_and_schedule_take_every_option_the_spec_gives():
    # Each option away from its default, so one dropped on the way to Keras (Keras's own
    # default then) is seen: the other tests train with the defaults alone.
    from trainer.optim import make_schedule

    momentum = make_optimizer(OptimizerSpec(name="momentum", momentum=0.5))
    assert float(momentum.momentum) == 0.5
    adam = make_optimizer(OptimizerSpec(name="adam", beta_1=0.8, beta_2=0.99, epsilon=1e-3))
    assert (adam.beta_1, adam.beta_2, adam.epsilon) == (0.8, 0.99, 1e-3)
    cosine = make_schedule(
        OptimizerSpec(
            learning_rate=0.1, schedule={"name": "cosine", "decay_steps": 10, "alpha": 0.2}
        )
    )
    assert float(cosine(10)) == pytest.approx(0.1 * 0.2)  # ends at alpha of the rate
    poly = make_schedule(
        OptimizerSpec(
            learning_rate=0.1,
            schedule={
                "name": "polynomial",
                "decay_steps": 10,
                "end_learning_rate": 0.02,
                "power": 2.0,
            },
        )
    )
    assert float(poly(5)) == pytest.approx((0.1 - 0.02) * 0.5**2 + 0.02)


def test_learning_rate_schedule_config_round_trips():
    from trainer.optim import WarmupSchedule, make_schedule

    decayed = make_schedule(
        OptimizerSpec(
            learning_rate=0.1,
            warmup_steps=3,
            schedule={"name": "exponential_decay", "decay_steps": 5, "decay_rate": 0.5},
        )
    )
    for schedule in (decayed, make_schedule(OptimizerSpec(learning_rate=0.1, warmup_steps=3))):
        copy = WarmupSchedule.from_config(schedule.get_config())
        assert [float(copy(s)) for s in (0, 4, 20)] == [float(schedule(s)) for s in (0, 4, 20)]


def test_each_step_reports_the_rate_its_update_used():
    from trainer.optim import make_schedule

    spec = OptimizerSpec(
        name="adam",
        learning_rate=0.1,
        warmup_steps=2,
        schedule={"name": "cosine", "decay_steps": 4},
    )
    keras.utils.set_random_seed(7)
    with tf.device("/CPU:0"):
        trainer = TowerTrainer(
            model=build_model(ModelSpec(name="mlp"), SHAPE, CLASSES).model,
            optimizer=make_optimizer(spec),
            tower_devices=["/CPU:0", "/CPU:1"],
            parameter_device="/CPU:0",
        )
    schedule = make_schedule(spec)
    x, y = batch(8)
    rates = [float(trainer.train_step(x, y)["learning_rate"]) for _ in range(7)]
    assert rates == [float(schedule(step)) for step in range(7)]  # warm-up, decay, the end
    assert rates[0] < rates[1] == rates[2] > rates[3] > rates[6]


def test_grad_norm_and_packed_scalars_only_on_a_scalars_step():
    trainer = make_trainer(2)
    x, y = batch(32)
    asked = trainer.train_step(x, y, with_scalars=True)
    expected = np.sqrt(sum(float((g.numpy() ** 2).sum()) for g in asked["grads"]))
    assert float(asked["grad_norm"]) == pytest.approx(expected, rel=1e-5)
    # The step's scalars in one tensor, in `SCALARS` order, each tower's loss after.
    packed = [float(asked[k]) for k in SCALARS] + asked["tower_loss"].numpy().tolist()
    assert asked["scalars"].numpy().tolist() == packed
    other = trainer.train_step(x, y)
    assert float(other["grad_norm"]) == 0.0
    assert other["scalars"].numpy().tolist() == [0.0] * (len(SCALARS) + 2)


def test_a_clipping_step_gives_its_grad_norm_on_every_step():
    trainer = make_trainer(2, clip_norm=1e-3)
    x, y = batch(32)
    for with_scalars in (False, True):
        out = trainer.train_step(x, y, with_scalars=with_scalars)
        expected = np.sqrt(sum(float((g.numpy() ** 2).sum()) for g in out["grads"]))
        assert float(out["grad_norm"]) == pytest.approx(expected, rel=1e-5)
        assert float(out["scalars"][SCALARS.index("grad_norm")]) == (
            pytest.approx(expected, rel=1e-5) if with_scalars else 0.0
        )


class _WithUnusedLayer(keras.Model):
    """A custom model that builds a layer it never calls (no gradient reaches it)."""

    def __init__(self):
        super().__init__()
        self.flatten = keras.layers.Flatten()
        self.logits = keras.layers.Dense(CLASSES)
        self.unused = keras.layers.Dense(3)

    def build(self, input_shape):
        self.logits.build((None, int(np.prod(input_shape[1:]))))
        self.unused.build((None, 5))
        self.built = True

    def call(self, x, training=False):
        return self.logits(self.flatten(x))


def test_variables_without_gradient_stay_put_and_are_named(caplog):
    keras.utils.set_random_seed(7)
    with tf.device("/CPU:0"):
        net = _WithUnusedLayer()
        net(tf.zeros((1, *SHAPE)))
        trainer = TowerTrainer(
            model=net,
            optimizer=make_optimizer(OptimizerSpec(name="adam", learning_rate=0.1)),
            tower_devices=["/CPU:0", "/CPU:1"],
            parameter_device="/CPU:0",
            input_shape=SHAPE,  # subclassed: the model has no input_shape of its own
        )
    unused_before = [v.numpy() for v in net.unused.trainable_variables]
    used_before = net.logits.kernel.numpy()
    x, y = batch(16)
    with caplog.at_level("WARNING", logger="trainer.towers"):
        out = trainer.train_step(x, y)
    assert np.isfinite(float(out["loss"]))
    assert np.abs(net.logits.kernel.numpy() - used_before).max() > 1e-3  # the used layer trained
    for before, var in zip(unused_before, net.unused.trainable_variables, strict=True):
        np.testing.assert_array_equal(var.numpy(), before)
    assert net.unused.kernel.path in caplog.text


def regularized_trainer(towers: int, *, l2: float = 0.0, activity: float = 0.0) -> TowerTrainer:
    """A custom model's own losses: an L2 kernel regularizer, an activity regularizer."""
    keras.utils.set_random_seed(7)
    with tf.device("/CPU:0"):
        inputs = keras.Input(SHAPE)
        x = keras.layers.Flatten()(inputs)
        x = keras.layers.Dense(
            16,
            activation="relu",
            kernel_regularizer=keras.regularizers.L2(l2) if l2 else None,
            activity_regularizer=keras.regularizers.L2(activity) if activity else None,
        )(x)
        net = keras.Model(inputs, keras.layers.Dense(CLASSES)(x))
        return TowerTrainer(
            model=net,
            optimizer=make_optimizer(OptimizerSpec(name="sgd", learning_rate=0.1)),
            tower_devices=[f"/CPU:{i}" for i in range(towers)],
            parameter_device="/CPU:0",
        )


def test_train_step_trains_on_custom_model_regularizers():
    plain, regularized = regularized_trainer(1), regularized_trainer(1, l2=0.5)
    x, y = batch(32)
    before = [v.numpy().copy() for v in regularized.model.trainable_variables]
    plain_out = plain.train_step(x, y)
    out = regularized.train_step(x, y)
    # The same weights before the step: the loss reported stays the cross-entropy alone.
    assert float(out["loss"]) == pytest.approx(float(plain_out["loss"]), abs=1e-6)
    kernel = 0  # the regularized one: SGD takes lr * 2 * l2 * w_before more off it
    np.testing.assert_allclose(
        plain.model.trainable_variables[kernel].numpy()
        - regularized.model.trainable_variables[kernel].numpy(),
        0.1 * 2 * 0.5 * before[kernel],
        atol=1e-6,
    )
    for k in range(1, len(before)):  # the others only through the changed kernel: unmoved now
        np.testing.assert_allclose(
            plain.model.trainable_variables[k].numpy(),
            regularized.model.trainable_variables[k].numpy(),
            atol=1e-7,
        )


def test_train_step_custom_model_losses_uneven_towers_equal_one():
    one = regularized_trainer(1, l2=0.1, activity=0.05)
    three = regularized_trainer(3, l2=0.1, activity=0.05)
    without = regularized_trainer(1)
    x, y = batch(50)  # shards of 17, 17, 16: each tower's part weighted by its share
    one.train_step(x, y)
    three.train_step(x, y)
    without.train_step(x, y)
    assert max_weight_difference(one, without) > 1e-3
    assert max_weight_difference(one, three) <= 1e-6


def test_the_batch_is_split_on_the_host_and_the_step_flags_live_there():
    # On GPUs the split ran on GPU:0 unplaced (the whole batch copied there, then each shard
    # on to its tower), and flags made under the parameter device's scope (GPU:0) crossed
    # to the host every step for the `tf.cond` that reads them. Placement is checked on
    # logical CPU devices here (no GPU on this machine): the requested device is the point.
    keras.utils.set_random_seed(7)
    with tf.device("/CPU:1"):  # as run.py builds it, under the parameter device
        trainer = TowerTrainer(
            model=build_model(ModelSpec(name="mlp"), SHAPE, CLASSES).model,
            optimizer=make_optimizer(OptimizerSpec(name="sgd", learning_rate=0.01)),
            tower_devices=["/CPU:1", "/CPU:2"],
            parameter_device="/CPU:1",
        )
    assert {tf.DeviceSpec.from_string(f.device).device_index for f in trainer._flags.values()} == {
        0
    }
    for step in (trainer.train_function, trainer.eval_step):
        graph = step.get_concrete_function().graph
        splits = [op for op in graph.get_operations() if op.type in ("Split", "SplitV")]
        assert len(splits) == 2, [op.type for op in graph.get_operations()]  # images, labels
        for op in splits:
            device = tf.DeviceSpec.from_string(op.device)
            assert (device.device_type, device.device_index) == ("CPU", 0), (op.name, op.device)
        # Predictions are compared as int64: a GPU compares int32 in host memory.
        equals = [op for op in graph.get_operations() if op.type == "Equal"]
        assert equals and {op.inputs[0].dtype for op in equals} == {tf.int64}
    x, y = batch(9)
    assert np.isfinite(float(trainer.train_step(x, y)["loss"]))


def float64_model(batch_norm: bool = False) -> keras.Model:
    """A custom model whose weights are float64 (as `keras.config.set_floatx("float64")`
    gives; set per layer here, so other tests keep float32)."""
    keras.utils.set_random_seed(7)
    inputs = keras.Input(SHAPE, dtype="float64")
    x = keras.layers.Flatten(dtype="float64")(inputs)
    x = keras.layers.Dense(8, activation="relu", dtype="float64")(x)
    if batch_norm:
        x = keras.layers.BatchNormalization(momentum=0.5, dtype="float64")(x)
    return keras.Model(inputs, keras.layers.Dense(CLASSES, dtype="float64")(x))


def test_a_float64_model_trains_as_keras_trains_it():
    # The fused kernels took float32 scalars, the global norm stacked float32 with float64,
    # and the EMA and batch-norm averaging multiplied float32 by float64: step 1 failed
    # with a TypeError for a model that Keras's own optimizer trains.
    wd, clip, lr = 0.01, 0.5, 0.05
    with tf.device("/CPU:0"):
        trainer = TowerTrainer(
            model=float64_model(),
            optimizer=make_optimizer(OptimizerSpec(name="adam", learning_rate=lr)),
            tower_devices=["/CPU:0", "/CPU:1"],
            parameter_device="/CPU:0",
            weight_decay=wd,
            clip_norm=clip,
            ema_decay=0.5,
        )
        reference = float64_model()
        optimizer = keras.optimizers.Adam(learning_rate=lr)
    x, y = batch(30)
    for _ in range(3):
        out = trainer.train_step(x, y, with_scalars=True)
        with tf.GradientTape() as tape:
            logits = tf.cast(reference(x, training=True), tf.float32)  # as the step does
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
            )
            kernels = [v for v in reference.trainable_variables if len(v.shape) > 1]
            loss = tf.cast(loss, tf.float64) + 0.5 * wd * tf.add_n(
                [tf.reduce_sum(k**2) for k in kernels]
            )
        grads = tape.gradient(loss, reference.trainable_variables)
        grads, norm = tf.clip_by_global_norm(grads, clip)
        optimizer.apply_gradients(zip(grads, reference.trainable_variables, strict=True))
        assert out["grad_norm"].dtype == tf.float32
        assert float(out["grad_norm"]) == pytest.approx(float(norm), rel=1e-5)
    assert float(norm) > clip  # the clip scaled the update
    for mine, theirs in zip(
        trainer.model.trainable_variables, reference.trainable_variables, strict=True
    ):
        assert mine.dtype == "float64"
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), atol=1e-5)  # Adam, as above
    assert trainer.ema is not None and trainer.ema.shadows[0].dtype == tf.float64


def test_a_float64_model_with_batch_norm_trains_on_towers():
    with tf.device("/CPU:0"):
        trainer = TowerTrainer(
            model=float64_model(batch_norm=True),
            optimizer=make_optimizer(OptimizerSpec(name="momentum", learning_rate=0.1)),
            tower_devices=["/CPU:0", "/CPU:1", "/CPU:2"],
            parameter_device="/CPU:0",
        )
    bn = next(v for v in trainer.model.non_trainable_variables if "moving_mean" in v.path)
    x, y = batch(10)  # shards of 4, 3, 3
    out = trainer.train_step(x, y)
    assert np.isfinite(float(out["loss"]))
    assert np.abs(bn.numpy()).max() > 1e-3  # the share-weighted update moved it


class RunningMean(keras.layers.Layer):
    """A custom layer with state of its own, updated by each training call: a running mean
    of its inputs, how many calls trained it, and a scale it never changes; and, each by
    the `aggregation` it is given, the examples it has seen (summed over the towers) and
    the mean of the last batch the first tower saw."""

    def build(self, input_shape):
        width = input_shape[-1]
        self.mean = self.add_weight(shape=(width,), initializer="zeros", trainable=False)
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False, dtype="int64")
        self.scale = self.add_weight(shape=(width,), initializer="ones", trainable=False)
        self.seen = self.add_weight(
            shape=(), initializer="zeros", trainable=False, dtype="int64", aggregation="sum"
        )
        self.last = self.add_weight(
            shape=(), initializer="zeros", trainable=False, aggregation="only_first_replica"
        )

    def call(self, x, training=False):
        if training:
            self.mean.assign(0.5 * self.mean + 0.5 * tf.reduce_mean(x, 0))
            self.calls.assign_add(1)
            self.seen.assign_add(tf.cast(tf.shape(x)[0], "int64"))
            self.last.assign(tf.reduce_mean(x))
        return x * self.scale


class HiddenRunningMean(RunningMean):
    """`RunningMean` whose updates a trace sees only inside functions of their own: the
    mean's under a `keras.ops.cond`, the count's in a method that is a `tf.function`."""

    @tf.function
    def count(self):
        self.calls.assign_add(1)

    def call(self, x, training=False):
        if training:
            keras.ops.cond(
                tf.shape(x)[0] >= 0,  # always: a cond a trace cannot see through
                lambda: self.mean.assign(0.5 * self.mean + 0.5 * tf.reduce_mean(x, 0)),
                lambda: self.mean.assign(self.mean),
            )
            self.count()
            self.seen.assign_add(tf.cast(tf.shape(x)[0], "int64"))
            self.last.assign(tf.reduce_mean(x))
        return x * self.scale


def running_mean_model(kind: type[RunningMean] = RunningMean) -> tuple[keras.Model, RunningMean]:
    keras.utils.set_random_seed(7)
    inputs = keras.Input(SHAPE)
    layer = kind()
    x = keras.layers.Dropout(0.25)(layer(keras.layers.Flatten()(inputs)))
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(x)), layer


@pytest.mark.parametrize(
    ("towers", "kind"), [(2, RunningMean), (3, RunningMean), (3, HiddenRunningMean)]
)
def test_a_custom_layers_state_moves_once_a_step_on_towers(towers, kind):
    # Each tower's call used to update a custom layer's state in turn: its count went up by
    # the towers a step and its running mean moved once per tower, each from the last. An
    # update in a cond or a nested tf.function was missed so even once the others were not.
    trained = {}
    for n in (1, towers):
        model, layer = running_mean_model(kind)
        with tf.device("/CPU:0"):
            trainer = TowerTrainer(
                model=model,
                optimizer=make_optimizer(OptimizerSpec(name="sgd", learning_rate=0.1)),
                tower_devices=[f"/CPU:{i}" for i in range(n)],
                parameter_device="/CPU:0",
            )
        seed = next(v for v in model.non_trainable_variables if "seed" in v.path)
        seed_before = seed.numpy().copy()
        for step in range(2):
            trainer.train_step(*batch(10, seed=step))  # 3 towers: shards of 4, 3, 3
        trained[n] = layer
        # The dropout's seed is not averaged: each tower draws on from the last one's.
        assert (seed.numpy() != seed_before).any()
    one, many = trained[1], trained[towers]
    assert int(many.calls.numpy()) == int(one.calls.numpy()) == 2
    # The mean is linear in the batch, so the share-weighted average is the one-device mean.
    assert np.abs(one.mean.numpy()).max() > 0.1
    np.testing.assert_allclose(many.mean.numpy(), one.mean.numpy(), atol=1e-6)
    np.testing.assert_array_equal(many.scale.numpy(), 1.0)  # never assigned: untouched
    # Summed: the examples of every tower, as one device counts them (averaged, 10 / N).
    assert int(many.seen.numpy()) == int(one.seen.numpy()) == 20
    # The first tower's: the mean of its shard of the last batch (its first 5 or 4).
    first = batch(10, seed=1)[0][: 10 // towers + (10 % towers > 0)]
    assert float(many.last.numpy()) == pytest.approx(float(first.mean()), rel=1e-6)


def test_a_model_without_state_of_its_own_is_not_traced_for_it(monkeypatch):
    # Batch norm's statistics and the seeds' states are known without tracing a call.
    traced = []
    trace = TowerTrainer._training_call
    monkeypatch.setattr(
        TowerTrainer, "_training_call", lambda self, spec: traced.append(spec) or trace(self, spec)
    )
    trainer = make_trainer(2, model="resnet", params={"width": 4, "blocks_per_stage": [1]})
    bn = [v for v in trainer.model.non_trainable_variables if "moving" in v.path]
    assert bn and trainer._tower_state == bn
    dropout = make_trainer(2, model="mlp", params={"dropout": 0.5})
    assert any("seed" in v.path for v in dropout.model.non_trainable_variables)
    assert dropout._tower_state == [] and traced == []
    model, layer = running_mean_model()
    with tf.device("/CPU:0"):
        custom = TowerTrainer(
            model=model,
            optimizer=make_optimizer(OptimizerSpec(name="sgd", learning_rate=0.1)),
            tower_devices=["/CPU:0", "/CPU:1"],
            parameter_device="/CPU:0",
        )
    assert [v.path for v in custom._tower_state] == [
        layer.mean.path,
        layer.calls.path,
        layer.seen.path,
        layer.last.path,
    ]
    assert len(traced) == 1  # the custom model's, once


def test_the_graphs_tab_draws_the_step_as_its_scopes():
    # TensorBoard's graphs tab draws a graph's top-level names as its main graph. The
    # batch's split (its shape, sizes and empty-shard conds) and the batch-norm state's
    # save and restore around each tower were unscoped: dozens of ops drawn there, while
    # the towers, the tape and the average went to the side as "auxiliary nodes" (the
    # `cnn`) or a row of 36 little groups filled the main graph (the `resnet`).
    trainer = make_trainer(2, model="resnet", params={"width": 4, "blocks_per_stage": [1]})
    graph = trainer.train_function.get_concrete_function().graph
    scopes = {op.name.split("/")[0] for op in graph.get_operations() if "/" in op.name}
    assert scopes == {"shards", "tower_0", "tower_1", "gradient_tape", "layer_state", "average"}
    # Left at the top: the function's arguments and what it returns, nothing it computes.
    unscoped = {op.type for op in graph.get_operations() if "/" not in op.name}
    assert unscoped <= {"Placeholder", "Identity", "NoOp"}, unscoped


def _second_scopes(names: list[str]) -> list[str]:
    """The name scope each of `names` gets when entered twice in turn in one scope, the
    second time, uniquified as a TensorFlow graph does (`Graph.unique_name`)."""
    in_use: dict[str, int] = {}

    def unique(name: str) -> str:
        key, count = name, in_use.get(name, 0)
        in_use[name] = count + 1
        if count:
            while key in in_use:
                key = f"{name}_{count}"
                count += 1
            in_use[key] = 1
        return key

    return [[unique(name), unique(name)][1] for name in names]


def test_the_graph_names_each_layer_scope_one_past_the_layer():
    # What the README says of the graphs tab and the trace: Keras 3 enters a layer's name
    # scope twice a call (to build it, which adds no op, then to call it), so the ops are
    # under the second, uniquified name: in a fresh process the model's `cnn_1`, the layer
    # `conv2d`'s `conv2d_1` and `conv2d_1`'s `conv2d_1_2`, which the histograms' tags name
    # `conv2d` and `conv2d_1`. Should a Keras fix this, this fails, and the README's line
    # goes. The names are the layers' own: Keras numbers a layer by the layers made before
    # it in the process (another test's made this `dense` `dense_81`).
    trainer = make_trainer(2, model="cnn", params={"filters": [2, 2], "dense": 4})
    layers = [layer.name for layer in trainer.model.layers if layer.weights]
    assert _second_scopes(["conv2d", "conv2d_1"]) == ["conv2d_1", "conv2d_1_2"]
    (model,) = _second_scopes([trainer.model.name])
    graph = trainer.train_function.get_concrete_function().graph
    forward = {
        "/".join(op.name.split("/")[1:3])
        for op in graph.get_operations()
        if op.name.startswith("tower_0/") and op.type in ("Conv2D", "MatMul", "_FusedConv2D")
    }
    assert forward == {f"{model}/{scope}" for scope in _second_scopes(layers)}
