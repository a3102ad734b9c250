"""A worker's preparation as progress lines (`trainer.preparing`): the stages, how far a
data check and load are through its files, how far a restore has read its checkpoint, at
most a line a second, and a real worker's lines."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.tfrecords import write_tfrecord
from tests.trainer.progress_lines import progress_lines
from trainer.data import DataError, load_arrays
from trainer.preparing import (
    BUILDING,
    CHECKING,
    IMPORTING,
    JOINING,
    LOADING,
    RESTORING,
    Preparation,
    read_bytes,
)
from trainer.rundir import RunDir
from trainer.spec import DataSpec

REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines_of(folder: Path) -> list[tuple[str, int | None, int | None]]:
    lines = progress_lines(folder / "progress.jsonl")
    assert all(line["event"] == "phase" and line["phase"] == "preparing" for line in lines)
    return [(line["stage"], line.get("stage_done"), line.get("stage_total")) for line in lines]


def test_a_stages_amounts_are_said_at_most_once_a_second_and_as_it_ends(tmp_path: Path) -> None:
    clock = Clock()
    preparation = Preparation(RunDir(tmp_path), clock=clock)
    preparation.stage(IMPORTING)
    preparation.amount(1, 10)  # the stage's first amounts: at once, though 0 s have passed
    for done in range(2, 10):  # a call a piece: none said within the second
        clock.now += 0.1
        preparation.amount(done, 10)
    clock.now += 0.25  # over a second after the last line
    preparation.amount(9, 10)  # the same as the last call: said, as the last line was of 1
    clock.now += 0.1
    preparation.amount(10, 10)  # through: at once
    preparation.amount(10, 10)  # said already
    preparation.stage(LOADING, 0, 5)
    preparation.amount(1, 5)  # within the second of the stage's line, which had amounts
    preparation.stage(BUILDING)
    assert lines_of(tmp_path) == [
        (IMPORTING, None, None),
        (IMPORTING, 1, 10),
        (IMPORTING, 9, 10),
        (IMPORTING, 10, 10),
        (LOADING, 0, 5),
        (BUILDING, None, None),
    ]


def test_a_line_that_cannot_be_written_gives_up_the_rest_without_failing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A full disk, a read-only run dir: the load goes on; its `start` line says the rest.
    (tmp_path / "progress.jsonl").mkdir()
    preparation = Preparation(RunDir(tmp_path))
    preparation.stage(IMPORTING)
    preparation.stage(LOADING, 0, 10)
    preparation.amount(10, 10)
    preparation.close()
    warnings = [r.message for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "could not write the preparation's progress lines" in warnings[0]


def write_idx(path: Path, array: np.ndarray, gz: bool = False) -> None:
    head = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    with (gzip.open if gz else open)(path, "wb") as f:
        f.write(head + array.tobytes())


def data_set(folder: Path, fmt: str, files: int = 3, per_file: int = 300) -> DataSpec:
    """`files` train files of `per_file` 8x8 images each, in `fmt` (IDX pairs gzip'd)."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(files):
        x = rng.integers(0, 256, (per_file, 8, 8), np.uint8)
        y = rng.integers(0, 4, per_file).astype(np.uint8)
        if fmt == "npz":
            np.savez(folder / f"part-{i}.npz", x=x, y=y)
        elif fmt == "idx":
            write_idx(folder / f"part{i}-images-idx3-ubyte.gz", x, gz=True)
            write_idx(folder / f"part{i}-labels-idx1-ubyte.gz", y, gz=True)
        else:
            write_tfrecord(folder / f"part-{i}.tfrecord", x[..., None], y)
    return DataSpec(format=fmt, path=str(folder))


@pytest.mark.parametrize("fmt", ["npz", "idx", "tfrecord"])
def test_a_load_says_each_file_it_has_read_of_the_files_bytes(tmp_path: Path, fmt: str) -> None:
    """Lines as often as the load tells them (no second between them here): the bytes of
    the files, on disk, from 0 to the whole, each file's own counted once it is read; then
    the join of their examples, bytes of their images."""
    spec = data_set(tmp_path / "data", fmt)
    sizes = [file.stat().st_size for file in sorted((tmp_path / "data").iterdir())]
    run = tmp_path / "run"
    arrays = load_arrays(spec, 0, Preparation(RunDir(run), every=0))
    lines = lines_of(run)
    # TFRecord files are walked first, every one, each record header (`checking data`).
    checking = [(done, total) for stage, done, total in lines if stage == CHECKING]
    loading = [(done, total) for stage, done, total in lines if stage == LOADING]
    joining = [(done, total) for stage, done, total in lines if stage == JOINING]
    assert [stage for stage, _, _ in lines] == (
        [CHECKING] * len(checking) + [LOADING] * len(loading) + [JOINING] * len(joining)
    )
    assert bool(checking) == (fmt == "tfrecord")
    total = sum(sizes)
    # Each file, once read (an IDX pair: its images, then its labels file).
    ends = set(np.cumsum(sizes).tolist())
    for amounts in (checking, loading) if checking else (loading,):
        assert amounts[0] == (0, total) and amounts[-1] == (total, total)
        assert all(of == total for _, of in amounts)
        done = [d or 0 for d, _ in amounts]  # each a count (the first line's checked above)
        assert done == sorted(done)
        assert ends <= set(done), (ends, done)
    images = (arrays.num_train + arrays.num_eval) * 8 * 8  # uint8: a byte a pixel
    assert joining[0] == (0, images) and joining[-1] == (images, images)


def test_a_load_of_one_file_joins_nothing(tmp_path: Path) -> None:
    spec = data_set(tmp_path / "data", "npz", files=1)
    load_arrays(spec, 0, Preparation(RunDir(tmp_path / "run"), every=0))
    size = (tmp_path / "data" / "part-0.npz").stat().st_size
    assert lines_of(tmp_path / "run")[0] == (LOADING, 0, size)
    assert {stage for stage, _, _ in lines_of(tmp_path / "run")} == {LOADING}


def random_tfrecord(path: Path, count: int = 3000) -> Path:
    """`count` records of 32x32 noise: a file of about 3 MiB, gzip'd or not, which the walk
    reads in several 1 MiB pieces (and a gzip'd one's inflation in several reads)."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (count, 32, 32, 1), np.uint8)
    return write_tfrecord(path, x, rng.integers(0, 4, count).tolist())


@pytest.mark.parametrize("name", ["a.tfrecord", "a.tfrecord.gz"])
def test_the_walk_of_a_tfrecord_file_says_how_far_it_is_inside_the_file(
    tmp_path: Path, name: str
) -> None:
    """From inside the walk, not a file at a time: the bytes of the file it has reached
    (a gzip'd one's compressed bytes), between 0 and the file's size, rising."""
    (tmp_path / "data").mkdir()
    size = random_tfrecord(tmp_path / "data" / name).stat().st_size
    assert size > 2 * 2**20
    run = tmp_path / "run"
    load_arrays(
        DataSpec(format="tfrecord", path=str(tmp_path / "data")),
        0,
        Preparation(RunDir(run), every=0),
    )
    checking = [(done, total) for stage, done, total in lines_of(run) if stage == CHECKING]
    assert checking[0] == (0, size) and checking[-1] == (size, size)
    done = [d or 0 for d, _ in checking]
    assert done == sorted(done)
    assert any(0 < d < size for d in done), done  # moved within the file


def test_a_damaged_last_tfrecord_file_fails_before_any_file_is_loaded(tmp_path: Path) -> None:
    """Every file walked before the first is loaded: the job fails at once, not after
    minutes of loading the files before the damaged one."""
    spec = data_set(tmp_path / "data", "tfrecord")
    last = tmp_path / "data" / "part-2.tfrecord"
    last.write_bytes(last.read_bytes() + bytes(5))  # ends inside a record's header
    run = tmp_path / "run"
    with pytest.raises(DataError, match=r"then 5 bytes that are no whole record .*part-2"):
        load_arrays(spec, 0, Preparation(RunDir(run), every=0))
    lines = lines_of(run)
    assert {stage for stage, _, _ in lines} == {CHECKING}  # no `loading data` line
    sizes = [(tmp_path / "data" / f"part-{i}.tfrecord").stat().st_size for i in range(3)]
    # The first two walked whole, then the third to its end.
    assert (sizes[0] + sizes[1], sum(sizes)) in [(d, t) for _, d, t in lines]


def test_a_tfrecord_file_changed_after_its_walk_is_walked_again(tmp_path: Path) -> None:
    """The walk vouches for the file it walked: one changed between its walk and its load
    (size or time) is walked again before TensorFlow reads it."""
    import trainer.data as data

    path = random_tfrecord(tmp_path / "a.tfrecord", 10)
    framed = data._framed(path)
    assert framed.records == 10
    assert data._read_tfrecord(path, framed=framed) is not None
    path.write_bytes(path.read_bytes() + bytes(5))
    with pytest.raises(DataError, match="then 5 bytes that are no whole record"):
        data._read_tfrecord(path, framed=framed)


def test_a_stages_reads_are_said_as_the_process_reads(tmp_path: Path) -> None:
    """`reads`: the bytes this process reads while the body runs, sampled by a thread,
    up to the total, and the total once the body is through."""
    if read_bytes() is None:
        pytest.skip("no /proc/self/io here")
    big = tmp_path / "big"
    big.write_bytes(os.urandom(8 * 2**20))
    run = tmp_path / "run"
    preparation = Preparation(RunDir(run), every=0.01)
    with preparation.reads(RESTORING, 8 * 2**20), big.open("rb", buffering=0) as file:
        while file.read(2**20):
            time.sleep(0.03)  # a few samples a piece
    amounts = [(done, total) for stage, done, total in lines_of(run) if stage == RESTORING]
    assert amounts[0] == (0, 8 * 2**20) and amounts[-1] == (8 * 2**20, 8 * 2**20)
    done = [d or 0 for d, _ in amounts]
    assert done == sorted(done) and any(0 < d < 8 * 2**20 for d in done), done
    # Within a piece of what was read (and the few bytes the samples read of /proc).
    assert {d // 2**20 for d in done[1:-1]} <= set(range(1, 9)) | {0}


def test_a_stages_reads_that_fail_end_without_their_total(tmp_path: Path) -> None:
    run = tmp_path / "run"
    preparation = Preparation(RunDir(run), every=0.01)
    with pytest.raises(OSError), preparation.reads(RESTORING, 2**30):
        raise OSError("a torn checkpoint")
    amounts = [(done, total) for stage, done, total in lines_of(run) if stage == RESTORING]
    assert amounts[0] == (0, 2**30) and (2**30, 2**30) not in amounts


def test_a_stages_reads_where_the_count_is_unreadable_say_no_amounts(tmp_path: Path) -> None:
    run = tmp_path / "run"
    preparation = Preparation(RunDir(run), every=0.01)
    with preparation.reads(RESTORING, 100, io=tmp_path / "no-such-file"):
        time.sleep(0.05)
    assert lines_of(run) == [(RESTORING, None, None)]


def checkpointer(folder: Path, reading: Any = None) -> Any:
    """A `trainer.checkpoints.Checkpointer` of a small model trained one step, saving to
    `folder / "ckpt"` (TensorFlow imported here: the other tests need none)."""
    import tensorflow as tf

    from tests.trainer.test_towers import batch, make_trainer
    from trainer.checkpoints import Checkpointer
    from trainer.spec import CheckpointSpec

    trainer = make_trainer(1)
    trainer.train_step(*batch(16))
    data = iter(tf.data.Dataset.range(1))
    spec = CheckpointSpec(every_steps=1, keep=5)
    return Checkpointer(folder / "ckpt", trainer, data, spec, reading=reading)


def test_a_restore_says_its_checkpoints_bytes_read_and_starts_again_for_an_older_one(
    tmp_path: Path,
) -> None:
    """A real restore (`Checkpointer`, a small model): its stage in the bytes of the
    checkpoint's data files, from 0 to their whole; a damaged newest one tried first ends
    without its total, and the one before it is said from 0 of its own."""
    if read_bytes() is None:
        pytest.skip("no /proc/self/io here")
    saving = checkpointer(tmp_path)
    saving.save(1)
    saving.save(2)
    sizes = {
        step: sum(p.stat().st_size for p in (tmp_path / "ckpt").glob(f"ckpt-{step}.data-*"))
        for step in (1, 2)
    }
    os.truncate(tmp_path / "ckpt" / "ckpt-2.data-00000-of-00001", sizes[2] // 2)
    run = tmp_path / "run"
    preparation = Preparation(RunDir(run), every=0.001)
    restoring = checkpointer(tmp_path, lambda total: preparation.reads(RESTORING, total))
    assert restoring.restore_latest() == 1
    amounts = [(done, total) for stage, done, total in lines_of(run) if stage == RESTORING]
    newest, older = sizes[2] // 2, sizes[1]
    assert amounts[0] == (0, newest)
    again = amounts.index((0, older))  # its own stage line, from 0
    assert all(total == newest for _, total in amounts[:again])
    assert all(total == older for _, total in amounts[again:])
    assert amounts[-1] == (older, older)
    done = [d or 0 for d, _ in amounts[again:]]
    assert done == sorted(done)


def test_a_restore_is_said_through_only_once_it_has_returned(tmp_path: Path) -> None:
    """A real restore reads more than its checkpoint's data files (their total): its index
    too, more than once. The count reached the total before the restore was through, and
    the stage said 100% early; it is held under the total until the restore returns."""
    if read_bytes() is None:
        pytest.skip("no /proc/self/io here")
    from trainer.checkpoints import data_bytes

    checkpointer(tmp_path).save(1)
    total = data_bytes(str(tmp_path / "ckpt" / "ckpt-1"))
    run = tmp_path / "run"
    preparation = Preparation(RunDir(run), every=0.001)
    read: list[int] = []
    during: list[tuple[str, int | None, int | None]] = []

    @contextlib.contextmanager
    def reading(total: int) -> Iterator[None]:
        before = read_bytes()
        with preparation.reads(RESTORING, total):
            yield  # the restore
            after = read_bytes()
            assert before is not None and after is not None
            read.append(after - before)
            # The restore's reads are done; its stage is not: samples are taken meanwhile.
            time.sleep(0.1)
            during.extend(lines_of(run))

    assert checkpointer(tmp_path, reading).restore_latest() == 1
    assert read[0] > total  # the premise: the count runs past the data files' bytes
    amounts = [(done, of) for stage, done, of in lines_of(run) if stage == RESTORING]
    said = [(done, of) for stage, done, of in during if stage == RESTORING]
    assert said[0] == (0, total) and len(said) > 1, said  # sampled while it ran
    assert all(done is not None and done < total for done, _ in said), said
    assert amounts == [*said, (total, total)]  # through once the restore has returned


def test_synthetic_data_is_a_stage_without_amounts(tmp_path: Path) -> None:
    load_arrays(DataSpec(format="synthetic"), 0, Preparation(RunDir(tmp_path)))
    assert lines_of(tmp_path) == [(LOADING, None, None)]


def run_worker(job_dir: Path, spec: dict) -> subprocess.CompletedProcess[str]:
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "spec.json").write_text(json.dumps(spec))
    return subprocess.run(
        [sys.executable, "-m", "trainer", "run", "--job-dir", str(job_dir)],
        cwd=REPO,
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_worker_says_each_stage_of_its_preparation_and_how_far_its_load_is(
    tmp_path: Path,
) -> None:
    """A real worker on three .npz files: its lines before `start` name each stage, the
    load's from 0 to the files' bytes, the join's to their images'; its resume restores."""
    spec_data = data_set(tmp_path / "data", "npz")
    total = sum(file.stat().st_size for file in (tmp_path / "data").iterdir())
    spec = {
        "name": "prepared",
        "model": {"name": "mlp", "params": {"hidden": [8]}},
        "data": spec_data.model_dump(mode="json", exclude_defaults=True),
        "towers": 1,
        "batch_size": 32,
        "steps": 2,
        "eval": {"every_steps": 0},
        "summaries": {"trace_steps": [], "histograms_every": 0, "images_every": 0},
    }
    job_dir = tmp_path / "job"
    first = run_worker(job_dir, spec)
    assert first.returncode == 0, first.stderr
    lines = progress_lines(job_dir / "progress.jsonl")
    start = next(i for i, line in enumerate(lines) if line["event"] == "start")
    preparing = lines[:start]
    assert all(line["event"] == "phase" and line["phase"] == "preparing" for line in preparing)
    stages = [line["stage"] for line in preparing]
    assert list(dict.fromkeys(stages)) == [IMPORTING, LOADING, JOINING, BUILDING]

    def amounts(stage: str) -> list[tuple[int, int]]:
        return [
            (line["stage_done"], line["stage_total"])
            for line in preparing
            if line["stage"] == stage
        ]

    loading, joining = amounts(LOADING), amounts(JOINING)
    assert loading[0] == (0, total) and loading[-1] == (total, total)
    images = 3 * 300 * 8 * 8  # the train and held-out examples of the three files
    assert joining[0] == (0, images) and joining[-1] == (images, images)
    # At most a line a second between a stage's first and its last (a load of
    # milliseconds says those two alone).
    for stage in (LOADING, JOINING):
        times = [line["time"] for line in preparing if line["stage"] == stage][:-1]
        assert all(b - a >= 0.9 for a, b in zip(times, times[1:], strict=False)), (stage, times)
    assert not any(key.startswith("stage") for key in lines[start])

    # Trained on: its worker restores the checkpoint, and says how far it has read it.
    ckpt_bytes = sum(p.stat().st_size for p in (job_dir / "checkpoints").glob("ckpt-2.data-*"))
    assert ckpt_bytes > 0
    again = run_worker(job_dir, {**spec, "steps": 4})
    assert again.returncode == 0, again.stderr
    lines = progress_lines(job_dir / "progress.jsonl")
    starts = [i for i, line in enumerate(lines) if line["event"] == "start"]
    assert len(starts) == 2
    resumed = [line["stage"] for line in lines[starts[0] : starts[1]] if "stage" in line]
    assert list(dict.fromkeys(resumed)) == [IMPORTING, LOADING, JOINING, BUILDING, RESTORING]
    assert lines[starts[1] - 1]["stage"] == RESTORING  # up to the start line
    restoring = [
        (line.get("stage_done"), line.get("stage_total"))
        for line in lines[starts[0] : starts[1]]
        if line.get("stage") == RESTORING
    ]
    if read_bytes() is not None:  # Linux: the process's count of bytes read
        # The stage's first line has its total: no bare line before it (a cluster's alone
        # says the stage as its workers agree on the checkpoint).
        assert restoring[0] == (0, ckpt_bytes)
        assert restoring[-1] == (ckpt_bytes, ckpt_bytes)
        assert all(total == ckpt_bytes for _, total in restoring)


def test_a_join_of_files_of_two_dtypes_counts_the_float_images_it_copies(tmp_path: Path) -> None:
    """Files of uint8 and of float32 images are joined as float32 (the uint8 ones cast
    first): the join's total is the bytes it copies, so it is not through before it is.
    Counted in the uint8 files' own bytes, it said 96,000 of 96,000 a quarter into the
    second file and held there, its lines' amounts clamped to a total they ran past."""
    folder = tmp_path / "data"
    folder.mkdir()
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (300, 8, 8), np.uint8)
    np.savez(folder / "part-0.npz", x=x, y=rng.integers(0, 4, 300).astype(np.uint8))
    floats = (rng.integers(0, 256, (300, 8, 8)) / 255).astype(np.float32)
    np.savez(folder / "part-1.npz", x=floats, y=rng.integers(0, 4, 300).astype(np.uint8))
    run = tmp_path / "run"
    load_arrays(DataSpec(format="npz", path=str(folder)), 0, Preparation(RunDir(run), every=0))
    joining = [(done, total) for stage, done, total in lines_of(run) if stage == JOINING]
    images = 2 * 300 * 8 * 8 * 4  # both files' images, as float32
    assert joining == [(0, images), (images // 2, images), (images, images)]
