"""Run one job: read its spec, build data, model and towers, train, and write the run dir.

`run_job` returns the process exit code (`trainer.rundir.ExitCode`). Everything that can
be wrong with a job before training starts is checked first, and a job that cannot start
ends with a result.json saying why and nothing else written but its preparation's
progress lines (`trainer.preparing`: the stages it reached, from TensorFlow's import on,
after the spec and its data files are checked): exit 2 where the job itself
is at fault (the spec, its data, its model, the devices it asks for), exit 1 where it is
not (too little memory for the data, a cluster's workers given different jobs, a crash
while preparing). A task refused its place in a cluster (`TF_CONFIG` it cannot use, its
port taken) exits 2 and writes nothing: the directory may be another worker's. So does a
run whose `steps` its directory's checkpoints have passed: that directory's job (its
spec.json, result.json, progress.jsonl) is not the refused run's to change.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from trainer import duplicate_keys, modelmodules
from trainer.cluster import (
    Cluster,
    ClusterError,
    ClusterMismatch,
    ClusterNotFormed,
    cluster_from_env,
    signals_held,
    wait_for_peers,
)
from trainer.duplicate_keys import DuplicateKeyError
from trainer.errors import one_line
from trainer.memory import NotEnoughMemory
from trainer.preparing import BUILDING, IMPORTING, RESTORING, Preparation
from trainer.rundir import (
    END_PHASES,
    OUTCOME_EXIT_CODES,
    ExitCode,
    Outcome,
    ProgressWriter,
    RunDir,
    write_json_atomic,
)
from trainer.spec import (
    JobSpec,
    field_errors,
    format_errors,
    options_not_read,
    without_unread,
)
from trainer.unknown_keys import shown_path

if TYPE_CHECKING:  # their modules import TensorFlow, which a spec error never pays for
    import keras
    import tensorflow as tf

    from trainer.data import Arrays
    from trainer.devices import Devices

log = logging.getLogger("trainer")


# Puts a job's towers on logical GPUs of this many MiB split from the first card: for
# benchmarks of several towers on a one-GPU machine (bench/towers_bench.py sets it). The
# service neither sets nor schedules it (it gives a job one whole GPU per tower).
SPLIT_GPU_ENV = "TOWERBOARD_SPLIT_GPU_MB"


class InvalidJob(ValueError):
    """A job that cannot start: exit code 2. `errors` are field errors where known."""

    def __init__(self, message: str, errors: list[dict[str, str]] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []


def load_spec(path: Path) -> JobSpec:
    try:
        raw = duplicate_keys.loads(path.read_text())
    except FileNotFoundError as e:
        raise InvalidJob(f"Spec file not found: {path}") from e
    except UnicodeDecodeError as e:  # JSON is UTF-8; a Latin-1 `é` is not
        raise InvalidJob(f"Spec file {path} is not UTF-8 text (JSON must be): {e}") from e
    except DuplicateKeyError as e:  # JSON, but one of a key's values would be lost
        field = shown_path(e.path)
        raise InvalidJob(f"Spec file {path}: {e}", [{"field": field, "message": e.here}]) from e
    # Not only JSONDecodeError: an integer of thousands of digits is a ValueError, and
    # brackets nested thousands deep a RecursionError.
    except (ValueError, RecursionError) as e:
        raise InvalidJob(f"Spec file {path} is not valid JSON: {e}") from e
    except OSError as e:  # a folder, no permission
        raise InvalidJob(f"Cannot read the spec file {path}: {e.strerror or e}") from e
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as e:
        errors = field_errors(e)
        raise InvalidJob(f"Invalid job spec:\n{format_errors(errors)}", errors) from e


def _write_result(rundir: RunDir, outcome: Outcome, message: str, **fields: Any) -> ExitCode:
    code = OUTCOME_EXIT_CODES[outcome]
    try:
        write_json_atomic(
            rundir.result,
            {
                "outcome": outcome.value,
                "exit_code": int(code),
                "message": message,
                "finished_at": round(time.time(), 3),
                **fields,
            },
        )
    except OSError as e:
        # A full or read-only disk: the exit code and the log's last line still say how
        # the job ended (the service reads a missing result.json with the exit code).
        log.error("could not write result.json: %s", e)
    # The log's last line says how the job ended, as result.json does (a cancelled job's
    # log otherwise ends on whatever TensorFlow printed last).
    log.info("%s (exit %d): %s", outcome.value, int(code), message)
    return code


def run_job(
    job_dir: Path, spec_path: Path | None = None, *, stop: threading.Event | None = None
) -> ExitCode:
    """Train the job in `job_dir` (spec from `spec_path`, else `job_dir/spec.json`).
    `stop`: set by a SIGTERM or Ctrl-C caught before this was called (trainer.__main__).

    With a multi-worker `TF_CONFIG` this process is one worker of a cluster
    (trainer/cluster.py): the chief writes `job_dir`, any other worker its own directory
    under it.
    """
    try:
        cluster = cluster_from_env()
    except ClusterError as e:
        return _cluster_refused(e)
    rundir = RunDir(cluster.run_dir(job_dir))
    if spec_path is None:
        # A cluster's other worker keeps its copy in its own directory: started again
        # without --spec, it reads that one (the job dir's may be none, or the chief's).
        spec_path = rundir.spec if rundir.spec.exists() else RunDir(job_dir).spec
    rundir.root.mkdir(parents=True, exist_ok=True)
    # SIGTERM (the service's cancel, or its shutdown) and Ctrl-C finish the step,
    # checkpoint, and exit 3. Caught from the start: one that lands while TensorFlow is
    # imported or the data loaded (seconds) must not kill the worker with no result.json,
    # which the service would take for a crash and run again.
    stop = stop or threading.Event()
    _stop_on_signals(stop)
    # Its stages as progress lines, from TensorFlow's import on (`trainer.preparing`).
    preparation = Preparation(rundir)
    try:
        spec = load_spec(spec_path)
        # A spec file as a person wrote it (spec.json may be one stored with defaults).
        from_file = spec_path.resolve() != rundir.spec.resolve()
        if from_file and (unread := options_not_read(spec)):
            raise InvalidJob(f"Invalid job spec:\n{format_errors(unread)}", unread)
        if (past := _past_the_end_already(spec, rundir, cluster)) is not None:
            return _refused_past_the_end(past)
        try:
            prepared = _prepare(spec, cluster, stop, preparation)
        except BaseException:
            preparation.close()  # the lines it wrote stay; nothing trains to write on
            raise
    except ClusterError as e:
        return _cluster_refused(e)
    except InvalidJob as e:
        log.error("%s", e)
        return _write_result(rundir, Outcome.INVALID_SPEC, str(e), errors=e.errors)
    except ClusterMismatch as e:
        log.error("%s", e)
        if isinstance(e, ClusterNotFormed) and stop.is_set():
            # A SIGTERM held while TensorFlow waited (it cannot be acted on there): the
            # stop asked for, not a failure, though the wait ended first.
            return _write_result(
                rundir,
                Outcome.CANCELLED,
                "Stopped by SIGTERM while the cluster formed (it did not); nothing was trained.",
            )
        return _write_result(rundir, Outcome.FAILED, str(e))
    except NotEnoughMemory as e:  # not the spec's: the job may start where there is room
        log.error("%s", e)
        return _write_result(rundir, Outcome.FAILED, f"Not enough memory for the data: {e}")
    except StoppedWaiting:
        return _write_result(
            rundir,
            Outcome.CANCELLED,
            "Stopped by SIGTERM while waiting for the other tasks of the cluster to start; "
            "nothing was trained.",
        )
    except Exception as e:  # noqa: BLE001 - whatever breaks, the job ends with a result.json saying why
        log.error("preparing the job failed:\n%s", traceback.format_exc())
        message = f"Preparing the job failed: {one_line(e)}"
        if cluster.is_multi_worker and "tensorflow" in sys.modules:
            # The model's initial values are broadcast as it is built: a worker that
            # stopped meanwhile (its own spec refused) fails the others there.
            from trainer.multiworker import lost_worker

            message = lost_worker(e, None) or message
        return _write_result(rundir, Outcome.FAILED, message)
    return _train(spec, prepared, rundir, stop, cluster, preparation, write_spec=from_file)


# What the OS says when a run directory cannot be written, in an OSError or TensorFlow's
# message (a summary flush, a checkpoint save: "<path>; No space left on device"), and
# what to do about it.
_DISK_PROBLEMS = {
    "No space left on device": "free space on its disk",
    "Disk quota exceeded": "free space or raise the quota",
    "Read-only file system": "make it writable",
}
_DISK_PATH = re.compile(r"(/[^\s;{}']+)'?(?:; |: )(?:" + "|".join(_DISK_PROBLEMS) + ")")


def _disk_problem(error: BaseException, rundir: RunDir) -> str | None:
    """One line for an error that is the disk's, not the job's: what, where, what to do."""
    text = str(error)
    problem = next((p for p in _DISK_PROBLEMS if p in text), None)
    if problem is None:
        return None
    path = getattr(error, "filename", None) or next(iter(_DISK_PATH.findall(text)), None)
    where = ""
    if path:
        with contextlib.suppress(ValueError):
            path = str(Path(path).relative_to(rundir.root))
        where = f" writing {path}"
    # A job of the service is resumed by its Resume (a worker started by hand again in the
    # same folder does the same); either trains on from the latest checkpoint it keeps.
    again = "resume the job" if os.environ.get("TOWERBOARD_JOB_ID") else "run the job again"
    return (
        f"{problem}{where}: {_DISK_PROBLEMS[problem]}, then {again}: it trains on from its "
        "latest checkpoint (from step 0 where it has none)."
    )


def _quietly(what: str, action: Any, *args: Any, **kwargs: Any) -> None:
    """Run a write on the way out of a failed job; a failure of its own (the same full
    disk) is logged, not raised over the job's own error and exit code."""
    try:
        action(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - see the docstring
        log.error("could not %s: %s", what, one_line(e))


def _cluster_refused(error: ClusterError) -> ExitCode:
    """Exit 2 for a task that cannot take its place in the cluster, writing nothing: the
    job dir is the chief's, and this task may be a second copy of a running one
    (trainer/cluster.py)."""
    log.error("%s", error)
    log.info("%s (exit %d): nothing written", Outcome.INVALID_SPEC.value, ExitCode.INVALID_SPEC)
    return ExitCode.INVALID_SPEC


def _past_the_end_already(spec: JobSpec, rundir: RunDir, cluster: Cluster) -> PastTheEnd | None:
    """A run whose `steps` its run directory's newest whole checkpoint has passed, told from
    the checkpoints' files before anything is written (`epochs` are steps only once the
    data is loaded: `_train` tells those; a torn newest save is set aside on restore, the
    run resuming from the one before, which may lie within `steps`). A cluster's workers resume from the newest step
    they all keep, which they agree on once it has formed."""
    if cluster.is_multi_worker or spec.steps is None:
        return None
    latest = rundir.latest_checkpoint_step()
    return PastTheEnd(latest, spec.steps, None) if latest and latest > spec.steps else None


def _refused_past_the_end(error: PastTheEnd) -> ExitCode:
    """Exit 2 for a run whose total its checkpoints have passed, writing nothing: its run
    directory (its spec.json, result.json and progress.jsonl) stays as it was, the job it
    holds untouched by a length it was never run with."""
    log.error("%s", error)
    log.info("%s (exit %d): nothing written", Outcome.INVALID_SPEC.value, ExitCode.INVALID_SPEC)
    return ExitCode.INVALID_SPEC


def _stop_on_signals(stop: threading.Event) -> None:
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())


class StoppedWaiting(Exception):
    """A SIGTERM or Ctrl-C came while this task waited for the rest of its cluster."""


@dataclass
class _Prepared:
    """What `_prepare` made of a job that nothing rejected, for `_train`."""

    devices: Devices
    arrays: Arrays  # `_train` drops its images once the input pipelines hold them
    model: keras.Model
    binary: bool  # one logit, for labels 0 and 1 (`trainer.models.BuiltModel.binary`)
    strategy: tf.distribute.Strategy | None  # a cluster's, else None


def _prepare(
    spec: JobSpec, cluster: Cluster, stop: threading.Event, preparation: Preparation
) -> _Prepared:
    """Everything that can reject the job, before anything is written but the stages it
    reaches (`preparation`), from TensorFlow's import on: the spec and its data files are
    checked first, so a job refused for them writes nothing but its result.json."""
    from trainer.datafiles import (
        DataFilesError,
        check_under_roots,
        resolve_files,
        roots_from_environ,
    )

    # Again here, before the module is imported: a job queued or stored before the
    # service's list was narrowed was admitted under the old one.
    if spec.model.is_custom and (
        refused := modelmodules.refusal(spec.model.name, modelmodules.from_environ(os.environ))
    ):
        raise InvalidJob(refused, [{"field": "model.name", "message": refused}])

    if spec.data.format != "synthetic":
        assert spec.data.path is not None  # DataSpec requires it for every file format
        try:
            # Again here: a link or file put in a folder while the job waited for its
            # turn would otherwise bring data from outside the service's roots.
            if (roots := roots_from_environ(os.environ)) is not None:
                check_under_roots(spec.data.path, roots)
            resolve_files(spec.data)
        except DataFilesError as e:
            raise InvalidJob(str(e), [{"field": "data.path", "message": str(e)}]) from e

    # TensorFlow only now: a spec error above is reported without paying its import. In a
    # cluster, with SIGTERM and Ctrl-C held until the strategy is made (see there), and
    # without a line until then: a second copy of a running task, refused as its port is
    # taken, must write nothing to the directory, which is that task's.
    if not cluster.is_multi_worker:
        preparation.stage(IMPORTING)
    with signals_held(stop) if cluster.is_multi_worker else contextlib.nullcontext():
        devices, strategy = _devices_and_strategy(spec, cluster, stop)
    from trainer.data import DataError, load_arrays
    from trainer.hostarrays import copied_bytes
    from trainer.memory import available_bytes, check_room
    from trainer.models import ModelError, build_model

    try:
        arrays = load_arrays(spec.data, spec.seed, preparation)  # its stages: `loading data`...
    except NotEnoughMemory:
        raise  # not the spec's fault: a failed job (exit 1) to resume where there is room
    except Exception as e:  # noqa: BLE001 - a corrupt file can raise anything (zlib.error, EOFError, MemoryError)
        reason = str(e) if isinstance(e, (DataError, ValueError, OSError)) else one_line(e)
        raise InvalidJob(
            f"Cannot load the data: {reason}", [{"field": "data", "message": reason}]
        ) from e

    # Data too large for memory fails in one line (exit 1: it may fit later, or elsewhere)
    # rather than be killed, restarted as a crash and killed again: a file before it is
    # read (`load_arrays`), and here what TensorFlow must copy of what was.
    check_room(copied_bytes(arrays.x_train, arrays.x_eval), available_bytes())

    problem = spec.data.augment.crop_problem(*arrays.image_shape[:2])
    if problem is not None:
        field = "data.augment.random_crop_padding"
        raise InvalidJob(problem, [{"field": field, "message": problem}])

    if strategy is not None:
        from trainer.multiworker import data_fingerprint, gather_rows, same_job, spec_fingerprint

        # Before the model is built: see `same_job`.
        same_job(
            lambda values: gather_rows(strategy, values),
            cluster,
            spec_fingerprint(spec),
            data_fingerprint(arrays),
        )

    preparation.stage(BUILDING)  # the model, then (`_train`) the trainer and the pipelines
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(spec.seed)
    if spec.deterministic:
        tf.config.experimental.enable_op_determinism()
    try:
        with strategy.scope() if strategy else tf.device(devices.parameter):
            built = build_model(
                spec.model, arrays.image_shape, arrays.num_classes, arrays.label_range
            )
    except (ModelError, ValueError, TypeError) as e:
        raise InvalidJob(str(e), [{"field": "model", "message": str(e)}]) from e
    return _Prepared(devices, arrays, built.model, built.binary, strategy)


def _devices_and_strategy(
    spec: JobSpec, cluster: Cluster, stop: threading.Event
) -> tuple[Any, Any]:
    """The job's devices (TensorFlow imported here) and, in a cluster, the strategy,
    once every task has joined."""
    from trainer.devices import setup_devices

    split = os.environ.get(SPLIT_GPU_ENV, "").strip()
    # isascii: str.isdigit() holds for '²' too, which int() refuses.
    if split and not (split.isascii() and split.isdigit() and int(split) > 0):
        message = (
            f"Expected {SPLIT_GPU_ENV} to be a whole number of MiB above 0. Received: {split!r}"
        )
        raise InvalidJob(message, [{"field": SPLIT_GPU_ENV, "message": message}])
    try:
        devices = setup_devices(
            spec.towers,
            spec.parameter_device,
            split_gpu_mb=int(split) if split else None,
            multi_worker=cluster.is_multi_worker,
        )
    except ValueError as e:
        raise InvalidJob(str(e), [{"field": "towers", "message": str(e)}]) from e
    strategy = None
    if cluster.is_multi_worker:
        from trainer.multiworker import make_strategy

        if not wait_for_peers(cluster, stop):  # a port taken raises ClusterError
            raise StoppedWaiting
        # Before any other op (it starts this worker's server); waits for the others. A
        # SIGTERM meanwhile is held (`signals_held`), not lost to TensorFlow's handler;
        # but TensorFlow's wait holds the interpreter, so one is acted on only once every
        # task has joined (a task gone just after `wait_for_peers` saw it is waited for
        # up to `FORM_SECONDS`, then this one fails: ClusterNotFormed).
        strategy = make_strategy()
    return devices, strategy


def _train(
    spec: JobSpec,
    prepared: _Prepared,
    rundir: RunDir,
    stop: threading.Event,
    cluster: Cluster,
    preparation: Preparation,
    *,
    write_spec: bool,
) -> ExitCode:
    """Train the prepared job. `write_spec`: the spec came from a file of its own, and is
    the run directory's spec.json once nothing refuses it."""
    import tensorflow as tf

    from trainer.checkpoints import Checkpointer
    from trainer.controller import Controller
    from trainer.data import eval_dataset, steps_per_epoch, train_dataset
    from trainer.divergence import Diverged
    from trainer.export import export_model
    from trainer.optim import make_optimizer
    from trainer.summaries import SummaryManager
    from trainer.towers import TowerTrainer

    devices, arrays, model = prepared.devices, prepared.arrays, prepared.model

    per_epoch = steps_per_epoch(arrays.num_train, spec.batch_size)
    if spec.batch_size > arrays.num_train:
        # Not refused (a small set may be meant), but the batch is not what the spec says:
        # each step is the whole set, and each tower's share of it shrinks with it.
        log.warning(
            "batch_size %d is more than the %d training examples: each step trains on all "
            "of them (one epoch a step), a global batch of %d",
            spec.batch_size,
            arrays.num_train,
            arrays.num_train,
        )
    if spec.steps is not None:
        total = spec.steps
    else:
        assert spec.epochs is not None  # the spec holds one of the two
        total = spec.epochs * per_epoch
    # In a cluster the chief alone writes TensorBoard's logs (trainer/cluster.py).
    summaries = SummaryManager(rundir.tensorboard if cluster.is_chief else None)
    # None until a checkpoint is restored (or none found): a run that fails before then
    # (every checkpoint damaged, or not this model's) leaves the job at the step it had
    # reached, where a 0 in its end line showed it at 0 beside its latest checkpoint.
    step: int | None = None
    controller = None
    strategy = prepared.strategy
    progress: ProgressWriter | None = None
    try:
        progress = preparation.progress  # the preparation's lines' writer, or a new one
        # Keras ties an optimizer to the strategy it is made under.
        with strategy.scope() if strategy else contextlib.nullcontext():
            optimizer = make_optimizer(spec.optimizer)
        settings: dict[str, Any] = {
            "model": model,
            "optimizer": optimizer,
            "parameter_device": devices.parameter,
            "binary": prepared.binary,
            "weight_decay": spec.weight_decay,
            "clip_norm": spec.clip_norm,
            "ema_decay": spec.ema_decay,
            "input_shape": arrays.image_shape,
        }
        trainer: TowerTrainer
        cluster_trainer = None
        if strategy is not None:
            from trainer.multiworker import ClusterTrainer, start_together

            trainer = cluster_trainer = ClusterTrainer(strategy=strategy, **settings)
        else:
            with tf.device(devices.parameter):
                trainer = TowerTrainer(tower_devices=devices.towers, **settings)
        with tf.device("/CPU:0"):
            batches = iter(train_dataset(arrays, spec.data, spec.batch_size, spec.seed))
        evaluates = arrays.num_eval and spec.eval.every_steps
        evals = eval_dataset(arrays, spec.batch_size, spec.eval.batches) if evaluates else None
        # The pipelines hold the images now (the loaded arrays themselves, or TensorFlow's
        # copy of one it could not share): drop this reference, so such a copy's original goes.
        prepared.arrays = arrays = arrays.without_images()
        if evaluates and (read := spec.eval.batches * spec.batch_size) < arrays.num_eval:
            log.info(
                "eval: each eval reads the first %d of the %d eval examples (eval.batches %d "
                "of batch_size %d); give eval.batches %d to read them all",
                read,
                arrays.num_eval,
                spec.eval.batches,
                spec.batch_size,
                math.ceil(arrays.num_eval / spec.batch_size),
            )
        # A large model's restore takes seconds to minutes: said in bytes of its checkpoint's
        # data files read (`Preparation.reads`, by the process's count of bytes read). It
        # is about the restore's alone: the data was loaded (`_prepare`) before the model
        # was built, the input pipelines feed from those arrays in memory, the summaries'
        # writer writes, and nothing else of the worker reads meanwhile but a cluster's
        # gathers (between restores) and the kilobytes of the checkpoint's index (which
        # the total leaves out: the stage is held under its total until the restore ends).
        checkpointer = Checkpointer(
            rundir.checkpoints,
            trainer,
            batches,
            spec.checkpoint,
            reading=lambda total: preparation.reads(RESTORING, total),
        )
        if cluster_trainer is not None:
            if checkpointer.steps():  # none to restore, no stage
                # Said as the workers agree on the checkpoint, before its restore's amounts:
                # a worker alone goes straight to them (a bare line before them said nothing).
                preparation.stage(RESTORING)
            # The same checkpoint restored on every worker (`same_job` checked the job).
            resumed = start_together(cluster_trainer.gather, cluster, checkpointer)
        else:
            resumed = checkpointer.restore_latest()
        if resumed is not None:
            log.info("resumed from step %d", resumed)
        step = int(trainer.step.numpy())
        if step > total:  # the spec was shortened after this checkpoint was written
            raise PastTheEnd(step, total, spec.epochs)
        if write_spec:  # the run's from here on: read again when it is started without one
            write_json_atomic(rundir.spec, without_unread(spec.model_dump(mode="json")))
        controller = Controller(
            spec=spec,
            trainer=trainer,
            train_batches=batches,
            eval_data=evals,
            total_steps=total,
            rundir=rundir,
            progress=progress,
            summaries=summaries,
            checkpointer=checkpointer,
            stop=stop,
            cluster=cluster,
            steps_per_epoch=per_epoch,
            data=arrays.summary(),
        )
        summary = controller.run()
        trained = summary.step > step  # none: finished at the checkpoint it restored
        step = summary.step
        fields = {
            "step": summary.step,
            "total": total,
            "metrics": dict(summary.metrics),
            "eval": summary.eval,
            "checkpoint": summary.checkpoint,
            "export": None,
        }
        if cluster.is_multi_worker:
            fields["cluster"] = {"workers": cluster.workers, "task": cluster.name}
        if summary.outcome is Outcome.SUCCEEDED and cluster.is_chief:
            progress.write("phase", step=step, total=total, phase="exporting")
            export_model(
                trainer,
                arrays.image_shape,
                rundir.export,
                classes=arrays.num_classes,
                uint8_pixels=arrays.x_train.dtype.name == "uint8",  # as `trainer.data` scales
            )
            fields["export"] = "export"
        # With the numbers of its last step, as result.json has them: a cancelled run's last
        # report, up to 2 s before, was of an earlier step, and the job showed those; a job
        # finished at a failed run's checkpoint (no step trained here) showed that run's
        # last report, of a step past the checkpoint.
        _write_end(
            progress,
            rundir,
            step=step,
            total=total,
            outcome=summary.outcome.value,
            phase=END_PHASES[summary.outcome],
            loss=summary.metrics.get("loss"),
            accuracy=summary.metrics.get("accuracy"),
        )
        if summary.outcome is Outcome.CANCELLED:
            return _write_result(
                rundir,
                Outcome.CANCELLED,
                f"Stopped by SIGTERM at step {step}, after a checkpoint.",
                **fields,
            )
        # A run resumed at its total ("finish here") trains no step: "Trained N steps." read
        # as if this attempt had trained them all.
        message = (
            f"Trained {step} steps."
            if trained or not step
            else f"Finished at step {step}, its checkpoint: no step trained."
        )
        if not cluster.is_chief:
            # Its `eval` and `export` are null: whose they are, and whose result is the job's.
            message += " The chief evaluates, exports and writes the job's result."
        return _write_result(rundir, Outcome.SUCCEEDED, message, **fields)
    except Diverged as e:  # said in full, with the step it names
        log.error("%s", e)
        _end_failed(progress, rundir, e.step, total)
        return _write_result(rundir, Outcome.FAILED, str(e), step=e.step, total=total)
    except PastTheEnd as e:  # the spec's length: refused as an invalid spec (exit 2)
        # Known only now: `epochs`, counted from the data, or a cluster's step, agreed on
        # as it formed (`_past_the_end_already` refuses the rest before writing anything).
        # Its spec.json is left as it was; the end line and result.json say why, for the
        # service, whose resume refuses the same length once the end line gives its total.
        log.error("%s", e)
        _end_failed(progress, rundir, step, total)
        errors = [{"field": e.field, "message": str(e)}]
        return _write_result(
            rundir, Outcome.INVALID_SPEC, str(e), errors=errors, step=step, total=total
        )
    except ClusterMismatch as e:  # said in full: no traceback, no type name
        log.error("%s", e)
        _end_failed(progress, rundir, step, total)
        return _write_result(rundir, Outcome.FAILED, str(e), step=step, total=total)
    except Exception as e:  # noqa: BLE001 - any crash becomes a failed result, not a stuck job
        log.error("training failed:\n%s", traceback.format_exc())
        step = controller.at_step if controller is not None else step
        # The whole traceback is in the log, above.
        message = _disk_problem(e, rundir) or one_line(e)
        if strategy is not None:
            from trainer.multiworker import lost_worker

            message = lost_worker(e, step) or message
        _end_failed(progress, rundir, step, total)
        return _write_result(rundir, Outcome.FAILED, message, step=step, total=total)
    finally:
        _quietly("close the TensorBoard writers", summaries.close)
        if progress is not None:
            _quietly("close progress.jsonl", progress.close)


class PastTheEnd(RuntimeError):
    """The latest checkpoint lies past the spec's total steps: nothing is left to train,
    and "succeeded at step 40 of 20" would say something false about the job. The spec's
    length is at fault (exit 2), in `field`."""

    def __init__(self, step: int, total: int, epochs: int | None) -> None:
        self.field = "epochs" if epochs is not None else "steps"
        length = f"{epochs} epochs, {total} steps" if epochs is not None else f"{total} steps"
        super().__init__(
            f"Cannot resume: the latest checkpoint is at step {step}, past this job's total "
            f"of {length}. Give a larger total (steps or epochs), or start a new job to train "
            "from the start."
        )


def _write_end(progress: ProgressWriter, rundir: RunDir, **fields: Any) -> None:
    """The run's end line, with no result.json left beside it. A custom model's code runs
    in the run directory and may have written one; the service ends a running job at the
    result.json it finds once this line is in, and that must be the one `_write_result`
    writes next, not the model's (found between the two, it ended the job with it)."""
    try:
        rundir.result.unlink(missing_ok=True)
    except OSError as e:  # a folder of that name: `_write_result` says why it cannot write
        log.warning("could not remove the result.json the job's code left: %s", e)
    progress.write("end", **fields)


def _end_failed(
    progress: ProgressWriter | None, rundir: RunDir, step: int | None, total: int
) -> None:
    """The failed run's end line; without a step when it failed before it had one."""
    if progress is not None:
        at = {} if step is None else {"step": step}
        _quietly(
            "write progress.jsonl",
            _write_end,
            progress,
            rundir,
            **at,
            total=total,
            outcome=Outcome.FAILED.value,
            phase=END_PHASES[Outcome.FAILED],
        )
