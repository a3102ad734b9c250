"""Training across hosts, on TensorFlow's own multi-worker engine.

When `TF_CONFIG` names a cluster of several workers (trainer/cluster.py), every host runs
the same `python -m trainer run`, and `tf.distribute.MultiWorkerMirroredStrategy` does
what crosses hosts: it keeps a copy of every variable on every tower of every worker,
broadcasts the initial values, and sums tensors across all of them with its collective
ops. Nothing here talks to another host by itself.

`ClusterTrainer` is the `TowerTrainer` with the strategy's replicas as its towers: each
worker reads the same global batch (the same data, seed and pipeline on every host), and
tower `i` of the cluster (replica `i` in sync) trains on shard `i` of it, exactly as the
towers of one machine do. The towers' gradients are summed by one all-reduce, so every
copy of the variables receives the same update; the losses, accuracies and requests the
controller reads (`REQUESTS`: stop, checkpoint) are summed by another, so every worker
makes the same decisions at the same step. Batch-norm moving statistics are set to the
share-weighted average of the towers' updates, as on one machine (one more all-reduce).

The update is one machine's too: TensorFlow's fused kernels (trainer/updates.py), run
once per copy through the strategy's `update`. What it costs beside one machine's towers:
every worker builds the whole global batch to take its shard of it.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Sized
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import tensorflow as tf

from trainer.checkpoints import CheckpointDamaged, Checkpointer
from trainer.cluster import (
    TRAINING_TASKS,
    Cluster,
    ClusterMismatch,
    ClusterNotFormed,
    task_name,
)
from trainer.errors import op_reason
from trainer.towers import (
    TowerTrainer,
    stand_in_if_empty,
    state_from_sum,
    state_part,
    tower_sizes,
)
from trainer.updates import Apply, make_apply

if TYPE_CHECKING:
    import keras

    from trainer.data import Arrays
    from trainer.spec import JobSpec

log = logging.getLogger(__name__)


# How long TensorFlow may take to form the cluster once every task's port has answered
# (`trainer.cluster.wait_for_peers`). Every task has imported TensorFlow and chosen its
# devices by then; what is left is each starting its server and devices (seconds, tens
# on a host of many GPUs). Unbounded, a task gone just after it answered, another program
# answering on a task's port, or TF_CONFIGs that list the tasks differently left the
# others waiting for ever, deaf to SIGTERM (TensorFlow's wait holds the interpreter).
FORM_SECONDS = 300.0


def make_strategy() -> tf.distribute.MultiWorkerMirroredStrategy:
    """The strategy for `TF_CONFIG`'s cluster. Must be made before TensorFlow runs any op
    (it starts this worker's server), and waits until every worker has started; raises
    `ClusterNotFormed` when they have not within `FORM_SECONDS`."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    _bound_forming(resolver, FORM_SECONDS)
    log.info(
        "forming the cluster in TensorFlow (for at most %g s; a SIGTERM meanwhile is acted "
        "on once it has formed)",
        FORM_SECONDS,
    )
    began = time.monotonic()
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    except tf.errors.OpError as e:
        log.error("forming the cluster failed: %s", e.message)  # TensorFlow's whole page
        # Its first sentence: the rest says to read the logs, which this message says too.
        reason = op_reason(e.message).split(". ", 1)[0].strip()
        timed_out = isinstance(e, tf.errors.DeadlineExceededError) or (
            time.monotonic() - began >= FORM_SECONDS
        )
        what = (
            f"did not form within {FORM_SECONDS:g} s of every task answering"
            if timed_out
            else f"failed to form {time.monotonic() - began:.0f} s after every task answered"
        )
        raise ClusterNotFormed(
            f"The cluster {what} "
            f"({type(e).__name__}: {reason}). A task stopped after it answered, another "
            "program answers on a task's port, or the tasks were given different TF_CONFIGs "
            "(each must list the same addresses in the same order). Check every worker's "
            "log, then start every worker again."
        ) from e
    log.info(
        "multi-worker: %d towers in sync, %s here",
        strategy.num_replicas_in_sync,
        ", ".join(strategy.extended.worker_devices),
    )
    return strategy


def _bound_forming(
    resolver: tf.distribute.cluster_resolver.ClusterResolver, seconds: float
) -> None:
    """The coordination service the strategy would configure, with registration as a
    barrier every task must reach within `seconds`.

    The strategy configures none when one is configured already. Its own registers each
    task with no deadline, and then waits for all of them without one: a task that never
    registers held the others there for ever. TensorFlow has no public setting for it.
    """
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    spec = multi_worker_util.normalize_cluster_spec(resolver.cluster_spec())
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(spec),
        coordinated_jobs=[
            coordination_config_pb2.CoordinatedJob(name=job, num_tasks=spec.num_tasks(job))
            for job in ("chief", "worker")
            if job in spec.jobs
        ],
        cluster_register_timeout_in_ms=int(seconds * 1000),
    )
    context.context().coordination_service.cluster_register_with_barrier = True


def _replica_index(context: tf.distribute.ReplicaContext) -> int:
    """This replica's place among all replicas in sync, as a Python int (for names)."""
    index = tf.get_static_value(context.replica_id_in_sync_group)
    if index is None:  # pragma: no cover - MultiWorkerMirroredStrategy knows it statically
        raise RuntimeError("The replica id is not known when the step is traced.")
    return int(index)


def _all_reduced_by_dtype(
    context: tf.distribute.ReplicaContext, op: tf.distribute.ReduceOp, values: list[tf.Tensor]
) -> list[tf.Tensor]:
    """`values` all-reduced, in their order, one collective per dtype: the strategy packs
    a list into one tensor, which fails on a list of two dtypes (an integer state's
    float64 part beside float32 statistics)."""
    reduced: list[tf.Tensor | None] = [None] * len(values)
    for dtype in dict.fromkeys(v.dtype for v in values):  # in first-seen order, on every worker
        where = [i for i, v in enumerate(values) if v.dtype == dtype]
        for i, total in zip(where, context.all_reduce(op, [values[i] for i in where]), strict=True):
            reduced[i] = total
    return [total for total in reduced if total is not None]


class ClusterTrainer(TowerTrainer):
    """`TowerTrainer` over every tower of every worker of `strategy`'s cluster."""

    def __init__(self, *, strategy: tf.distribute.Strategy, **kwargs: Any) -> None:
        self.strategy = strategy
        with strategy.scope():  # every variable made from here on is mirrored
            super().__init__(tower_devices=strategy.extended.worker_devices, **kwargs)

    def _make_apply(self, fused: bool) -> Apply:
        return make_apply(self.optimizer, self._variables, fused=fused, strategy=self.strategy)

    def _aggregated_here(self, var: keras.Variable) -> bool:
        # A mirrored variable's assignment in a tower is aggregated over the towers by the
        # strategy itself, by the variable's `aggregation` ("mean": the towers' values
        # averaged; "only_first_replica": the first's), save one of "none" (Keras's
        # default, batch norm's), which each tower's copy takes as it is: the step's.
        if var.aggregation == "sum":
            # Keras 3 assigns `v + x` for `assign_add(x)`, which a "sum" adds up over the
            # towers, the old value with each: say so, as nothing here can mend it.
            log.warning(
                "%s has aggregation 'sum': across a cluster, TensorFlow adds up every tower's "
                "assignment to it, and Keras assigns its whole new value, so it grows by the "
                "old value once per tower at each step. Give it aggregation 'mean' or "
                "'none' to have it averaged over the towers",
                var.path,
            )
        return var.aggregation == "none"

    def _training_call(self, image_spec: tf.TensorSpec) -> tf.types.experimental.ConcreteFunction:
        # In replica context, as the step calls it: each local copy is assigned there.
        return tf.function(
            lambda x: self.strategy.run(lambda: self.model(x, training=True))
        ).get_concrete_function(image_spec)

    @property
    def num_towers(self) -> int:
        return int(self.strategy.num_replicas_in_sync)

    def _train_step(
        self, images: tf.Tensor, labels: tf.Tensor, with_scalars: tf.Tensor, requests: tf.Tensor
    ) -> dict[str, tf.Tensor]:
        out = self.strategy.run(self._tower_step, args=(images, labels, with_scalars, requests))
        # Each tower's copy of the summed gradients goes to its copy of the variables. A
        # loss-scaled step's decision is taken here, in cross-replica context (a `tf.cond`
        # in replica context cannot hold the strategy's `update`); every tower holds the
        # same all-reduced sum, so this worker's first tower's says what every tower's does.
        finite = self._first_local(out["finite"]) if "finite" in out else None
        self._apply_unless_skipped(finite, out["grads"], out["learning_rate"])
        self.step.assign_add(1)
        if self.ema is not None:
            self.ema.update(self.step)
        # Every tower holds the same summed values: this worker's first tower speaks for all.
        first = self._first_local
        return {
            "loss": first(out["loss"]),
            "accuracy": first(out["accuracy"]),
            "tower_loss": first(out["tower_loss"]),
            "tower_examples": first(out["tower_examples"]),
            "grad_norm": first(out["grad_norm"]),
            "learning_rate": first(out["learning_rate"]),
            "scalars": first(out["scalars"]),
            "grads": [first(g) for g in out["averaged"]],
            "requests": first(out["requests"]),
        }

    def _first_local(self, value: Any) -> tf.Tensor:
        return self.strategy.experimental_local_results(value)[0]

    def _tower_step(
        self, images: tf.Tensor, labels: tf.Tensor, with_scalars: tf.Tensor, requests: tf.Tensor
    ) -> dict[str, Any]:
        """One tower of the cluster, in replica context: its shard of the global batch."""
        context = tf.distribute.get_replica_context()
        tower, towers = _replica_index(context), self.num_towers
        # Scoped as one machine's step is (`TowerTrainer._train_step`), so that the graphs
        # tab draws the tower and the average, not the split's ops beside them.
        with tf.name_scope("shards"):
            batch = tf.shape(images)[0]
            batch_f = tf.cast(batch, tf.float32)
            sizes = tower_sizes(batch, towers)
            start, size = tf.reduce_sum(sizes[:tower]), sizes[tower]
            shard = stand_in_if_empty(
                images, labels, images[start : start + size], labels[start : start + size], size
            )
            share = tf.cast(size, tf.float32) / batch_f
        scale = self._current_scale()  # this tower's copy; every copy holds the same
        with tf.name_scope("layer_state/"):
            state_before = [tf.identity(var) for var in self._tower_state]
        with tf.name_scope(f"tower_{tower}"):
            grads, loss_sum, correct_sum = self._tower_gradients(
                *shard, share, batch_f, scale, warn=tower == 0
            )

        sum_ = tf.distribute.ReduceOp.SUM
        with tf.name_scope("average"):
            grads = context.all_reduce(sum_, grads)
            grads, finite = self._unscaled(grads, scale)
            numbers = context.all_reduce(
                sum_,
                tf.concat(
                    [
                        tf.stack([loss_sum, correct_sum]),
                        tf.one_hot(tower, towers) * loss_sum,
                        tf.cast(requests, tf.float32),
                    ],
                    axis=0,
                ),
            )
            if self._tower_state:
                parts = [
                    state_part(var, share, tower == 0, tf.convert_to_tensor(var), before)
                    for var, before in zip(self._tower_state, state_before, strict=True)
                ]
                totals = _all_reduced_by_dtype(context, sum_, parts)
                for var, total, before in zip(self._tower_state, totals, state_before, strict=True):
                    # This tower's copy; every tower assigns the same.
                    var.assign(state_from_sum(var, total, before))
            grads, averaged, norm = self._finish_gradients(grads)
            report = self._step_report(
                with_scalars,
                averaged,
                norm,
                loss_sum=numbers[0],
                correct_sum=numbers[1],
                tower_loss_sums=numbers[2 : 2 + towers],
                sizes=sizes,
                batch_f=batch_f,
                learning_rate=self.current_learning_rate(),
                scale=scale,
            )
        return {
            **({} if finite is None else {"finite": finite}),
            "grads": grads,
            "averaged": averaged,
            **report,
            "requests": tf.cast(numbers[2 + towers :] > 0, tf.int32),
        }

    def gather(self, values: list[int]) -> np.ndarray:
        """`gather_rows` over this trainer's strategy."""
        return gather_rows(self.strategy, values)


def gather_rows(strategy: tf.distribute.Strategy, values: list[int]) -> np.ndarray:
    """Every tower's `values` (int64), one row a tower, in replica order; a collective,
    so every worker must call it at the same point."""
    mine = tf.constant([values], tf.int64)

    @tf.function
    def gathered() -> Any:
        return strategy.run(lambda: tf.distribute.get_replica_context().all_gather(mine, axis=0))

    return np.asarray(strategy.experimental_local_results(gathered())[0])


def fingerprint(*parts: object) -> int:
    """A 62-bit digest of `parts`' reprs, to compare what each worker was given."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 2


def spec_fingerprint(spec: JobSpec) -> int:
    """`fingerprint` of what `spec` trains.

    Its `name` and `priority` are left out: they label and queue the job, and training
    never reads them, so workers given the same training under another name train one
    job and agree bit for bit. Failing such a cluster would cost a restart of every host
    for a difference that changes nothing it computes.
    """
    return fingerprint(spec.model_dump_json(exclude={"name", "priority"}))


# The images are sampled, not read whole: SAMPLE_BLOCKS blocks of SAMPLE_BLOCK_BYTES, at
# evenly spaced offsets over each image array's values in C order (the first block at its
# start, the last at its end), or the whole array where it is no larger; the labels,
# shapes and dtypes in full. Sampled by value (`ndarray.flat`), not by memory, so an
# array in Fortran order (an .npz saved so: numpy's reader keeps it) costs no copy of the
# whole, and two workers holding one data set in two layouts agree. Measured on this
# project's 2-core x86 dev machine, median of 5, with a test run beside it: 25 ms for 400
# MB of uint8 images in C order (510,000 of 28x28, 4 MB of labels included; 4 ms when the
# blocks were sliced from the bytes, which read a Fortran-order array only through a
# whole copy), 120 ms for the same in Fortran order; 22 ms for 10 million labels alone.
# Once, at the job's start. Data that differ
# only in images the sample misses pass: two data sets of one shape differ in their
# labels, or in their images all over.
SAMPLE_BLOCKS = 1024
SAMPLE_BLOCK_BYTES = 4096


def data_fingerprint(arrays: Arrays) -> int:
    """A 62-bit digest of the examples in `arrays` (labels in full, images sampled), to
    compare the data each worker read. Reads the labels and at most 4 MiB of each image
    array, however large it is."""
    sha = hashlib.sha256()
    parts = (arrays.x_train, arrays.y_train, arrays.x_eval, arrays.y_eval)
    sha.update(repr([arrays.num_classes, *((a.shape, a.dtype.str) for a in parts)]).encode())
    for labels in (arrays.y_train, arrays.y_eval):
        sha.update(np.ascontiguousarray(labels).tobytes())
    for images in (arrays.x_train, arrays.x_eval):
        block = max(1, SAMPLE_BLOCK_BYTES // images.itemsize)  # values a block
        if images.size <= SAMPLE_BLOCKS * block:
            sha.update(np.ascontiguousarray(images).tobytes())
            continue
        last = images.size - block
        for i in range(SAMPLE_BLOCKS):
            start = i * last // (SAMPLE_BLOCKS - 1)
            sha.update(images.flat[start : start + block].tobytes())  # a copy of the block
    return int.from_bytes(sha.digest()[:8], "big") >> 2


Gather = Callable[[list[int]], np.ndarray]


class _Gathered(NamedTuple):
    """What `_gather_named` returns: `values`' columns, a row a tower in replica order;
    the task each row came from, as `TF_CONFIG` names it (`trainer.cluster.task_name`);
    and the row of the chief (the `chief` task, else `worker` 0)."""

    rows: np.ndarray
    names: list[str]
    chief: int


def _gather_named(gather: Gather, task: Cluster, values: list[int]) -> _Gathered:
    """`gather` of `values`, naming the task of every row: a column of its task type and
    one of its index ride along, so a message can say which worker it is about. Carried,
    not worked out from the rows' order and count: that would assume every worker runs as
    many towers, which the job check (`same_job`, itself a gather) has not yet shown."""
    typed = gather([*values, TRAINING_TASKS.index(task.task_type), task.task_index])
    tasks = [(int(kind), int(index)) for kind, index in typed[:, -2:]]
    return _Gathered(
        typed[:, : len(values)],
        [task_name(TRAINING_TASKS[kind], index) for kind, index in tasks],
        min(range(len(tasks)), key=tasks.__getitem__),  # chief < worker, then by index
    )


# The most workers a message names; a larger cluster's are counted past them.
NAMED_TASKS = 5


def _named(names: list[str], where: np.ndarray) -> list[str]:
    """The tasks of the rows `where` holds, each once, in row order: a worker of several
    towers gives several rows."""
    return list(dict.fromkeys(n for n, w in zip(names, where, strict=True) if w))


def _tasks_text(tasks: list[str]) -> str:
    """`worker-1`, `worker-1 and worker-2`, `worker-1, worker-2, ... and 7 more`."""
    if len(tasks) > NAMED_TASKS:
        return f"{', '.join(tasks[:NAMED_TASKS])} and {len(tasks) - NAMED_TASKS} more"
    return tasks[0] if len(tasks) == 1 else f"{', '.join(tasks[:-1])} and {tasks[-1]}"


def _verb(things: Sized, one: str, several: str) -> str:
    return one if len(things) == 1 else several


def same_job(gather: Gather, task: Cluster, spec: int, data: int) -> None:
    """Raises `ClusterMismatch` unless every worker runs the same job (`spec_fingerprint`)
    on the same data (`data_fingerprint`), saying which differs and on which workers.
    `gather`: `gather_rows` over the cluster's strategy; `task`: this worker's place in it.
    Called before the model is built: building it broadcasts the chief's first values,
    which fails on a model of other shapes as a shape mismatch in a collective, or on the
    chief as "lost another worker"."""
    # In each worker's log: comparing them finds the worker that differs.
    log.info("cluster: spec fingerprint %016x, data fingerprint %016x", spec, data)
    rows, names, chief = _gather_named(gather, task, [spec, data])
    # The workers that differ from the chief, whose run directory is the job's.
    specs, datas = (_named(names, rows[:, c] != rows[chief, c]) for c in (0, 1))
    if not (specs or datas):
        return
    # Every worker gathers the same rows, so each says the same: which part differs, where.
    agree, fix = "", "the same spec.json and the same data"
    if specs == datas:
        differ = f"spec and data differ on {_tasks_text(specs)}"
    elif specs and datas:
        differ = f"spec differs on {_tasks_text(specs)} and data on {_tasks_text(datas)}"
    elif specs:
        differ, fix = f"spec differs on {_tasks_text(specs)}", "the same spec.json"
    else:
        differ, agree = f"data differ on {_tasks_text(datas)}", "; the specs agree"
        fix = (
            "the same data: the same files at data.path on every host (a relative "
            "path is read from each worker's working directory)"
        )
    raise ClusterMismatch(
        f"The workers of this cluster were given different jobs ({differ} from the chief, "
        f"{names[chief]}{agree}): give every worker {fix}."
    )


def start_together(gather: Gather, task: Cluster, checkpointer: Checkpointer) -> int | None:
    """Restore the same checkpoint on every worker (`same_job` has checked they run one
    job); returns its step, or None for a fresh start. `gather`: `gather_rows` over the
    cluster's strategy (`ClusterTrainer.gather`); `task`: this worker's place in it.

    Each worker keeps its own checkpoints (no shared disk needed), so after a crash their
    newest can differ by the save that was under way: all of them restore the smallest of
    the workers' newest steps (they save at the same steps, so each saved it). Where a
    worker's copy of it is damaged (`CheckpointDamaged`: a save cut short, a lost file),
    every worker goes below it together, as `Checkpointer.restore_latest` does on one
    host: the next round restores the smallest of the workers' newest steps below it, and
    so on; once every worker has restored one, each sets aside the damaged copies it found.

    Every round's outcome is gathered, so every worker runs the same collectives in the
    same order and fails the same way, naming the workers concerned: a worker that failed
    alone left the others to fail at their first step as "lost another worker", whose
    advice (start every worker again) failed the same way, and the chief's result is the
    job's. Raises `ClusterMismatch` where a worker no longer keeps a round's step
    (`checkpoint.keep` let it go), where some worker has no checkpoint while another has
    (starting over from step 0 would write over the others' checkpoints), and where a
    worker has none left below the damaged ones.
    """
    damaged: list[tuple[int, CheckpointDamaged]] = []  # this worker's, newest first
    # The steps found damaged on some worker, newest first, each with the workers it was on.
    tried: list[tuple[int, list[str]]] = []
    while True:
        below = tried[-1][0] if tried else None  # each round looks below the last damaged step
        kept = checkpointer.steps()
        latest = next((s for s in reversed(kept) if below is None or s < below), None)
        rows, names, _ = _gather_named(gather, task, [-1 if latest is None else latest])
        steps = rows[:, 0]
        common, newest = int(steps.min()), int(steps.max())
        if common < 0:
            if below is not None:
                raise _none_left(task, below, _none_while(steps, names, below), damaged, tried)
            if newest >= 0:
                # Starting again from step 0 would throw away every worker's training and
                # write over their checkpoints: a worker's directory lost with its host must
                # not cost the whole job silently.
                raise ClusterMismatch(
                    f"Cannot resume together: {_none_while(steps, names, None)}. Give every "
                    "worker back its checkpoints/ directory to resume, or start the job in "
                    "new directories to train from step 0."
                )
            return None
        rows, names, _ = _gather_named(gather, task, [int(common not in kept)])
        if lacking := _named(names, rows[:, 0] > 0):
            which = (
                f"this worker keeps {kept}"
                if common not in kept
                else _verb(
                    lacking,
                    "its log says which steps it keeps",
                    "their logs say which steps they keep",
                )
            )
            before = ""
            if tried:
                before = f" before step {below} (damaged on {_tasks_text(tried[-1][1])})"
            raise ClusterMismatch(
                f"Cannot resume together: the newest checkpoint every worker has{before} is "
                f"step {common}, and {_tasks_text(lacking)} no longer "
                f"{_verb(lacking, 'keeps', 'keep')} it ({which}). Keep more checkpoints "
                "(checkpoint.keep), or start the job in new directories."
            )
        try:
            restored: int | None = checkpointer.restore(common)
        except CheckpointDamaged as e:
            log.warning("%s; every worker of the cluster tries the step before it", e)
            damaged.append((common, e))
            restored = None
        rows, names, _ = _gather_named(gather, task, [int(restored is None)])
        failed = _named(names, rows[:, 0] > 0)
        if not failed:
            if damaged:
                checkpointer.set_aside([step for step, _ in damaged])
            return restored
        if restored is not None:
            log.warning(
                "step %d is damaged on %s: every worker tries the step before it",
                common,
                _tasks_text(failed),
            )
        tried.append((common, failed))


def _none_while(steps: np.ndarray, names: list[str], below: int | None) -> str:
    """Who keeps no checkpoint (before step `below`, where one was damaged) while who
    keeps the newest, from the gathered newest `steps` (-1: none) of the tasks `names`."""
    before = "" if below is None else f" before step {below}"
    if steps.max() < 0:
        return f"no worker keeps a checkpoint{before}"
    none, most = _named(names, steps < 0), _named(names, steps == steps.max())
    return (
        f"{_tasks_text(none)} {_verb(none, 'keeps', 'keep')} no checkpoint{before} while "
        f"{_tasks_text(most)} {_verb(most, 'keeps', 'keep')} up to step {steps.max()}"
    )


def _none_left(
    task: Cluster,
    below: int,
    none: str,
    damaged: list[tuple[int, CheckpointDamaged]],
    tried: list[tuple[int, list[str]]],
) -> ClusterMismatch:
    """Why the workers cannot resume once some worker keeps no step below `below`, the
    last step found damaged: whose copies were damaged, and (`none`, `_none_while`) who
    has none left. Nothing is set aside, as `restore_latest` moves nothing when every
    checkpoint is damaged."""
    found = [f"this worker's {e}" for _, e in damaged]  # "... checkpoints/ckpt-40 is damaged: why"
    # The other workers' damaged steps, newest first, those damaged on the same ones together.
    groups: list[tuple[list[str], list[int]]] = []
    for step, on in tried:
        others = [name for name in on if name != task.name]
        if not others:
            continue
        if groups and groups[-1][0] == others:
            groups[-1][1].append(step)
        else:
            groups.append((others, [step]))
    for others, steps in groups:
        found.append(
            f"{_verb(steps, 'step', 'steps')} {', '.join(str(s) for s in steps)} "
            f"{_verb(steps, 'is', 'are')} damaged on {_tasks_text(others)}, "
            f"{_verb(others, 'its log says', 'their logs say')} why"
        )
    return ClusterMismatch(
        "Cannot resume together: no step every worker keeps reads whole on all of them ("
        + "; ".join(found)
        + f"), and {none}. Put back whole copies of the damaged checkpoints, or start the "
        "job in new directories to train from step 0."
    )


def lost_worker(error: BaseException, step: int | None) -> str | None:
    """What to tell the user when a collective failed because a worker is gone (killed,
    its host down, the network cut, or stopped: its heartbeats time out); None for any
    other error. TensorFlow's own message is a page of traceback around one useful line.
    `step`: the step being run, or None before training (the cluster starting)."""
    text = str(error)
    gone = isinstance(error, (tf.errors.UnavailableError, tf.errors.AbortedError)) or (
        # A chief that stops answering (its host hung, or SIGSTOP) is the coordination
        # service's leader: the others' heartbeats to it time out.
        isinstance(error, tf.errors.DeadlineExceededError)
        and ("Collective ops is aborted" in text or "CoordinationService" in text)
    )
    if not gone:
        return None
    # The cause's first line can end in a colon, with the tasks it names on the lines
    # after it ("The following tasks are unhealthy (stopped sending heartbeats):").
    cause = re.search(r"Collective ops is aborted by: ([^\n]+(?:\n/job:\S+)*)", text)
    peer = re.search(r"remote target (\S+)", text)
    detail = "; ".join(
        part
        for part in (
            cause and _shortened(_task_names(" ".join(cause.group(1).split()))),
            peer and f"peer {_task_names(peer.group(1))}",
        )
        if part
    )
    when = "while the cluster was starting" if step is None else f"at step {step}"
    return (
        f"Lost another worker of the cluster {when}"
        + (f" ({detail})" if detail else f" ({type(error).__name__})")
        + ". Start every worker again: they resume from the newest checkpoint they all have."
    )


# A task as TensorFlow names it ("/job:worker/replica:0/task:1"), to be named as TF_CONFIG
# and the other messages name it (worker-1): the cause's list of tasks gone, 28 characters
# each in TensorFlow's words, was cut off past five or six of them.
_TF_TASK = re.compile(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)")


def _task_names(text: str) -> str:
    return _TF_TASK.sub(lambda m: task_name(m[1], int(m[2])), text)


def _shortened(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
