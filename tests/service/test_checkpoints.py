"""Listing a run's checkpoints and streaming one as .tar.gz."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from service.checkpoints import find_checkpoint, list_checkpoints, open_archive
from trainer.rundir import RunDir


def _checkpoint(run: RunDir, step: int, shards: int = 1, size: int = 1000) -> None:
    run.checkpoints.mkdir(parents=True, exist_ok=True)
    (run.checkpoints / f"ckpt-{step}.index").write_bytes(b"i" * 10)
    for shard in range(shards):
        name = f"ckpt-{step}.data-{shard:05d}-of-{shards:05d}"
        (run.checkpoints / name).write_bytes(os.urandom(size))


def test_list_checkpoints_complete_only(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    _checkpoint(run, 10)
    _checkpoint(run, 20, shards=2)
    _checkpoint(run, 30, shards=2)
    (run.checkpoints / "ckpt-30.data-00001-of-00002").unlink()  # being written
    (run.checkpoints / "ckpt-40.index").write_bytes(b"i")  # no data yet
    (run.checkpoints / "checkpoint").write_text('model_checkpoint_path: "ckpt-20"\n')
    listed = list_checkpoints(run)
    assert [(c.step, c.size_bytes) for c in listed] == [(10, 1010), (20, 2010)]
    assert list_checkpoints(RunDir(tmp_path / "missing")) == []


def test_open_archive_survives_deletion_mid_download(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    _checkpoint(run, 10, shards=2, size=600_000)
    checkpoint = find_checkpoint(run, 10)
    assert checkpoint is not None
    stream = open_archive(checkpoint, b'{"name": "j"}\n')
    assert stream is not None
    for path in checkpoint.files:  # CheckpointManager drops it as the download starts
        path.unlink()
    data = b"".join(stream)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        members = {m.name: archive.extractfile(m).read() for m in archive.getmembers()}  # type: ignore[union-attr]
    assert sorted(members) == [
        "checkpoint", "ckpt-10.data-00000-of-00002", "ckpt-10.data-00001-of-00002",
        "ckpt-10.index", "spec.json",
    ]  # fmt: skip
    assert len(members["ckpt-10.data-00001-of-00002"]) == 600_000
    assert members["checkpoint"] == (
        b'model_checkpoint_path: "ckpt-10"\nall_model_checkpoint_paths: "ckpt-10"\n'
    )
    assert members["spec.json"] == b'{"name": "j"}\n'


def test_list_checkpoints_skips_symlinks(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.checkpoints.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.write_bytes(b"secret")
    (run.checkpoints / "ckpt-5.index").symlink_to(outside)
    (run.checkpoints / "ckpt-5.data-00000-of-00001").symlink_to(outside)
    assert list_checkpoints(run) == []
