"""The fused update kernels do what the Keras optimizers do, to the same variables."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer.optim import make_optimizer
from trainer.spec import OptimizerSpec
from trainer.updates import make_apply

SHAPES = [(6, 5), (5,), (5, 3)]


def make_variables(constraint=None) -> list[keras.Variable]:
    rng = np.random.default_rng(3)
    variables = [keras.Variable(rng.normal(size=shape).astype(np.float32)) for shape in SHAPES]
    for v in variables:
        # As a layer's `add_weight(constraint=...)` does: on kernels only.
        v.constraint = constraint if len(v.shape) > 1 else None
    return variables


def gradients(step: int) -> list[np.ndarray]:
    rng = np.random.default_rng(100 + step)
    return [rng.normal(size=shape).astype(np.float32) for shape in SHAPES]


def run(
    optimizer: keras.optimizers.Optimizer,
    variables: list[keras.Variable],
    fused: bool,
    steps: int = 4,
) -> list[float]:
    """Apply `steps` updates; return the learning rate each one used."""
    optimizer.build(variables)
    apply = make_apply(optimizer, variables)
    rates = []

    @tf.function
    def step(grads):
        lr = optimizer.learning_rate
        if fused:
            apply(grads, lr)
        else:
            optimizer.apply_gradients(zip(grads, variables, strict=True))
        return lr

    for i in range(steps):
        rates.append(float(step([tf.constant(g) for g in gradients(i)])))
    return rates


def state(
    optimizer: keras.optimizers.Optimizer, variables: list[keras.Variable]
) -> list[np.ndarray]:
    return [v.numpy() for v in variables] + [v.numpy() for v in optimizer.variables]


def largest_change(variables: list[keras.Variable]) -> float:
    """The largest change of any value since `make_variables()`."""
    start = make_variables()
    return max(
        float(np.abs(v.numpy() - s.numpy()).max()) for v, s in zip(variables, start, strict=True)
    )


OPTIMIZERS = {
    "sgd": lambda: make_optimizer(OptimizerSpec(name="sgd", learning_rate=0.1)),
    "momentum": lambda: make_optimizer(
        OptimizerSpec(name="momentum", learning_rate=0.1, warmup_steps=2)
    ),
    "nesterov": lambda: keras.optimizers.SGD(learning_rate=0.1, momentum=0.8, nesterov=True),
    "adam": lambda: make_optimizer(
        OptimizerSpec.model_validate(
            {
                "name": "adam",
                "learning_rate": 0.01,
                "schedule": {"name": "exponential_decay", "decay_steps": 2},
            }
        )
    ),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_fused_update_matches_keras(name):
    keras_opt, fused_opt = OPTIMIZERS[name](), OPTIMIZERS[name]()
    keras_vars, fused_vars = make_variables(), make_variables()
    keras_rates = run(keras_opt, keras_vars, fused=False)
    fused_rates = run(fused_opt, fused_vars, fused=True)

    assert fused_rates == keras_rates
    assert len(set(keras_rates)) > 1 or name in ("sgd", "nesterov")  # the schedule is exercised
    assert int(fused_opt.iterations) == int(keras_opt.iterations) == 4
    assert (
        largest_change(fused_vars) > 1e-2
    )  # the updates did something, so equality is not the trivial kind
    for expected, got in zip(
        state(keras_opt, keras_vars), state(fused_opt, fused_vars), strict=True
    ):
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def test_constraints_apply_after_a_fused_update():
    optimizer = OPTIMIZERS["momentum"]()
    variables = make_variables(constraint=keras.constraints.NonNeg())
    run(optimizer, variables, fused=True)
    assert all(float(v.numpy().min()) >= 0.0 for v in variables if len(v.shape) > 1)
    assert float(variables[1].numpy().min()) < 0.0  # the unconstrained bias keeps its sign


def test_keras_only_features_go_through_keras():
    # Keras-side clipping is not in the fused kernels: the update must still clip.
    clipped, reference = (
        keras.optimizers.SGD(learning_rate=1.0, clipvalue=0.01),
        keras.optimizers.SGD(learning_rate=1.0, clipvalue=0.01),
    )
    clipped_vars, reference_vars = make_variables(), make_variables()
    run(clipped, clipped_vars, fused=True, steps=1)
    run(reference, reference_vars, fused=False, steps=1)
    for got, expected in zip(clipped_vars, reference_vars, strict=True):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=0, atol=1e-7)
    assert 0.0 < largest_change(clipped_vars) <= 0.01 + 1e-6


@pytest.mark.parametrize("name", ["momentum", "adam"])
def test_fused_update_under_a_strategy_updates_each_copy_with_its_own_gradient(name):
    # A cluster's variables are mirrored: one copy per tower. MirroredStrategy over two
    # logical CPUs has the same copies and the same `update` as MultiWorkerMirroredStrategy.
    # Each copy gets a different gradient here (in training they are the same sum), so a
    # copy updated with another's gradient, or not at all, shows.
    strategy = tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    with strategy.scope():
        optimizer, variables = OPTIMIZERS[name](), make_variables()
        optimizer.build(variables)
        apply = make_apply(optimizer, variables, strategy=strategy)

    def replica_grads(step: int) -> tuple[list[tf.Tensor], tf.Tensor]:
        copy = tf.distribute.get_replica_context().replica_id_in_sync_group
        scale = tf.cast(copy + 1, tf.float32)
        return [scale * tf.constant(g) for g in gradients(step)], optimizer.learning_rate

    @tf.function
    def step(i):
        grads, lr = strategy.run(replica_grads, args=(i,))
        apply(grads, lr)

    for i in range(3):
        step(i)

    graph = step.get_concrete_function(0).graph.as_graph_def()
    kernels = [n for n in graph.node if n.op.startswith("ResourceApply")]
    assert {n.device.lower().split("/")[-1] for n in kernels} == {"device:cpu:0", "device:cpu:1"}
    assert int(optimizer.iterations.numpy()) == 3
    for copy in range(2):
        # The same updates without a strategy, with this copy's gradients.
        expected_opt, expected_vars = OPTIMIZERS[name](), make_variables()
        expected_opt.build(expected_vars)
        for i in range(3):
            expected_opt.apply_gradients(
                zip([(copy + 1) * g for g in gradients(i)], expected_vars, strict=True)
            )
        for got, expected in zip(variables, expected_vars, strict=True):
            local = strategy.experimental_local_results(got.value)[copy]
            np.testing.assert_allclose(local.numpy(), expected.numpy(), rtol=0, atol=1e-6)
