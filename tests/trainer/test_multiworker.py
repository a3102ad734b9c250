"""A job across hosts: real worker processes joined by `TF_CONFIG` on loopback ports.

Each worker is `python -m trainer run`, as on its own host, with TensorFlow's
MultiWorkerMirroredStrategy between them (gRPC over 127.0.0.1). On this CPU-only machine
each worker trains one tower, the CPU.
"""

import contextlib
import json
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.trainer.test_cluster import NO_IPV6
from tests.trainer.test_run import REPO, run_worker, tags_by_plugin, with_
from tests.trainer.test_towers import batch, make_trainer, running_mean_model
from trainer.checkpoints import Checkpointer
from trainer.cluster import Cluster
from trainer.data import Arrays
from trainer.multiworker import (
    SAMPLE_BLOCK_BYTES,
    SAMPLE_BLOCKS,
    ClusterMismatch,
    ClusterTrainer,
    data_fingerprint,
    same_job,
    spec_fingerprint,
    start_together,
)
from trainer.optim import make_optimizer
from trainer.spec import CheckpointSpec, JobSpec, OptimizerSpec
from trainer.towers import TowerTrainer

SPEC = {
    "name": "cluster",
    "model": {"name": "resnet", "params": {"width": 4, "blocks_per_stage": [1, 1]}},
    "data": {"format": "synthetic", "params": {"shape": [8, 8], "classes": 4, "size": 512}},
    "towers": 1,
    "batch_size": 30,
    "steps": 160,
    # Each worker adds the decay to the all-reduced sum and keeps its own EMA: both must
    # still agree bit for bit with one machine's two towers.
    "weight_decay": 0.001,
    "ema_decay": 0.9,
    "deterministic": True,
    "eval": {"every_steps": 100, "batches": 2},
    "summaries": {
        "scalars_every": 10,
        "histograms_every": 100,
        "images_every": 100,
        "trace_steps": [6, 7],
    },
    # Every 20 steps, and every second: each worker's clock says when, the step agrees it.
    "checkpoint": {"every_steps": 20, "every_seconds": 1, "keep": 40},
}


# Ports for a cluster's tasks, below the kernel's ephemeral range (32768-60999 by
# default): a port the kernel handed out (bind to port 0) is free again once released,
# and the next process to ask may get it before the task binds it, as a test of the
# other xdist process did in CI ("Address already in use"; the other task then waited
# 300 s for a cluster that could not form). Below that range only an explicit bind
# takes one.
CLUSTER_PORTS = range(20000, 32768)


def free_ports(count: int) -> list[int]:
    """`count` distinct ports of CLUSTER_PORTS that 127.0.0.1 can bind now."""
    ports: list[int] = []
    for port in random.sample(CLUSTER_PORTS, len(CLUSTER_PORTS)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise AssertionError(f"Expected {count} free ports in {CLUSTER_PORTS}. Received: {ports}")


@dataclass
class Worker:
    proc: subprocess.Popen
    log: Path


def start_cluster(
    job_dir: Path, specs: list[dict], cwds: list[Path] | None = None, host: str = "127.0.0.1"
) -> list[Worker]:
    """One worker process per spec, all given `job_dir` (a shared disk); worker 0 is chief.
    `cwds`: each worker's working directory, as on hosts of their own (the repo's root by
    default); `host`: every task's host in `TF_CONFIG` (a port free on 127.0.0.1 each)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    addresses = [f"{host}:{port}" for port in free_ports(len(specs))]
    return [
        start_worker(job_dir, addresses, i, spec, cwds[i] if cwds else REPO)
        for i, spec in enumerate(specs)
    ]


def start_worker(
    job_dir: Path, addresses: list[str], index: int, spec: dict, cwd: Path = REPO
) -> Worker:
    """Worker `index` of the cluster at `addresses`, given `job_dir`, run in `cwd`."""
    spec_file = job_dir.parent / f"{job_dir.name}-spec-{index}.json"
    spec_file.write_text(json.dumps(spec))
    tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
    # Logs go to files: a worker blocked on a full pipe would stall every other worker.
    log = job_dir.parent / f"{job_dir.name}-{index}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainer", "run", "--job-dir", str(job_dir)]
            + ["--spec", str(spec_file)],
            cwd=cwd,
            # This checkout's trainer from any working directory (not another one's
            # that the environment may have installed).
            env={**os.environ, "TF_CONFIG": json.dumps(tf_config), "PYTHONPATH": str(REPO)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Worker(proc, log)


def wait_for_line(worker: Worker, text: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while text not in worker.log.read_text():
        assert worker.proc.poll() is None and time.monotonic() < deadline, worker.log.read_text()
        time.sleep(0.1)


def finish(workers: list[Worker]) -> list[tuple[int, str]]:
    """Each worker's exit code and log."""
    codes = [w.proc.wait(timeout=300) for w in workers]
    return [(code, w.log.read_text()) for code, w in zip(codes, workers, strict=True)]


def worker_dirs(job_dir: Path, workers: int) -> list[Path]:
    return [job_dir] + [job_dir / "workers" / f"worker-{i}" for i in range(1, workers)]


def results(job_dir: Path, workers: int) -> list[dict]:
    return [json.loads((d / "result.json").read_text()) for d in worker_dirs(job_dir, workers)]


def variables(checkpoint: Path) -> dict[str, np.ndarray]:
    """The model's weights and batch-norm statistics, the optimizer's slots, the EMA's."""
    reader = tf.train.load_checkpoint(str(checkpoint))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if name.startswith(("model/", "optimizer/", "step/", "ema/"))
    }


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory) -> Path:
    job_dir = tmp_path_factory.mktemp("cluster") / "job"
    for code, log in finish(start_cluster(job_dir, [SPEC, SPEC])):
        assert code == 0, log
    return job_dir


def test_two_workers_train_as_two_towers_of_one_machine(cluster_run, tmp_path):
    # The same global batch split over 2 towers in 2 processes or in 1: the same updates,
    # batch-norm statistics included (both average the towers' updates), bit for bit over
    # the whole run. Both sum two towers' values (an order-free sum of two) and apply them
    # with the same fused kernels; a difference in any last bit would grow over 160 steps.
    code, _, log = run_worker(tmp_path / "one", with_(SPEC, towers=2))
    assert code == 0, log
    for step in (20, 160):
        one = variables(tmp_path / "one" / "checkpoints" / f"ckpt-{step}")
        chief, worker = (
            variables(d / "checkpoints" / f"ckpt-{step}") for d in worker_dirs(cluster_run, 2)
        )
        assert any("moving_variance" in name for name in one)
        assert any("optimizer/" in name for name in one)
        assert any(name.startswith("ema/shadows/") for name in one)
        assert one.keys() == chief.keys() == worker.keys()
        for name in one:
            np.testing.assert_array_equal(chief[name], worker[name], err_msg=f"{name}, {step}")
            np.testing.assert_array_equal(chief[name], one[name], err_msg=f"{name}, {step}")


def test_the_chief_writes_the_run_dir_and_the_other_workers_their_own(cluster_run):
    chief, worker = results(cluster_run, 2)
    assert chief["outcome"] == worker["outcome"] == "succeeded"
    assert chief["cluster"] == {"workers": 2, "task": "worker-0"}
    assert worker["cluster"] == {"workers": 2, "task": "worker-1"}
    assert chief["metrics"]["loss"] == worker["metrics"]["loss"]
    assert chief["export"] == "export" and (cluster_run / "export" / "saved_model.pb").exists()
    assert chief["eval"] is not None and worker["eval"] is None
    assert chief["message"] == "Trained 160 steps."
    assert worker["message"] == (
        "Trained 160 steps. The chief evaluates, exports and writes the job's result."
    )

    tags = tags_by_plugin(cluster_run / "tb" / "train")
    assert {"loss", "tower_0/loss", "tower_1/loss", "tower_0/compute_ms"} <= tags["scalars"]
    assert {"tower_0/inputs", "tower_1/inputs"} <= tags["images"]
    # Read from the chief's mirrored weights, outside the strategy's towers.
    assert {"activations/logits", "activations/stem_relu"} <= tags["histograms"]
    assert "zero_fraction/stem_relu" in tags["scalars"]
    assert "graph" in tags
    lines = [json.loads(line) for line in (cluster_run / "progress.jsonl").read_text().splitlines()]
    start = next(i for i, line in enumerate(lines) if line["event"] == "start")
    assert (lines[start]["towers"], lines[start]["workers"]) == (2, 2)
    # Its preparation's stages, from the cluster's forming on (before it, a second copy of
    # a task, refused its port, must write nothing: the directory is the running task's).
    assert [(line["phase"], line["stage"]) for line in lines[:start]] == [
        ("preparing", "loading data"),
        ("preparing", "building the model"),
    ]

    other = cluster_run / "workers" / "worker-1"
    steps = [sorted(d.glob("checkpoints/ckpt-*.index")) for d in (cluster_run, other)]
    assert [p.name for p in steps[0]] == [p.name for p in steps[1]], "saved at the same steps"
    assert any(int(p.name[5:-6]) % 20 for p in steps[0]), "a save by time, not by step count"
    assert (other / "checkpoints" / "ckpt-160.index").exists()
    assert (other / "progress.jsonl").exists()
    assert not (other / "tb").exists() and not (other / "export").exists()


def test_sigterm_to_one_worker_stops_every_worker_at_one_step_and_they_resume(
    cluster_run, tmp_path
):
    job_dir = tmp_path / "job"
    workers = start_cluster(job_dir, [SPEC, SPEC])
    deadline = time.monotonic() + 180
    while not (job_dir / "checkpoints" / "ckpt-40.index").exists():
        assert all(w.proc.poll() is None for w in workers) and time.monotonic() < deadline, (
            "a worker ended before the first checkpoint"
        )
        time.sleep(0.01)
    workers[1].proc.send_signal(signal.SIGTERM)  # not the chief: the stop must still reach it
    for code, log in finish(workers):
        assert code == 3, log
    chief, worker = results(job_dir, 2)
    assert chief["outcome"] == worker["outcome"] == "cancelled"
    assert chief["step"] == worker["step"], "every worker stops after the same step"
    assert 40 <= chief["step"] < 160, "SIGTERM must land mid-run for this test to mean anything"
    for d in worker_dirs(job_dir, 2):
        assert (d / "checkpoints" / f"ckpt-{chief['step']}.index").exists()
        # The stop's checkpoint leaves no worker "training", the one not signalled too.
        lines = [json.loads(line) for line in (d / "progress.jsonl").read_text().splitlines()]
        saved = [line for line in lines if line["event"] == "checkpoint"][-1]
        assert saved["step"] == chief["step"] and saved["phase"] == "checkpoint", saved

    for code, log in finish(start_cluster(job_dir, [SPEC, SPEC])):
        assert code == 0, log
    assert [r["step"] for r in results(job_dir, 2)] == [160, 160]
    resumed = variables(job_dir / "checkpoints" / "ckpt-160")
    whole = variables(cluster_run / "checkpoints" / "ckpt-160")
    for name in whole:
        np.testing.assert_array_equal(resumed[name], whole[name], err_msg=name)


def test_a_killed_worker_fails_the_others_and_all_resume_from_a_step_they_share(
    cluster_run, tmp_path
):
    job_dir = tmp_path / "job"
    workers = start_cluster(job_dir, [SPEC, SPEC])
    other = job_dir / "workers" / "worker-1" / "checkpoints"
    deadline = time.monotonic() + 180
    while not (other / "ckpt-40.index").exists():
        assert all(w.proc.poll() is None for w in workers) and time.monotonic() < deadline, (
            "a worker ended before the first checkpoint"
        )
        time.sleep(0.01)
    workers[1].proc.kill()  # no checkpoint, no result: its host went away
    code, log = finish(workers[:1])[0]
    assert code == 1, log
    failed = json.loads((job_dir / "result.json").read_text())
    assert failed["outcome"] == "failed"
    assert failed["message"].startswith("Lost another worker of the cluster at step"), failed
    assert "Start every worker again" in failed["message"]
    # A task TensorFlow names (its peer, or the tasks gone) is said as TF_CONFIG says it.
    assert "/job:" not in failed["message"], failed
    assert len(failed["message"]) < 400, "one line the user can read, not TensorFlow's page"

    for code, log in finish(start_cluster(job_dir, [SPEC, SPEC])):
        assert code == 0, log
    resumed = variables(job_dir / "checkpoints" / "ckpt-160")
    whole = variables(cluster_run / "checkpoints" / "ckpt-160")
    for name in whole:
        np.testing.assert_array_equal(resumed[name], whole[name], err_msg=name)


def test_a_chief_killed_in_its_final_eval_finishes_it_when_every_worker_starts_again(tmp_path):
    # The other worker has succeeded by then, its part done: the job is the chief's.
    spec = {
        **SPEC,
        "steps": 40,
        "eval": {"every_steps": 40, "batches": 20},
        "summaries": {"scalars_every": 10, "histograms_every": 0, "images_every": 0},
        "checkpoint": {"every_steps": 20, "every_seconds": 0, "keep": 5},
    }
    job_dir = tmp_path / "job"
    workers = start_cluster(job_dir, [spec, spec])
    other = job_dir / "workers" / "worker-1" / "result.json"
    deadline = time.monotonic() + 180
    progress = job_dir / "progress.jsonl"
    while not progress.exists() or '"phase": "eval"' not in progress.read_text():
        assert workers[0].proc.poll() is None, workers[0].log.read_text()
        assert time.monotonic() < deadline, "the chief never began its final eval"
        time.sleep(0.01)
    workers[0].proc.send_signal(signal.SIGSTOP)  # held in its eval until the other is done
    while not other.exists():
        assert workers[1].proc.poll() in (None, 0), workers[1].log.read_text()
        assert time.monotonic() < deadline, "the other worker never wrote its result"
        time.sleep(0.01)
    workers[0].proc.kill()
    assert [code for code, _ in finish(workers)] == [-signal.SIGKILL, 0]
    assert json.loads(other.read_text())["outcome"] == "succeeded"
    assert not (job_dir / "result.json").exists() and not (job_dir / "export").exists()

    for code, log in finish(start_cluster(job_dir, [spec, spec])):
        assert code == 0, log
    chief = json.loads((job_dir / "result.json").read_text())
    assert chief["outcome"] == "succeeded" and chief["eval"]["examples"] == 102, chief  # 512 / 5
    assert (job_dir / "export" / "saved_model.pb").exists()


def test_workers_given_different_jobs_fail_saying_so(tmp_path):
    job_dir = tmp_path / "job"
    for code, log in finish(start_cluster(job_dir, [SPEC, with_(SPEC, steps=100)])):
        assert code == 1, log
    for result in results(job_dir, 2):
        assert result["outcome"] == "failed"
        assert (
            "given different jobs (spec differs on worker-1 from the chief, worker-0)"
            in result["message"]
        ), result
    assert not (job_dir / "checkpoints").exists()


def test_workers_given_different_data_at_the_same_path_fail_saying_so(tmp_path):
    # One spec, one relative data.path, read from two working directories as on two hosts:
    # the same shapes and counts, other labels. Both would train "successfully", each
    # worker's shard of every batch labelled its own way.
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (200, 8, 8, 1), np.uint8)
    y = rng.integers(0, 4, 200)
    hosts = [tmp_path / "host-a", tmp_path / "host-b"]
    for host, labels in zip(hosts, (y, (y + 1) % 4), strict=True):
        (host / "data").mkdir(parents=True)
        np.savez(host / "data" / "train.npz", x=x, y=labels)
    spec = with_(
        SPEC,
        model={"name": "mlp", "params": {"hidden": [8]}},
        data={"format": "npz", "path": "data/train.npz"},
        steps=20,
    )
    job_dir = tmp_path / "job"
    for code, log in finish(start_cluster(job_dir, [spec, spec], cwds=hosts)):
        assert code == 1, log
        assert "cluster: spec fingerprint" in log, "the fingerprints are in each worker's log"
    for result in results(job_dir, 2):
        assert result["outcome"] == "failed"
        assert (
            "given different jobs (data differ on worker-1 from the chief, worker-0; the specs "
            "agree)" in result["message"]
        ), result
        assert "the same files at data.path on every host" in result["message"]
    assert not (job_dir / "checkpoints").exists()


# A few steps of a small model: for what needs a cluster that trains, not its numbers.
SHORT = with_(
    SPEC,
    model={"name": "mlp", "params": {"hidden": [8]}},
    steps=4,
    eval={"every_steps": 0},
    summaries={"scalars_every": 2},
)


def test_workers_given_the_same_training_under_other_names_train_together(tmp_path):
    # `name` and `priority` label and queue a job; training never reads them.
    other = with_(SHORT, name="cluster, as host-b calls it", priority=5)
    job_dir = tmp_path / "job"
    for code, log in finish(start_cluster(job_dir, [SHORT, other])):
        assert code == 0, log
    assert [r["step"] for r in results(job_dir, 2)] == [4, 4]


@NO_IPV6
def test_workers_at_ipv6_addresses_train_together(tmp_path):
    # Each waited for the others on an IPv4 listener alone, where their probes of
    # `[::1]:port` (or of a host name that resolves to an IPv6 address) found nothing: all
    # of them waited for ever, though TensorFlow's own server listens on IPv6 too.
    job_dir = tmp_path / "job"
    workers = start_cluster(job_dir, [SHORT, SHORT], host="[::1]")
    for worker in workers:
        wait_for_line(worker, "every task of the cluster answered", seconds=60)
    for code, log in finish(workers):
        assert code == 0, log
    assert [r["step"] for r in results(job_dir, 2)] == [4, 4]


def _fixed_rows(
    tasks: list[tuple[str, int, list[int]]], towers: int = 1
) -> Callable[[list[int]], np.ndarray]:
    """A gather that returns the rows of `tasks` (type, index, values: each task's, as it
    gives them to `gather_rows`, `towers` rows a task, in replica order), after checking
    that this worker's own values are those of the first."""

    def gather(values: list[int]) -> np.ndarray:
        kind, index, mine = tasks[0]
        assert values == [*mine, ["chief", "worker"].index(kind), index]
        rows = [[*v, ["chief", "worker"].index(k), i] for k, i, v in tasks for _ in range(towers)]
        return np.array(rows, np.int64)

    return gather


@pytest.mark.parametrize(
    ("other", "says"),
    [
        (
            [2, 10],
            "(spec differs on worker-1 from the chief, worker-0): give every worker the same spec.json.",
        ),
        (
            [1, 20],
            "(data differ on worker-1 from the chief, worker-0; the specs agree): give every "
            "worker the same data:",
        ),
        (
            [2, 20],
            "(spec and data differ on worker-1 from the chief, worker-0): give every worker the "
            "same spec.json and the same data.",
        ),
    ],
)
def test_same_job_says_which_part_differs_and_where(other, says):
    gather = _fixed_rows([("worker", 0, [1, 10]), ("worker", 1, other)])
    with pytest.raises(ClusterMismatch) as raised:
        same_job(gather, Cluster(workers=2), 1, 10)
    assert str(raised.value).startswith("The workers of this cluster were given different jobs ")
    assert says in str(raised.value)


def test_same_job_names_each_task_as_tf_config_does_once_however_many_towers_it_runs():
    # A `chief` task beside `worker`s 0 and 1, two towers each: the rows come two a task,
    # and the chief is the `chief` task, not worker 0.
    gather = _fixed_rows(
        [("worker", 0, [2, 10]), ("chief", 0, [1, 10]), ("worker", 1, [1, 20])], towers=2
    )
    with pytest.raises(ClusterMismatch) as raised:
        same_job(gather, Cluster(workers=3, index=1, task_index=0), 2, 10)
    assert "(spec differs on worker-0 and data on worker-1 from the chief, chief-0): " in str(
        raised.value
    )
    # A large cluster's message names the first few and counts the rest.
    tasks = [("worker", i, [1, 10] if i == 0 else [2, 10]) for i in range(9)]
    with pytest.raises(ClusterMismatch) as raised:
        same_job(_fixed_rows(tasks), Cluster(workers=9), 1, 10)
    assert (
        "(spec differs on worker-1, worker-2, worker-3, worker-4, worker-5 and 3 more from the "
        "chief, worker-0)" in str(raised.value)
    )


def test_workers_given_different_models_fail_saying_so_not_at_the_broadcast(tmp_path):
    # Building the model broadcasts the chief's first values: with other shapes that
    # failed as a shape mismatch in a collective on one worker and as "lost another
    # worker" on the chief. The job check comes before it.
    spec = with_(SPEC, model={"name": "mlp", "params": {"hidden": [8]}}, steps=4)
    other = with_(spec, model={"name": "mlp", "params": {"hidden": [16]}})
    job_dir = tmp_path / "job"
    for code, log in finish(start_cluster(job_dir, [spec, other])):
        assert code == 1, log
    for result in results(job_dir, 2):
        assert "given different jobs (spec differs on worker-1 from" in result["message"], result


def _arrays(x_train, y_train, x_eval=None, y_eval=None) -> Arrays:
    x_eval = np.empty((0, *x_train.shape[1:]), x_train.dtype) if x_eval is None else x_eval
    y_eval = np.empty((0,), np.int32) if y_eval is None else y_eval
    return Arrays(x_train, y_train, x_eval, y_eval, 10)


def test_data_fingerprint_follows_the_labels_the_shapes_and_the_sampled_images():
    rng = np.random.default_rng(0)
    # 6 MiB of images: more than the sample, so it samples.
    x = rng.integers(0, 256, (8192, 32, 32, 3), np.uint8)
    y = rng.integers(0, 10, 8192).astype(np.int32)
    assert x.nbytes > SAMPLE_BLOCKS * SAMPLE_BLOCK_BYTES
    print_ = data_fingerprint(_arrays(x, y))
    assert data_fingerprint(_arrays(x.copy(), y.copy())) == print_, "the contents, not the memory"
    assert 0 <= print_ < 2**62, "fits the int64 the workers gather"

    one_label = y.copy()
    one_label[4321] = (one_label[4321] + 1) % 10
    assert data_fingerprint(_arrays(x, one_label)) != print_, "every label counts"
    first_pixel, last_pixel = x.copy(), x.copy()
    first_pixel[0, 0, 0, 0] ^= 1
    last_pixel[-1, -1, -1, -1] ^= 1
    assert data_fingerprint(_arrays(first_pixel, y)) != print_
    assert data_fingerprint(_arrays(last_pixel, y)) != print_
    # Another split of the same examples, another layout or dtype of the same bytes.
    held_out = _arrays(x[:8000], y[:8000], x[8000:], y[8000:])
    assert data_fingerprint(held_out) != print_
    assert data_fingerprint(_arrays(x.reshape(8192, 32, 96, 1), y)) != print_
    assert data_fingerprint(_arrays(x.view(np.int8), y)) != print_
    # An array in Fortran order (an .npz saved so loads so) reads as its contents, in
    # the sample too, so two workers holding one data set in two layouts agree.
    fortran = np.asfortranarray(x)
    assert not fortran.flags.c_contiguous
    assert data_fingerprint(_arrays(fortran, y)) == print_


def test_spec_fingerprint_leaves_out_the_name_and_priority_alone():
    spec = JobSpec.model_validate(SPEC)
    print_ = spec_fingerprint(spec)
    renamed = JobSpec.model_validate(with_(SPEC, name="another name", priority=7))
    assert spec_fingerprint(renamed) == print_
    assert spec_fingerprint(JobSpec.model_validate(with_(SPEC, steps=161))) != print_
    assert spec_fingerprint(JobSpec.model_validate(with_(SPEC, seed=1))) != print_


def test_more_than_one_tower_per_cpu_worker_exits_2(tmp_path):
    # Refused before the strategy starts, so this worker needs no peer to say so.
    job_dir = tmp_path / "job"
    workers = start_cluster(job_dir, [with_(SPEC, towers=2), SPEC])
    workers[1].proc.kill()
    code, log = finish(workers[:1])[0]
    assert code == 2, log
    result = json.loads((job_dir / "result.json").read_text())
    assert "Expected towers=1" in result["message"]
    assert result["errors"][0]["field"] == "towers"


def test_a_worker_without_checkpoints_fails_rather_than_restart_the_job(tmp_path):
    # A host replaced with an empty disk: starting every worker from step 0 would throw
    # away the others' training and write over their checkpoints.
    job_dir = tmp_path / "job"
    spec = with_(SPEC, steps=20, eval={"every_steps": 0}, checkpoint={"every_steps": 10})
    for code, log in finish(start_cluster(job_dir, [spec, spec])):
        assert code == 0, log
    saved = sorted(p.name for p in (job_dir / "checkpoints").iterdir())
    before = (job_dir / "checkpoints" / "ckpt-10.data-00000-of-00001").read_bytes()
    shutil.rmtree(job_dir / "workers" / "worker-1")

    for code, log in finish(start_cluster(job_dir, [spec, spec])):
        assert code == 1, log
    for result in results(job_dir, 2):
        assert result["outcome"] == "failed"
        assert (
            "Cannot resume together: worker-1 keeps no checkpoint while worker-0 keeps up to "
            "step 20. " in result["message"]
        ), result
    assert sorted(p.name for p in (job_dir / "checkpoints").iterdir()) == saved
    assert (job_dir / "checkpoints" / "ckpt-10.data-00000-of-00001").read_bytes() == before


def test_a_worker_that_no_longer_keeps_the_common_step_fails_every_worker_saying_so(tmp_path):
    # The chief's checkpoints put back from an older copy: the step every worker has is
    # its newest, 20, which worker 1 (keep 2: 30 and 40) no longer keeps. Worker 1 said
    # so, and the chief, whose result is the job's, restored 20 and then failed at its
    # first step as "Lost another worker ... Start every worker again", which fails again.
    job_dir = tmp_path / "job"
    spec = with_(SPEC, steps=20, eval={"every_steps": 0}, checkpoint={"every_steps": 10, "keep": 2})
    for code, log in finish(start_cluster(job_dir, [spec, spec])):
        assert code == 0, log
    shutil.copytree(job_dir / "checkpoints", tmp_path / "older")
    longer = with_(spec, steps=40)
    for code, log in finish(start_cluster(job_dir, [longer, longer])):
        assert code == 0, log
    shutil.rmtree(job_dir / "checkpoints")
    shutil.copytree(tmp_path / "older", job_dir / "checkpoints")

    for code, log in finish(start_cluster(job_dir, [longer, longer])):
        assert code == 1, log
    chief, other = results(job_dir, 2)
    for result in (chief, other):
        assert result["outcome"] == "failed"
        assert result["message"].startswith("Cannot resume together: "), result
        assert "Keep more checkpoints (checkpoint.keep)" in result["message"], result
    says = "the newest checkpoint every worker has is step 20, and worker-1 no longer keeps it ("
    assert f"{says}its log says which steps it keeps). " in chief["message"], chief
    assert f"{says}this worker keeps [30, 40]). " in other["message"], other


def test_a_damaged_copy_on_one_worker_sends_every_worker_to_the_step_before(tmp_path):
    # Worker 1's newest checkpoint cut short (a save under way when its host went down):
    # it failed alone, and the chief restored step 20 and failed at its first step as
    # "Lost another worker ... Start every worker again", at every start.
    job_dir = tmp_path / "job"
    spec = with_(
        SPEC,
        steps=20,
        eval={"every_steps": 0},
        checkpoint={"every_steps": 10, "every_seconds": 0, "keep": 5},
    )
    for code, log in finish(start_cluster(job_dir, [spec, spec])):
        assert code == 0, log
    whole = variables(job_dir / "checkpoints" / "ckpt-20")
    other = job_dir / "workers" / "worker-1" / "checkpoints"
    os.truncate(other / "ckpt-20.data-00000-of-00001", 100)

    for code, log in finish(start_cluster(job_dir, [spec, spec])):
        assert code == 0, log
        assert "resumed from step 10" in log, log
    assert [r["step"] for r in results(job_dir, 2)] == [20, 20]
    assert sorted(p.name for p in (other / "damaged").iterdir()) == [
        "ckpt-20.data-00000-of-00001",
        "ckpt-20.index",
    ]
    assert not (job_dir / "checkpoints" / "damaged").exists(), "the chief's copy was whole"
    # Trained again from step 10, to the same step 20 (the spec is deterministic).
    for directory in (job_dir / "checkpoints", other):
        again = variables(directory / "ckpt-20")
        for name in whole:
            np.testing.assert_array_equal(again[name], whole[name], err_msg=name)


class Exchange:
    """`gather_rows` across worker threads of this process: every worker's values, one
    row a worker, once every worker has given its own. A worker that gathers when another
    does not (a collective more, or one fewer) breaks the barrier after 30 s, where it
    would hang a cluster."""

    def __init__(self, workers: int) -> None:
        self.rows: list[list[int]] = [[] for _ in range(workers)]
        self.barrier = threading.Barrier(workers, timeout=30)

    def gather(self, index: int) -> Callable[[list[int]], np.ndarray]:
        def gather(values: list[int]) -> np.ndarray:
            self.rows[index] = values
            self.barrier.wait()
            rows = np.array(self.rows, np.int64)
            self.barrier.wait()  # every worker has read them before any gives the next
            return rows

        return gather


def _checkpointer(directory: Path, trainer: TowerTrainer | None = None) -> Checkpointer:
    trainer = trainer or make_trainer(1)
    return Checkpointer(directory, trainer, iter(tf.data.Dataset.range(1)), CheckpointSpec(keep=10))


def _workers_checkpoints(tmp_path: Path, kept: list[list[int]]) -> list[Path]:
    """Each worker's checkpoints/ directory, holding the steps of `kept`."""
    directories = [tmp_path / f"worker-{i}" / "checkpoints" for i in range(len(kept))]
    trainer = make_trainer(1)
    for directory, steps in zip(directories, kept, strict=True):
        checkpointer = _checkpointer(directory, trainer)
        for step in steps:
            trainer.step.assign(step)  # what `restore` returns
            checkpointer.save(step)
    return directories


def _cut_short(directory: Path, step: int) -> None:
    os.truncate(directory / f"ckpt-{step}.data-00000-of-00001", 100)


def _start_together(
    directories: list[Path], tasks: list[Cluster] | None = None
) -> list[int | None | Exception]:
    """What `start_together` returns, or raises, on each worker (`tasks`: each one's place
    in the cluster; `worker` 0, 1, ... by default)."""
    count = len(directories)
    exchange = Exchange(count)
    checkpointers = [_checkpointer(directory) for directory in directories]
    tasks = tasks or [Cluster(workers=count, index=i, task_index=i) for i in range(count)]

    def worker(index: int) -> int | None | Exception:
        try:
            return start_together(exchange.gather(index), tasks[index], checkpointers[index])
        except Exception as e:  # noqa: BLE001 - the test reads it
            return e

    with ThreadPoolExecutor(len(directories)) as pool:
        return list(pool.map(worker, range(len(directories))))


def _listed(directory: Path) -> list[int]:
    """The steps `directory`'s state file lists."""
    state = tf.train.get_checkpoint_state(str(directory))
    return [int(path.rsplit("-", 1)[1]) for path in state.all_model_checkpoint_paths]


@pytest.mark.parametrize(
    ("damaged", "resumed"),
    [({1: [30]}, 20), ({0: [30], 1: [20]}, 10)],
    ids=["on-one-worker", "a-step-on-each"],
)
def test_start_together_goes_below_a_damaged_copy_on_every_worker(tmp_path, damaged, resumed):
    directories = _workers_checkpoints(tmp_path, [[10, 20, 30], [10, 20, 30]])
    for index, steps in damaged.items():
        for step in steps:
            _cut_short(directories[index], step)

    assert _start_together(directories) == [resumed, resumed]
    for index, directory in enumerate(directories):
        mine = sorted(damaged.get(index, []))
        aside = directory / "damaged"
        assert sorted(p.name for p in aside.glob("*")) == [
            f"ckpt-{s}.{part}" for s in mine for part in ("data-00000-of-00001", "index")
        ]
        assert _listed(directory) == [s for s in (10, 20, 30) if s not in mine]


def test_a_worker_whose_every_shared_copy_is_damaged_fails_every_worker_saying_whose(tmp_path):
    directories = _workers_checkpoints(tmp_path, [[10, 20, 30], [10, 20, 30]])
    for step in (10, 20, 30):
        _cut_short(directories[1], step)
    before = [sorted(p.name for p in directory.iterdir()) for directory in directories]

    chief, other = _start_together(directories)
    assert isinstance(chief, ClusterMismatch) and isinstance(other, ClusterMismatch)
    advice = (
        "Put back whole copies of the damaged checkpoints, or start the job in new "
        "directories to train from step 0."
    )
    assert str(chief) == (
        "Cannot resume together: no step every worker keeps reads whole on all of them "
        "(steps 30, 20, 10 are damaged on worker-1, its log says why), and no worker "
        f"keeps a checkpoint before step 10. {advice}"
    )
    assert str(other).startswith(
        "Cannot resume together: no step every worker keeps reads whole on all of them "
        "(this worker's checkpoints/ckpt-30 is damaged: "
    ), other
    assert "; this worker's checkpoints/ckpt-10 is damaged: " in str(other)
    assert str(other).endswith(f"), and no worker keeps a checkpoint before step 10. {advice}")
    # As on one host: with nothing restored, nothing is moved.
    assert [sorted(p.name for p in directory.iterdir()) for directory in directories] == before


@pytest.mark.parametrize(
    ("kept", "chief_says", "other_says"),
    [
        (
            [[10, 20, 30], [30]],
            [
                "(this worker's checkpoints/ckpt-30 is damaged: ",
                "), and worker-1 keeps no checkpoint before step 30 while worker-0 keeps up "
                "to step 20. ",
            ],
            [
                "(step 30 is damaged on worker-0, its log says why), and worker-1 keeps no "
                "checkpoint before step 30 while worker-0 keeps up to step 20. ",
            ],
        ),
        (
            [[10, 30], [20, 30]],
            [
                "the newest checkpoint every worker has before step 30 (damaged on worker-0) "
                "is step 10, and worker-1 no longer keeps it (its log says which steps it "
                "keeps). Keep more ",
            ],
            [
                "the newest checkpoint every worker has before step 30 (damaged on worker-0) "
                "is step 10, and worker-1 no longer keeps it (this worker keeps [20, 30]). "
                "Keep more ",
            ],
        ),
    ],
    ids=["none-left-on-one", "one-no-longer-keeps-the-step-below"],
)
def test_the_checks_of_the_first_step_hold_for_the_one_below_a_damaged_copy(
    tmp_path, kept, chief_says, other_says
):
    # The chief's copy of step 30 is damaged: they look below it, where worker 1 keeps none,
    # or not the step the chief has.
    directories = _workers_checkpoints(tmp_path, kept)
    _cut_short(directories[0], 30)

    chief, other = _start_together(directories)
    for error, says in ((chief, chief_says), (other, other_says)):
        assert isinstance(error, ClusterMismatch), error
        assert str(error).startswith("Cannot resume together: "), error
        for part in says:
            assert part in str(error), error
    assert not any((directory / "damaged").exists() for directory in directories)


def test_start_together_names_the_workers_whose_copies_are_damaged(tmp_path, caplog):
    # Step 30 damaged on workers 1 and 2, steps 20 and 10 on worker 2 alone: each worker
    # names the others' steps by worker, its own by file, and the chief logs where.
    directories = _workers_checkpoints(tmp_path, [[10, 20, 30]] * 3)
    _cut_short(directories[1], 30)
    for step in (10, 20, 30):
        _cut_short(directories[2], step)

    with caplog.at_level("WARNING", logger="trainer.multiworker"):
        chief, first, second = _start_together(directories)
    assert "step 30 is damaged on worker-1 and worker-2: every worker tries the step " in (
        caplog.text
    )
    end = "), and no worker keeps a checkpoint before step 10. Put back whole copies"
    assert str(chief) == (
        "Cannot resume together: no step every worker keeps reads whole on all of them (step 30 "
        "is damaged on worker-1 and worker-2, their logs say why; steps 20, 10 are damaged on "
        f"worker-2, its log says why{end} of the damaged checkpoints, or start the job in new "
        "directories to train from step 0."
    )
    assert "(this worker's checkpoints/ckpt-30 is damaged: " in str(first), first
    assert "; steps 30, 20, 10 are damaged on worker-2, its log says why" + end in str(first)
    assert "; step 30 is damaged on worker-1, its log says why" + end in str(second), second


def test_start_together_names_a_chief_task_and_the_worker_without_checkpoints(tmp_path):
    # TF_CONFIG with a `chief` task: its workers are `worker` 0 and 1 beside it.
    directories = _workers_checkpoints(tmp_path, [[10, 20], [], [10]])
    tasks = [
        Cluster(workers=3, index=0, task_type="chief", task_index=0),
        Cluster(workers=3, index=1, task_type="worker", task_index=0),
        Cluster(workers=3, index=2, task_type="worker", task_index=1),
    ]
    for error in _start_together(directories, tasks):
        assert str(error) == (
            "Cannot resume together: worker-0 keeps no checkpoint while chief-0 keeps up to "
            "step 20. Give every worker back its checkpoints/ directory to resume, or start "
            "the job in new directories to train from step 0."
        )


def test_a_worker_waiting_for_a_missing_peer_says_so_and_stops_on_sigterm(tmp_path):
    # The other worker never starts: the wait is logged with the address it waits for,
    # and a SIGTERM ends it as a cancel (TensorFlow's own wait would ignore it).
    job_dir = tmp_path / "job"
    workers = start_cluster(job_dir, [SPEC, SPEC])
    workers[1].proc.kill()
    waiting = workers[0].log
    deadline = time.monotonic() + 120
    while "waiting for the other tasks" not in waiting.read_text():
        assert workers[0].proc.poll() is None and time.monotonic() < deadline, waiting.read_text()
        time.sleep(0.1)
    time.sleep(1)
    workers[0].proc.send_signal(signal.SIGTERM)
    code, log = finish(workers[:1])[0]
    assert code == 3, log
    result = json.loads((job_dir / "result.json").read_text())
    assert result["outcome"] == "cancelled"
    assert "while waiting for the other tasks" in result["message"]


def test_a_worker_whose_port_is_taken_exits_2_naming_it(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        job_dir = tmp_path / "job"
        spec_file = tmp_path / "spec.json"
        spec_file.write_text(json.dumps(SPEC))
        tf_config = {
            "cluster": {"worker": [f"127.0.0.1:{port}", f"127.0.0.1:{free_ports(1)[0]}"]},
            "task": {"type": "worker", "index": 0},
        }
        proc = subprocess.run(
            [sys.executable, "-m", "trainer", "run", "--job-dir", str(job_dir)]
            + ["--spec", str(spec_file)],
            cwd=REPO,
            env={**os.environ, "TF_CONFIG": json.dumps(tf_config)},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 2, proc.stderr
    assert "cannot listen on this task's address (worker-0)" in proc.stderr
    assert f"127.0.0.1:{port}" in proc.stderr
    # No result.json: this could be a second worker 0 beside a running chief, whose
    # result.json it overwrote.
    assert not (job_dir / "result.json").exists()


def test_a_sigterm_while_the_cluster_forms_stops_every_worker(tmp_path):
    # Making the strategy starts TensorFlow's coordination service, which installs a
    # SIGTERM handler of its own: a SIGTERM then went to it and was lost, and both workers
    # trained to the end. Worker 0 is held in TensorFlow's wait for the cluster: worker 1's
    # port answers first from a stand-in listener, closed before the real worker 1 starts.
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    spec = with_(SPEC, steps=40, eval={"every_steps": 0})
    addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
    with socket.socket() as stand_in:
        stand_in.bind(("127.0.0.1", int(addresses[1].rpartition(":")[2])))
        stand_in.listen()
        chief = start_worker(job_dir, addresses, 0, spec)
        wait_for_line(chief, "every task of the cluster answered")
    # Into TensorFlow's wait: its coordination service (and its SIGTERM handler) starts
    # as the chief's agent connects, well within this.
    time.sleep(2)
    chief.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    other = start_worker(job_dir, addresses, 1, spec)
    for code, log in finish([chief, other]):
        assert code == 3, log
    for result in results(job_dir, 2):
        assert result["outcome"] == "cancelled", result
        assert result["step"] < 40, result


@contextlib.contextmanager
def _beside_a_stand_in(tmp_path: Path, index: int) -> Iterator[tuple[list[str], dict[str, str]]]:
    """The command and environment of task `index` of a 2-task cluster whose other task's
    port a stand-in program answers (for as long as this is entered), TensorFlow's bound on
    forming the cluster at 3 s; the job dir is `tmp_path / "job"`."""
    ports = free_ports(2)
    addresses = [f"127.0.0.1:{port}" for port in ports]
    tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(with_(SPEC, steps=4)))
    code = (
        "import sys\nimport trainer.multiworker\ntrainer.multiworker.FORM_SECONDS = 3\n"
        "from trainer.__main__ import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    args = [sys.executable, "-c", code, "run", "--job-dir", str(tmp_path / "job")]
    with socket.socket() as stand_in:
        stand_in.bind(("127.0.0.1", ports[1 - index]))
        stand_in.listen()
        yield args + ["--spec", str(spec_file)], {**os.environ, "TF_CONFIG": json.dumps(tf_config)}


@pytest.mark.parametrize("index", [0, 1], ids=["chief", "other-worker"])
def test_a_cluster_that_does_not_form_fails_in_bounded_time_saying_why(tmp_path, index):
    # Another program answers on the other task's port (or the task there died just after
    # it answered): this worker passes its wait for the others, then TensorFlow's wait
    # for the cluster held it for ever, deaf to SIGTERM. The chief hosts TensorFlow's
    # coordination service and the other worker registers with it: two ways to wait.
    with _beside_a_stand_in(tmp_path, index) as (args, env):
        started = time.monotonic()
        proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert time.monotonic() - started < 60
    job_dir = tmp_path / "job"
    own = job_dir if index == 0 else job_dir / "workers" / "worker-1"
    result = json.loads((own / "result.json").read_text())
    assert result["outcome"] == "failed"
    assert result["message"].startswith("The cluster did not form within 3 s"), result
    assert "DeadlineExceededError" in result["message"]
    assert "start every worker again" in result["message"]
    assert "forming the cluster in TensorFlow (for at most 3 s" in proc.stderr
    assert not (own / "checkpoints").exists()


def test_a_sigterm_while_the_cluster_forms_ends_the_job_cancelled(tmp_path):
    # Held while TensorFlow waits (it cannot be acted on there): once the wait ends, the
    # job is what was asked for, cancelled (exit 3), not failed as a cluster that did not form.
    with _beside_a_stand_in(tmp_path, 0) as (args, env):
        proc = subprocess.Popen(args, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if "forming the cluster in TensorFlow" in line:
                proc.send_signal(signal.SIGTERM)
                break
        rest = proc.communicate(timeout=120)[1]
    assert proc.returncode == 3, "".join(seen) + rest
    result = json.loads((tmp_path / "job" / "result.json").read_text())
    assert result["outcome"] == "cancelled", result
    assert result["message"].startswith("Stopped by SIGTERM while the cluster formed"), result


# A custom model whose layer keeps state of its own, updated in every training call: a
# running mean of its inputs and a count of its calls (no dropout: a cluster's towers and
# one machine's draw their masks differently).
STATEFUL = """
import keras
import tensorflow as tf

class RunningMean(keras.layers.Layer):
    def build(self, input_shape):
        self.mean = self.add_weight(shape=(input_shape[-1],), initializer="zeros", trainable=False)
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False, dtype="int64")

    def call(self, x, training=False):
        if training:
            self.mean.assign(0.5 * self.mean + 0.5 * tf.reduce_mean(x, 0))
            self.calls.assign_add(1)
        return x

def build(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    x = RunningMean(name="running")(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))
"""


def test_a_custom_layers_state_moves_in_a_cluster_as_on_two_towers(tmp_path):
    # Each worker's tower updates its own copy of the state; the step averages the copies
    # by the towers' shares, as one machine's two towers do: the same values, bit for bit,
    # and the count counts steps, not towers.
    spec = with_(
        SPEC,
        model={"name": "stateful:build"},
        steps=20,
        ema_decay=None,
        eval={"every_steps": 0, "batches": 1},
        summaries={
            "scalars_every": 10,
            "histograms_every": 0,
            "images_every": 0,
            "trace_steps": [],
        },
        checkpoint={"every_steps": 10, "every_seconds": 0, "keep": 2},
    )
    hosts = [tmp_path / "host-a", tmp_path / "host-b", tmp_path / "one"]
    for host in hosts:
        host.mkdir()
        (host / "stateful.py").write_text(STATEFUL)  # each worker imports its own
    code, _, log = run_worker(
        hosts[2] / "job", with_(spec, towers=2), env={"PYTHONPATH": f"{hosts[2]}:{REPO}"}
    )
    assert code == 0, log
    job_dir = tmp_path / "job"
    for code, log in finish(start_cluster(job_dir, [spec, spec], cwds=hosts[:2])):
        assert code == 0, log
    one = variables(hosts[2] / "job" / "checkpoints" / "ckpt-20")
    chief, worker = (variables(d / "checkpoints" / "ckpt-20") for d in worker_dirs(job_dir, 2))
    state = {name.split("/")[-3]: name for name in one if name.startswith("model/_operations/")}
    # model/_operations/2/mean/.ATTRIBUTES/VARIABLE_VALUE, and the Dense's kernel and bias
    assert {"mean", "calls"} <= state.keys(), sorted(one)
    for name in one:
        np.testing.assert_array_equal(chief[name], worker[name], err_msg=name)
        np.testing.assert_array_equal(chief[name], one[name], err_msg=name)
    assert int(one[state["calls"]]) == 20  # counted once a step


def test_a_strategys_towers_leave_a_custom_state_to_its_aggregation(caplog):
    # In-process, two towers of a MirroredStrategy on logical CPUs, as a cluster's: a state
    # of aggregation "none" is the step's to average, one of "only_first_replica" is the
    # strategy's (the first tower's value), and one of "sum" is said to go wrong.

    caplog.set_level(logging.WARNING, logger="trainer.multiworker")
    strategy = tf.distribute.MirroredStrategy(["/CPU:0", "/CPU:1"])
    one_device, alone_layer = running_mean_model()
    with strategy.scope():
        model, layer = running_mean_model()
        trainer = ClusterTrainer(
            strategy=strategy,
            model=model,
            optimizer=make_optimizer(OptimizerSpec(name="sgd", learning_rate=0.1)),
            parameter_device="/CPU:0",
        )
    alone = TowerTrainer(
        model=one_device,
        optimizer=make_optimizer(OptimizerSpec(name="sgd", learning_rate=0.1)),
        tower_devices=["/CPU:0"],
        parameter_device="/CPU:0",
    )
    assert [v.path for v in trainer._tower_state] == [layer.mean.path, layer.calls.path]
    for step in range(2):
        trainer.train_step(*batch(10, seed=step))  # shards of 5 and 5
        alone.train_step(*batch(10, seed=step))
    assert int(layer.calls.numpy()) == 2
    np.testing.assert_allclose(layer.mean.numpy(), alone_layer.mean.numpy(), atol=1e-6)
    first = batch(10, seed=1)[0][:5]
    assert float(layer.last.numpy()) == pytest.approx(float(first.mean()), rel=1e-6)
    [warning] = [r.getMessage() for r in caplog.records if "aggregation 'sum'" in r.getMessage()]
    assert warning.startswith(f"{layer.seen.path} has aggregation 'sum'"), warning
