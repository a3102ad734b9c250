"""Listing a run's checkpoints and streaming one as .tar.gz."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

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
    archive = open_archive(checkpoint, b'{"name": "j"}\n')
    assert archive is not None
    for path in checkpoint.files:  # CheckpointManager drops it as the download starts
        path.unlink()
    data = b"".join(archive.chunks)
    assert len(data) == archive.size
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
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


@pytest.mark.parametrize(
    "data_size",
    [
        0,
        1000,
        300_000,  # more than one read chunk
        # The tar comes to exactly 512 stored blocks of 65,535 bytes: no short last block.
        65_535 * 512 - 7 * 512 - 1024,
    ],
)
def test_open_archive_size_is_exact_and_gunzips(tmp_path: Path, data_size: int) -> None:
    run = RunDir(tmp_path / "run")
    _checkpoint(run, 7, size=data_size)
    checkpoint = find_checkpoint(run, 7)
    assert checkpoint is not None
    archive = open_archive(checkpoint, b"{}\n")
    assert archive is not None
    data = b"".join(archive.chunks)
    assert len(data) == archive.size  # sent as Content-Length: a byte off hangs or cuts it
    path = tmp_path / "ckpt.tar.gz"
    path.write_bytes(data)
    # The system's own gzip and tar read it, trailer (CRC and length) included.
    assert subprocess.run(["gzip", "--test", str(path)], capture_output=True).returncode == 0
    listing = subprocess.run(["tar", "-tzf", str(path)], capture_output=True, text=True, check=True)
    assert listing.stdout.split() == [
        "ckpt-7.index", "ckpt-7.data-00000-of-00001", "checkpoint", "spec.json",
    ]  # fmt: skip
    with tarfile.open(path, mode="r:gz") as tar:
        member = tar.extractfile("ckpt-7.data-00000-of-00001")
        assert member is not None
        assert member.read() == (run.checkpoints / "ckpt-7.data-00000-of-00001").read_bytes()


def test_open_archive_shrunk_file_ends_stream_short(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    _checkpoint(run, 3, size=400_000)
    checkpoint = find_checkpoint(run, 3)
    assert checkpoint is not None
    archive = open_archive(checkpoint, b"{}\n")
    assert archive is not None
    os.truncate(checkpoint.files[1], 1000)  # cut in place: the open file shrinks too
    with pytest.raises(OSError, match="ckpt-3.data-00000-of-00001 shrank"):
        b"".join(archive.chunks)
