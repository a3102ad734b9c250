"""The tower trainer: one global batch, split across devices, one shared set of variables.

Each tower runs forward and backward on its shard under `tf.device(tower)` and
`tf.name_scope("tower_i")`. Each tower differentiates `sum(per-example loss) / global
batch`, so adding the towers' gradients on the parameter device gives the gradient of
the global mean loss exactly, whatever the shard sizes: a batch that does not divide
evenly is weighted by each tower's share. A tower whose shard would be empty (a last
batch smaller than the tower count) runs on one stand-in example with weight zero, since
layers such as batch norm cannot differentiate an empty batch. The sum is applied once,
with TensorFlow's fused training kernels where the optimizer allows (`trainer.updates`).
All of it is one `tf.function`.

Batch-norm moving statistics: every tower normalises with its own shard's moments (as
separate GPUs would), and the moving statistics are set to the share-weighted average of
the towers' updates: `m' = momentum*m + (1-momentum) * sum_i(w_i * moment_i)`. For the
mean that is exactly the single-device update on the whole batch; for the variance it is
the mean of the per-tower variances (it leaves out the spread between tower means). One
tower updates them in place, as a plain step does, with no bookkeeping to pay for.

Any other state a custom model's layers update in a training call (a running mean of
their own, a counter) is averaged the same way, found by tracing one training call
(`_assigned_in_training`, through its conds and nested functions): left to each tower in
turn, a counter would count N a step on N towers, and a running mean move N times. An
integer is averaged as its change, rounded (each tower's +1 gives +1). A state its layer
gave another `aggregation` is aggregated as `tf.distribute` would: "sum" adds the towers'
changes (a count of examples seen), "only_first_replica" takes the first tower's. A bool
or an unsigned integer, which has no such average, is left to each tower in turn, as are
random seeds' states (Keras's `SeedGenerator`: dropout, noise), so that each tower draws
its own masks.

This module only computes. Summaries, checkpoints and progress belong to the controller.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

import keras
import tensorflow as tf

from trainer.ema import WeightEMA
from trainer.lossscale import LossScale, all_finite, computes_in_float16, unscaled
from trainer.updates import Apply, make_apply

log = logging.getLogger(__name__)

# The ops by which a traced call writes a resource variable (Keras's `assign_add` is an
# `AssignVariableOp` of the sum).
_ASSIGNMENTS = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})
# What TensorFlow marks on an op that runs a function of its own (a `cond`'s `If`, a
# `while_loop`'s `While`, a nested `tf.function`'s call): the indices of the resource
# inputs its function only reads; it may write any other (its automatic control
# dependencies read the same mark).
_READ_ONLY_INPUTS = "_read_only_resource_inputs"

# What a controller may ask of a step that every worker of a cluster must agree on
# (`TowerTrainer.train_step`'s `requests`): stop after this step; checkpoint after it
# (a time-based cadence, whose clock differs per worker).
REQUESTS = ("stop", "checkpoint")
# What a scalars step packs into its `scalars` output, in this order, each tower's loss after
# (`TowerTrainer.scalar_names`: a model that computes in float16 adds its `loss_scale`).
SCALARS = ("loss", "accuracy", "learning_rate", "grad_norm")


def tower_sizes(batch: tf.Tensor, towers: int) -> tf.Tensor:
    """Split `batch` examples over `towers`: the first `batch % towers` get one extra."""
    base = batch // towers
    extra = tf.cast(tf.range(towers) < batch % towers, batch.dtype)
    return base + extra


def host_tower_sizes(batch: int, towers: int) -> list[int]:
    """`tower_sizes` on the host, for a batch whose size is known there."""
    return [batch // towers + (i < batch % towers) for i in range(towers)]


def stand_in_if_empty(
    images: tf.Tensor,
    labels: tf.Tensor,
    shard_images: tf.Tensor,
    shard_labels: tf.Tensor,
    size: tf.Tensor,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """A tower's (images, labels, weight) from its shard of the batch (`size` examples):
    the shard at weight 1, or, when it is empty, example 0 of the batch at weight 0, since
    layers such as batch norm cannot differentiate an empty batch."""
    present = size > 0
    return (
        tf.cond(present, lambda: shard_images, lambda: images[:1]),
        tf.cond(present, lambda: shard_labels, lambda: labels[:1]),
        tf.cast(present, tf.float32),
    )


def _shards(
    images: tf.Tensor, labels: tf.Tensor, sizes: tf.Tensor, towers: int
) -> list[tuple[tf.Tensor, tf.Tensor, tf.Tensor]]:
    """Each tower's (images, labels, weight) (`stand_in_if_empty`)."""
    if towers == 1:  # the whole batch, with no split or guard to pay for
        return [(images, labels, tf.constant(1.0))]
    image_shards = tf.split(images, sizes, num=towers)
    label_shards = tf.split(labels, sizes, num=towers)
    return [
        stand_in_if_empty(images, labels, image_shards[i], label_shards[i], sizes[i])
        for i in range(towers)
    ]


def _batch_norm_layers(model: keras.Model) -> list[keras.layers.BatchNormalization]:
    return [
        layer
        for layer in model._flatten_layers()
        if isinstance(layer, keras.layers.BatchNormalization)
    ]


def _seed_states(model: keras.Model) -> list[keras.Variable]:
    """The states of the model's random seeds (each layer's `SeedGenerator`s)."""
    return [
        seed.state
        for layer in model._flatten_layers()
        for seed in getattr(layer, "_seed_generators", ())
    ]


def _handles(variable: keras.Variable) -> list[tf.Tensor]:
    """The resource handles an assignment to `variable` writes through: its TensorFlow
    variable's, or under a distribution strategy each local copy's."""
    value = variable.value
    return [copy.handle for copy in getattr(value, "values", (value,))]


def _written(op: tf.Operation) -> list[tf.Tensor]:
    """The resource handles among `op`'s inputs that it may write."""
    if op.type in _ASSIGNMENTS:
        return [op.inputs[0]]
    try:
        read_only = set(op.get_attr(_READ_ONLY_INPUTS))
    except ValueError:  # not an op that runs a function: it reads, or writes no variable
        return []
    return [t for i, t in enumerate(op.inputs) if t.dtype == tf.resource and i not in read_only]


def _averageable(variable: keras.Variable) -> bool:
    """A float, or a signed integer (averaged as its change, which may be negative)."""
    dtype = tf.as_dtype(variable.dtype)
    return dtype.is_floating or (dtype.is_integer and not dtype.is_unsigned)


def state_part(
    var: keras.Variable, share: tf.Tensor, first: bool, value: tf.Tensor, before: tf.Tensor
) -> tf.Tensor:
    """One tower's part of state variable `var`'s new value (summed over the towers, then
    finished by `state_from_sum`), by the `aggregation` its layer gave it, as
    `tf.distribute` aggregates a variable's copies: "sum" (a count of examples seen), each
    tower's change from `before`; "only_first_replica", the `first` tower's change alone;
    else ("mean", or "none", Keras's default and batch norm's), the tower's `share` of the
    batch times the `value` its call left: an average. An integer's average is of its
    change, in float64, since a share cast to an integer is 0. A tower whose shard was
    empty (share 0) ran on a stand-in example, whose change is no part of any."""
    if var.aggregation == "sum":
        return tf.cast(share > 0, value.dtype) * (value - before)
    if var.aggregation == "only_first_replica":
        return value - before if first else tf.zeros_like(value)
    if value.dtype.is_floating:
        return tf.cast(share, value.dtype) * value
    return tf.cast(share, tf.float64) * tf.cast(value - before, tf.float64)


def state_from_sum(var: keras.Variable, total: tf.Tensor, before: tf.Tensor) -> tf.Tensor:
    """State variable `var`'s new value from the sum of the towers' `state_part`s."""
    if var.aggregation in ("sum", "only_first_replica"):
        return before + total
    if before.dtype.is_floating:
        return total
    return before + tf.cast(tf.round(total), before.dtype)


def _global_norm(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """The global norm of `tensors`, in float32 as the step's other scalars: a custom model's
    float64 weights have float64 gradients, which `tf.linalg.global_norm` cannot stack
    with float32 ones (nor its result with the loss). A cast to the same type is no op."""
    return tf.linalg.global_norm([tf.cast(t, tf.float32) for t in tensors])


def _is_weight_decayed(var: keras.Variable) -> bool:
    # L2 on kernels only: decaying biases and batch-norm scales/offsets hurts more than it helps.
    return len(var.shape) > 1


class TowerTrainer:
    """Builds the train and eval steps of `model` over `tower_devices`.

    `train_step(x, y, with_scalars=False)` returns a dict of tensors: loss (mean
    cross-entropy over the global batch), accuracy, tower_loss (each tower's mean loss; 0
    for a tower with no examples), tower_examples (each tower's example count),
    grad_norm (global norm of the averaged gradient before clipping; computed only on a
    scalars step or when clipping needs it, since it is a pass over every gradient, 3% of
    a `cnn` step on a CPU; 0 otherwise), learning_rate (the rate this step used),
    scalars (on a scalars step, the `scalar_names` then each tower's loss in one tensor,
    which the controller reads back in one copy; zeros otherwise), grads (the averaged
    gradients, before clipping), requests (see `train_step`).

    A model that computes in float16 trains with dynamic loss scaling (`trainer.lossscale`,
    `loss_scale`): a step whose scaled gradients overflow is skipped, and still counted.

    The update goes through TensorFlow's fused training kernels when the optimizer allows
    (`trainer.updates`); `fused_updates=False` applies it through Keras instead.
    `input_shape` (H, W, C) is needed only for a model without one (subclassed).
    """

    def __init__(
        self,
        *,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        tower_devices: Sequence[str],
        parameter_device: str,
        binary: bool = False,
        weight_decay: float = 0.0,
        clip_norm: float | None = None,
        ema_decay: float | None = None,
        fused_updates: bool = True,
        input_shape: Sequence[int] | None = None,
    ) -> None:
        if not tower_devices:
            raise ValueError("Expected at least one tower device. Received: []")
        if weight_decay < 0:
            raise ValueError(f"Expected `weight_decay` >= 0. Received: weight_decay={weight_decay}")
        if clip_norm is not None and clip_norm <= 0:
            raise ValueError(f"Expected `clip_norm` > 0 or None. Received: clip_norm={clip_norm}")
        self.model = model
        self.optimizer = optimizer
        self.tower_devices = tuple(tower_devices)
        self.parameter_device = parameter_device
        self.binary = binary
        self.weight_decay = weight_decay
        self.clip_norm = clip_norm

        self._variables = list(model.trainable_variables)
        with tf.device(parameter_device):
            # Built now, not on the first step, so slots exist (on the parameter device)
            # before a checkpoint is restored into them.
            optimizer.build(self._variables)
            self._apply = self._make_apply(fused_updates)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            # Only for a float16 model: any other's step stays as it was, op for op.
            self.loss_scale = LossScale(parameter_device) if computes_in_float16(model) else None
        self.ema = WeightEMA(self._variables, ema_decay, parameter_device) if ema_decay else None

        # A subclassed model has no `input_shape`; the caller then says what it takes.
        image_shape = (
            tuple(input_shape) if input_shape is not None else tuple(model.input_shape[1:])
        )
        image_spec = tf.TensorSpec([None, *image_shape], tf.float32)
        # With one tower, layers update their state in place, as in a plain step; with more
        # (in a cluster, counting other workers' towers), the step takes each tower's update
        # and averages them.
        self._tower_state = self._state_of_towers(image_spec) if self.num_towers > 1 else []
        label_spec = tf.TensorSpec([None], tf.int32)
        flag_spec = tf.TensorSpec([], tf.bool)
        request_spec = tf.TensorSpec([len(REQUESTS)], tf.int32)
        self.train_function = tf.function(
            self._train_step, input_signature=[image_spec, label_spec, flag_spec, request_spec]
        )
        self.eval_step = tf.function(self._eval_step, input_signature=[image_spec, label_spec])
        # The step's one concrete function (its signature admits no other), made at the
        # first step and called directly from then on: the tf.function's own call binds
        # the arguments and looks its cache up first, 0.14-0.28 ms a call on this CPU,
        # which a GPU step of 3-4 ms bound by the host's launches pays in full.
        self._train_concrete: tf.types.experimental.ConcreteFunction | None = None
        # Made once, not per step, and on the host: a `tf.cond` reads its predicate there, so
        # a flag made under a GPU's device scope (the parameter device's) crossed every step.
        with tf.device("/CPU:0"):
            self._flags = {flag: tf.constant(flag) for flag in (False, True)}
            self._no_requests = tf.zeros([len(REQUESTS)], tf.int32)

    def train_step(
        self,
        images: tf.Tensor,
        labels: tf.Tensor,
        with_scalars: bool = False,
        requests: tf.Tensor | None = None,
    ) -> dict[str, tf.Tensor]:
        """One update. `requests` (int32, one per `REQUESTS` name, non-zero = asked) come
        back as `out["requests"]`, agreed by every worker of a cluster: the ones any asked for."""
        if self._train_concrete is None:
            self._train_concrete = self.train_function.get_concrete_function()
        return self._train_concrete(
            images,
            labels,
            self._flags[with_scalars],
            self._no_requests if requests is None else requests,
        )

    def _state_of_towers(self, image_spec: tf.TensorSpec) -> list[keras.Variable]:
        """The state a tower's training call updates, which the step averages over the
        towers: batch norm's moving statistics, and the non-trainable variables a custom
        layer assigns. Those are found by tracing one training call (not run), and only
        where the model has non-trainable variables besides batch norm's and its seeds'
        states, so a built-in model pays nothing for it."""
        state = [
            var
            for layer in _batch_norm_layers(self.model)
            for var in (layer.moving_mean, layer.moving_variance)
        ]
        known = {id(var) for var in [*state, *_seed_states(self.model)]}
        others = [
            var
            for var in self.model.non_trainable_variables
            if id(var) not in known and _averageable(var)
        ]
        if not others:
            return state
        assigned = self._assigned_in_training(image_spec)
        updated = [var for var in others if any(id(h) in assigned for h in _handles(var))]
        ours = [var for var in updated if self._aggregated_here(var)]
        if ours:
            log.info(
                "Aggregated over the towers at each step, as batch norm's statistics: %s",
                ", ".join(f"{var.path} ({var.aggregation})" for var in ours),
            )
        return state + ours

    def _aggregated_here(self, var: keras.Variable) -> bool:
        """Whether the step aggregates `var`'s towers' updates itself: every variable, on
        one machine, whose towers share one copy of it."""
        return True

    def _assigned_in_training(self, image_spec: tf.TensorSpec) -> set[int]:
        """The ids of the variable handles a training call of the model assigns to,
        directly or in a function an op of the call runs (a `keras.ops.cond`, a method of
        the layer that is a `tf.function`): only the direct ones were found, and a state
        updated under a `cond` was left to each tower in turn."""
        graph = self._training_call(image_spec).graph
        outside = {id(inside): outside for outside, inside in graph.captures}
        return {
            id(outside[id(handle)])
            for op in graph.get_operations()
            for handle in _written(op)
            if id(handle) in outside
        }

    def _training_call(self, image_spec: tf.TensorSpec) -> tf.types.experimental.ConcreteFunction:
        """One training call of the model, traced (never run)."""
        return tf.function(lambda x: self.model(x, training=True)).get_concrete_function(image_spec)

    def _make_apply(self, fused: bool) -> Apply:
        """How the step applies the summed gradients (a cluster's goes through its strategy)."""
        return make_apply(self.optimizer, self._variables, fused=fused)

    @property
    def num_towers(self) -> int:
        """Towers the global batch is split over (in a cluster: over every worker)."""
        return len(self.tower_devices)

    @property
    def scalar_names(self) -> tuple[str, ...]:
        """What a scalars step's `scalars` holds before each tower's loss, in order."""
        return SCALARS if self.loss_scale is None else (*SCALARS, "loss_scale")

    @property
    def local_towers(self) -> int:
        """Towers this process runs: `tower_0` to `tower_<local_towers - 1>` in its traces."""
        return len(self.tower_devices)

    # -- the step ------------------------------------------------------------------

    def _per_example(self, labels: tf.Tensor, logits: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Per-example loss and correctness (float 0/1) from logits."""
        # The loss in float32 whatever the model's logits are: a custom model under Keras's
        # mixed precision gives float16 or bfloat16 (and Keras asks for a float32 loss),
        # one may give float64; the sums over towers are float32.
        if logits.dtype != tf.float32:
            logits = tf.cast(logits, tf.float32)
        if self.binary:
            logits = tf.squeeze(logits, -1)
            target = tf.cast(labels, logits.dtype)
            loss = tf.nn.sigmoid_cross_entropy_with_logits(labels=target, logits=logits)
            predicted = tf.cast(logits > 0, tf.int64)
        else:
            loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
            predicted = tf.argmax(logits, -1, output_type=tf.int64)
        # Compared as int64: TensorFlow's GPU kernel for int32 comparisons keeps its inputs in
        # host memory, so an int32 compare copies each tower's predictions off the GPU.
        correct = tf.cast(tf.equal(predicted, tf.cast(labels, tf.int64)), tf.float32)
        return loss, correct

    def _gradients(self, tape: tf.GradientTape, target: tf.Tensor, warn: bool) -> list[tf.Tensor]:
        """d target / d variables; zeros (and a warning, once, at tracing) where none flows.

        A variable that the loss does not reach (a layer a custom model builds but never
        calls) would otherwise break the sum over towers; a zero gradient leaves it as it is.
        """
        grads = tape.gradient(target, self._variables)
        unreached = [v.path for v, g in zip(self._variables, grads, strict=True) if g is None]
        if unreached and warn:
            log.warning(
                "No gradient reaches %s: they are not trained (does the model use them?)",
                ", ".join(unreached),
            )
        return [
            tf.zeros_like(v) if g is None else g
            for v, g in zip(self._variables, grads, strict=True)
        ]

    def _tower_gradients(
        self,
        images: tf.Tensor,
        labels: tf.Tensor,
        weight: tf.Tensor,
        share: tf.Tensor,
        batch_f: tf.Tensor,
        scale: tf.Tensor | None,
        warn: bool,
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        """One tower's forward and backward on its shard (`stand_in_if_empty`'s images,
        labels and weight; `share`, its part of the global batch of `batch_f` examples):
        the gradients of its `_objective` (times the loss `scale`, when the model computes
        in float16), its loss sum and its count of correct predictions (both weighted).
        Run inside the tower's name scope (and device)."""
        with tf.GradientTape() as tape:
            logits = self.model(images, training=True)
            loss, correct = self._per_example(labels, logits)
            loss_sum = weight * tf.reduce_sum(loss)
            objective = self._objective(loss_sum, share, batch_f)
            if scale is not None:
                objective *= scale
        grads = self._gradients(tape, objective, warn=warn)
        return grads, loss_sum, weight * tf.reduce_sum(correct)

    def _objective(self, loss_sum: tf.Tensor, share: tf.Tensor, batch_f: tf.Tensor) -> tf.Tensor:
        """What one tower differentiates: its part of the global mean loss, plus `share` (its
        part of the global batch) of the model's own losses, read inside the tape right
        after the tower's call: a custom model's weight and activity regularizers and
        `add_loss` terms, which Keras's `fit` trains on too and which would otherwise be
        dropped without a word. The shares add up to 1, so the towers' gradients sum to
        the gradient of the global mean loss plus those losses, once."""
        objective = loss_sum / batch_f
        own = self.model.losses  # weight regularizers are computed here, on the tape
        if own:
            objective += share * tf.add_n([tf.cast(term, tf.float32) for term in own])
        return objective

    def _train_step(
        self, images: tf.Tensor, labels: tf.Tensor, with_scalars: tf.Tensor, requests: tf.Tensor
    ) -> dict[str, tf.Tensor]:
        # Split where the batch arrives, the host, so each shard goes straight to its tower;
        # unplaced, the split ran on GPU:0 (the whole batch copied there, then each shard on
        # to its GPU), and its int32 arithmetic round-tripped through host memory. Scoped
        # (as is the state's bookkeeping below) so that the graphs tab draws the towers and
        # the average in its main graph, not dozens of unscoped ops.
        with tf.name_scope("shards"):
            batch = tf.shape(images)[0]
            batch_f = tf.cast(batch, tf.float32)
            with tf.device("/CPU:0"):
                sizes = tower_sizes(batch, self.num_towers)
                shards = _shards(images, labels, sizes, self.num_towers)
        with tf.device(self.parameter_device):
            scale = self._current_scale()

        with tf.name_scope("layer_state/"):
            state_before = [tf.identity(v) for v in self._tower_state]
        tower_grads, loss_sums, correct_sums, state_updates = [], [], [], []
        for i, device in enumerate(self.tower_devices):
            with tf.device(device), tf.name_scope(f"tower_{i}"):
                share = tf.cast(sizes[i], tf.float32) / batch_f
                grads, loss_sum, correct_sum = self._tower_gradients(
                    *shards[i], share, batch_f, scale, warn=i == 0
                )
                tower_grads.append(grads)
                loss_sums.append(loss_sum)
                correct_sums.append(correct_sum)
            if self._tower_state:
                # This tower's update of the state, then put the old values back so the next
                # tower updates from the same starting point.
                with tf.name_scope("layer_state/"):
                    state_updates.append([tf.identity(v) for v in self._tower_state])
                    for var, old in zip(self._tower_state, state_before, strict=True):
                        var.assign(old)

        with tf.device(self.parameter_device), tf.name_scope("average"):
            grads = [
                tf.add_n([tf.convert_to_tensor(g[k]) for g in tower_grads])
                for k in range(len(self._variables))
            ]
            grads, finite = self._unscaled(grads, scale)
            grads, averaged, norm = self._finish_gradients(grads)
            learning_rate = self.current_learning_rate()
            self._apply_unless_skipped(finite, grads, learning_rate)
            if self._tower_state:
                shares = tf.cast(sizes, tf.float32) / batch_f
                for k, (var, before) in enumerate(
                    zip(self._tower_state, state_before, strict=True)
                ):
                    # A stand-in shard has share zero, so it does not move the state.
                    parts = [
                        state_part(var, shares[i], i == 0, updates[k], before)
                        for i, updates in enumerate(state_updates)
                    ]
                    var.assign(state_from_sum(var, tf.add_n(parts), before))
            self.step.assign_add(1)
            if self.ema is not None:
                self.ema.update(self.step)
            report = self._step_report(
                with_scalars,
                averaged,
                norm,
                loss_sum=tf.add_n(loss_sums),
                correct_sum=tf.add_n(correct_sums),
                tower_loss_sums=tf.stack(loss_sums),
                sizes=sizes,
                batch_f=batch_f,
                learning_rate=learning_rate,
                scale=scale,
            )
            return {
                **report,
                # For histograms; unused outputs cost nothing beyond keeping them alive.
                "grads": averaged,
                # One process: what it asked for is what is agreed (trainer.multiworker).
                "requests": requests,
            }

    def _current_scale(self) -> tf.Tensor | None:
        """The loss scale this step multiplies each tower's objective by; None for a model
        that does not compute in float16."""
        return None if self.loss_scale is None else tf.convert_to_tensor(self.loss_scale.scale)

    def _unscaled(
        self, grads: list[tf.Tensor], scale: tf.Tensor | None
    ) -> tuple[list[tf.Tensor], tf.Tensor | None]:
        """The towers' summed gradients divided by the loss `scale`, and whether all are
        finite (None, and `grads` as they are, without a scale).

        Checked on the sum: a tower's inf or NaN makes the sum inf or NaN, so one pass
        covers every tower, and a cluster's all-reduce gives every worker the same sum,
        so every worker takes the same decision with no collective of its own. Divided
        after the sum, not per tower: the scale is a power of two, so the two give the
        same bits (short of float32's subnormals), and this is one division a variable,
        not one a tower."""
        if scale is None:
            return grads, None
        finite = all_finite(grads)  # before the division, as Keras checks
        return [unscaled(g, scale) for g in grads], finite

    def _apply_unless_skipped(
        self, finite: tf.Tensor | None, grads: list[tf.Tensor], learning_rate: tf.Tensor
    ) -> None:
        """Apply `grads`, unless the loss-scaled step's gradients were not `finite`: then
        nothing is applied (the optimizer's slots and iteration count stay, as Keras's
        `LossScaleOptimizer` skips its inner optimizer) and the scale is halved. The scale
        is updated either way (`LossScale.update`)."""
        if finite is None:
            self._apply(grads, learning_rate)
            return
        assert self.loss_scale is not None

        def apply() -> tf.Tensor:
            self._apply(grads, learning_rate)
            return tf.constant(True)

        tf.cond(finite, apply, lambda: tf.constant(False))
        self.loss_scale.update(finite)

    def _finish_gradients(
        self, grads: list[tf.Tensor]
    ) -> tuple[list[tf.Tensor], list[tf.Tensor], tf.Tensor | None]:
        """From the summed gradient of the global mean loss: the gradients to apply
        (weight decay added, clipped), the same before clipping (for histograms), and
        their global norm before clipping when clipping computed it (None otherwise)."""
        if self.weight_decay:
            # `g + wd * w`, written as `g - (-wd) * w` (the same bits): Grappler merges an Add
            # of the towers' sum into one AddN, with the decay first, `(wd * w + g0) + g1`,
            # where a cluster's all-reduce leaves `(g0 + g1) + wd * w`, so one machine's two
            # towers and two workers parted in the last bits. A Sub is no sum to merge.
            grads = [
                g - (-self.weight_decay) * tf.convert_to_tensor(v) if _is_weight_decayed(v) else g
                for g, v in zip(grads, self._variables, strict=True)
            ]
        averaged = grads
        if self.clip_norm is None:
            return grads, averaged, None
        norm = _global_norm(grads)
        grads, _ = tf.clip_by_global_norm(grads, self.clip_norm, use_norm=norm)
        return grads, averaged, norm

    def _step_report(
        self,
        with_scalars: tf.Tensor,
        averaged: list[tf.Tensor],
        clipping_norm: tf.Tensor | None,
        *,
        loss_sum: tf.Tensor,
        correct_sum: tf.Tensor,
        tower_loss_sums: tf.Tensor,
        sizes: tf.Tensor,
        batch_f: tf.Tensor,
        learning_rate: tf.Tensor,
        scale: tf.Tensor | None,
    ) -> dict[str, tf.Tensor]:
        """What a train step reports of itself, on one machine or a cluster: the batch's
        mean loss and accuracy (`loss_sum`, `correct_sum` over its `batch_f` examples), each
        tower's mean loss (its part of `tower_loss_sums` over its `sizes` examples; a
        stand-in shard's over 1), its examples, the learning rate, and `_step_scalars`."""
        loss = loss_sum / batch_f
        accuracy = correct_sum / batch_f
        tower_loss = tower_loss_sums / tf.maximum(tf.cast(sizes, tf.float32), 1.0)
        grad_norm, scalars = self._step_scalars(
            with_scalars, averaged, clipping_norm, loss, accuracy, learning_rate, tower_loss, scale
        )
        return {
            "loss": loss,
            "accuracy": accuracy,
            "tower_loss": tower_loss,
            "tower_examples": sizes,
            "grad_norm": grad_norm,
            "learning_rate": learning_rate,
            "scalars": scalars,
        }

    def _step_scalars(
        self,
        with_scalars: tf.Tensor,
        averaged: list[tf.Tensor],
        clipping_norm: tf.Tensor | None,
        loss: tf.Tensor,
        accuracy: tf.Tensor,
        learning_rate: tf.Tensor,
        tower_loss: tf.Tensor,
        scale: tf.Tensor | None,
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """(grad_norm, scalars). On a scalars step: the averaged gradient's global norm
        (`clipping_norm`, when clipping computed it) and the `scalar_names` (the loss
        `scale` this step used, when there is one) and each tower's loss in one tensor,
        packed here so that the loop reads them back in one copy with no eager op of its
        own (it ran two, each a launch on a GPU's tensors). On other steps: zeros, and no
        pass over the gradients (a clipping norm still comes out)."""

        def asked() -> tuple[tf.Tensor, tf.Tensor]:
            norm = clipping_norm if clipping_norm is not None else _global_norm(averaged)
            named = {
                "loss": loss,
                "accuracy": accuracy,
                "learning_rate": learning_rate,
                "grad_norm": norm,
            }
            if scale is not None:
                named["loss_scale"] = scale
            packed = tf.stack([named[k] for k in self.scalar_names])
            return norm, tf.concat([packed, tower_loss], 0)

        def not_asked() -> tuple[tf.Tensor, tf.Tensor]:
            norm = clipping_norm if clipping_norm is not None else tf.constant(0.0)
            return norm, tf.zeros([len(self.scalar_names) + self.num_towers])

        return tf.cond(with_scalars, asked, not_asked)

    def _eval_step(self, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """[loss sum, correct predictions, examples] of a batch (the caller divides): one
        tensor, so that a batch is read back to the host in one copy, not three syncs."""
        batch = tf.shape(images)[0]
        with tf.device("/CPU:0"):  # as in `_train_step`
            sizes = tower_sizes(batch, self.local_towers)
            shards = _shards(images, labels, sizes, self.local_towers)
        loss_sums, correct_sums = [], []
        for i, device in enumerate(self.tower_devices):
            shard_images, shard_labels, weight = shards[i]
            # Not `tower_i`: a trace that spans an eval must not count its ops as a tower's
            # training time (`profiling.tower_times_ms`).
            with tf.device(device), tf.name_scope(f"eval/tower_{i}"):
                logits = self.model(shard_images, training=False)
                loss, correct = self._per_example(shard_labels, logits)
                loss_sums.append(weight * tf.reduce_sum(loss))
                correct_sums.append(weight * tf.reduce_sum(correct))
        return tf.stack([tf.add_n(loss_sums), tf.add_n(correct_sums), tf.cast(batch, tf.float32)])

    def eval_weights(self) -> contextlib.AbstractContextManager[None]:
        """The weights eval and export use: the EMA's inside the block when enabled."""
        return self.ema.swapped_in() if self.ema is not None else contextlib.nullcontext()

    def current_learning_rate(self) -> tf.Tensor:
        """The rate the next update uses: the optimizer's `learning_rate` (its schedule at
        its iteration count), which its own update reads too."""
        return tf.cast(self.optimizer.learning_rate, tf.float32)
