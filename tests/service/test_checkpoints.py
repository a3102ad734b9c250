"""Listing a run's checkpoints and streaming one as .tar.gz: whole, or any byte range of
it, the same bytes for the same files every time."""

from __future__ import annotations

import io
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from service import archives
from service.archives import Archive
from service.checkpoints import (
    Checkpoint,
    describe_archive,
    list_checkpoints,
    open_archive,
)
from service.exports import describe_export, open_export
from tests.service.harness import fake_index
from trainer.rundir import RunDir


def find_checkpoint(run: RunDir, step: int) -> Checkpoint | None:
    """The retained checkpoint of `step`, as the download route picks it."""
    return next((c for c in list_checkpoints(run) if c.step == step), None)


def _checkpoint(run: RunDir, step: int, shards: int = 1, size: int = 1000) -> None:
    run.checkpoints.mkdir(parents=True, exist_ok=True)
    (run.checkpoints / f"ckpt-{step}.index").write_bytes(fake_index(10))
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


def test_list_checkpoints_reads_again_a_read_torn_by_a_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A directory read is no snapshot. With `keep: 1`, a read while TensorFlow saved back
    # to back missed both the new checkpoint's index (created while it read) and the old
    # one's (deleted meanwhile) about once in 20,000 reads: the listing was empty, and
    # `latest` answered 404 in CI. That read is rare, so this one is made: the first read
    # misses ckpt-10's index; later reads are the real directory's.
    run = RunDir(tmp_path / "run")
    _checkpoint(run, 10)
    (run.checkpoints / "ckpt-5.data-00000-of-00001").write_bytes(b"d")  # its index went
    real_scandir = os.scandir
    reads: list[list[str]] = []

    def scandir(path: Path) -> list[os.DirEntry[str]]:
        entries = [e for e in real_scandir(path) if not (e.name == "ckpt-10.index" and not reads)]
        reads.append(sorted(e.name for e in entries))
        return entries

    monkeypatch.setattr(os, "scandir", scandir)
    assert [c.step for c in list_checkpoints(run)] == [10]
    assert reads == [
        ["ckpt-10.data-00000-of-00001", "ckpt-5.data-00000-of-00001"],
        ["ckpt-10.data-00000-of-00001", "ckpt-10.index", "ckpt-5.data-00000-of-00001"],
    ]
    # Only a torn save's leftovers: read a few times, then listed as none.
    for name in ("ckpt-10.index", "ckpt-10.data-00000-of-00001"):
        (run.checkpoints / name).unlink()
    reads.clear()
    assert list_checkpoints(run) == []
    assert len(reads) == 3
    # No checkpoint file at all: one read.
    (run.checkpoints / "ckpt-5.data-00000-of-00001").unlink()
    reads.clear()
    assert list_checkpoints(run) == []
    assert len(reads) == 1


def test_list_checkpoints_reads_again_when_a_save_deleted_what_it_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With `keep: 1`, a read that saw only ckpt-5, whose files the save of ckpt-10 deleted
    # before they were looked at, was taken for a read of no checkpoint and not read again:
    # `latest` answered 404 (7 reads in 387,000 while TensorFlow saved back to back). That
    # save is made here, between the directory read and the look at its files.
    run = RunDir(tmp_path / "run")
    _checkpoint(run, 5)
    real_scandir = os.scandir
    reads: list[list[str]] = []

    def scandir(path: Path) -> list[os.DirEntry[str]]:
        entries = list(real_scandir(path))
        reads.append(sorted(e.name for e in entries))
        if len(reads) == 1:
            _checkpoint(run, 10)
            for name in ("ckpt-5.index", "ckpt-5.data-00000-of-00001"):
                (run.checkpoints / name).unlink()
        return entries

    monkeypatch.setattr(os, "scandir", scandir)
    assert [c.step for c in list_checkpoints(run)] == [10]
    assert reads == [
        ["ckpt-5.data-00000-of-00001", "ckpt-5.index"],
        ["ckpt-10.data-00000-of-00001", "ckpt-10.index"],
    ]


def test_list_checkpoints_leaves_out_an_index_being_written(tmp_path: Path) -> None:
    # TensorFlow renames a save's data shards into place whole, then writes its index in
    # place, under its final name (strace: openat(O_TRUNC), writes, close). A read in
    # between found ckpt-N with its data and an index of 0 bytes, or of part of them, listed
    # it, and `latest` served it, which does not restore: 1 read in 200 while TensorFlow
    # saved back to back. These are the files as such a read finds them, on disk.
    run = RunDir(tmp_path / "run")
    _checkpoint(run, 5)
    _checkpoint(run, 10)
    index = run.checkpoints / "ckpt-10.index"
    whole = index.read_bytes()
    for written in (b"", whole[:4], whole[:-1]):
        index.write_bytes(written)
        assert [c.step for c in list_checkpoints(run)] == [5], written
    index.write_bytes(whole)
    assert [(c.step, c.size_bytes) for c in list_checkpoints(run)] == [(5, 1010), (10, 1010)]
    # The first save's index, half written: no checkpoint yet.
    for name in ("ckpt-5.index", "ckpt-5.data-00000-of-00001"):
        (run.checkpoints / name).unlink()
    index.write_bytes(whole[:-1])
    assert list_checkpoints(run) == []


def test_open_archive_survives_deletion_mid_download(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    _checkpoint(run, 10, shards=2, size=600_000)
    checkpoint = find_checkpoint(run, 10)
    assert checkpoint is not None
    archive = open_archive(checkpoint, b'{"name": "j"}\n')
    assert archive is not None
    for path in checkpoint.files:  # CheckpointManager drops it as the download starts
        path.unlink()
    data = b"".join(archive.stream())
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


def test_open_archive_adds_data_json_where_given_and_its_etag_follows_it(tmp_path: Path) -> None:
    # A job whose worker has not loaded its data yet (a ckpt-0 of a stop during start-up)
    # has no data.json; once it has, the same checkpoint's archive is another download.
    run = RunDir(tmp_path / "run")
    _checkpoint(run, 10)
    checkpoint = find_checkpoint(run, 10)
    assert checkpoint is not None
    data = b'{"classes": 10, "image_shape": [28, 28, 1]}\n'
    without = describe_archive(checkpoint, b"{}")
    archive = open_archive(checkpoint, b"{}", data)
    assert archive is not None and without is not None
    head = describe_archive(checkpoint, b"{}", data)
    assert head is not None and (head.size, head.etag) == (archive.size, archive.etag)
    assert head.etag != without.etag
    with tarfile.open(fileobj=io.BytesIO(b"".join(archive.stream())), mode="r:gz") as tar:
        assert tar.getnames()[-2:] == ["spec.json", "data.json"]
        assert tar.extractfile("data.json").read() == data  # type: ignore[union-attr]


def test_list_checkpoints_leaves_out_an_index_it_cannot_read(tmp_path: Path) -> None:
    # A file the service cannot open (root opens a chmod-000 one, so a folder in its
    # place stands in): it could not be served, and a job's status lists the checkpoints.
    run = RunDir(tmp_path / "run")
    _checkpoint(run, 10)
    (run.checkpoints / "ckpt-20.index").mkdir()
    (run.checkpoints / "ckpt-20.data-00000-of-00001").write_bytes(b"d")
    assert [c.step for c in list_checkpoints(run)] == [10]


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
    data = b"".join(archive.stream())
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
        b"".join(archive.stream())


def _opened(run: RunDir, step: int, spec: bytes = b"{}\n") -> Archive:
    checkpoint = find_checkpoint(run, step)
    assert checkpoint is not None
    archive = open_archive(checkpoint, spec)
    assert archive is not None
    return archive


# Sizes around the stored blocks (65,535 bytes) and the read chunk (256 KiB): one block,
# several read chunks, and a tar of exactly 512 whole blocks.
@pytest.mark.parametrize("data_size", [1000, 700_000, 65_535 * 512 - 7 * 512 - 1024])
def test_stream_of_any_range_is_that_slice_of_the_whole(tmp_path: Path, data_size: int) -> None:
    run = RunDir(tmp_path / "run")
    _checkpoint(run, 5, size=data_size)
    whole = b"".join(_opened(run, 5).stream())
    size = len(whole)
    block = 65_535 + 5
    starts = {0, 1, 9, 10, 11, 14, 15, 16, block + 10, block + 9, 3 * block + 17, size // 2}
    starts |= {size - 9, size - 8, size - 7, size - 1}
    for start in sorted(s for s in starts if 0 <= s < size):
        # To the end (a resume: the trailer's CRC needs every byte before), and short of the
        # trailer (the bytes before `start` are then skipped unread).
        for stop in sorted({size, size - 8, start + 1, start + 70_000, size - 1}):
            if start < stop <= size:
                part = b"".join(_opened(run, 5).stream(start, stop))
                assert part == whole[start:stop], (start, stop)


def test_archive_bytes_come_from_the_files_alone(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    _checkpoint(run, 8, shards=2, size=3000)
    for path in run.checkpoints.iterdir():
        os.utime(path, ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    first = b"".join(_opened(run, 8).stream())
    assert first[4:8] == b"\0\0\0\0"  # the gzip header holds no time
    with tarfile.open(fileobj=io.BytesIO(first), mode="r:gz") as tar:
        members = tar.getmembers()
    # The members the service makes up take the files' time, not the time of the request.
    assert {m.name: m.mtime for m in members} == {
        "ckpt-8.index": 1_600_000_000, "ckpt-8.data-00000-of-00002": 1_600_000_000,
        "ckpt-8.data-00001-of-00002": 1_600_000_000, "checkpoint": 1_600_000_000,
        "spec.json": 1_600_000_000,
    }  # fmt: skip
    assert {(m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {(0, 0, "", "", 0o644)}
    assert b"".join(_opened(run, 8).stream()) == first


def test_etag_follows_the_files(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    _checkpoint(run, 9, size=2000)
    tag = _opened(run, 9).etag
    assert re.fullmatch(r'"[0-9a-f]{32}"', tag)
    assert _opened(run, 9).etag == tag
    assert _opened(run, 9, spec=b'{"name": "other"}\n').etag != tag
    data = run.checkpoints / "ckpt-9.data-00000-of-00001"
    stat = data.stat()
    data.write_bytes(os.urandom(2000))  # same size, rewritten
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert _opened(run, 9).etag != tag


def test_head_stats_and_opens_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = RunDir(tmp_path / "run")
    _checkpoint(run, 4, shards=3, size=5000)
    (run.export / "variables").mkdir(parents=True)
    (run.export / "saved_model.pb").write_bytes(b"pb" * 100)
    (run.export / "variables" / "variables.index").write_bytes(b"v" * 30)
    run.result.write_text('{"outcome": "succeeded"}')
    checkpoint = find_checkpoint(run, 4)
    assert checkpoint is not None
    opened = [open_archive(checkpoint, b"{}\n"), open_export(run, b"{}\n")]

    def no_open(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"HEAD opened {args[0]}")

    monkeypatch.setattr("builtins.open", no_open)
    heads = [describe_archive(checkpoint, b"{}\n"), describe_export(run, b"{}\n")]
    monkeypatch.undo()
    for head, archive in zip(heads, opened, strict=True):
        assert head is not None and archive is not None
        assert (head.size, head.etag) == (archive.size, archive.etag)
        assert len(b"".join(archive.stream())) == archive.size


def test_export_result_json_link_is_left_out(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.export.mkdir(parents=True)
    (run.export / "saved_model.pb").write_bytes(b"pb")
    secret = tmp_path / "secret.json"
    secret.write_text('{"not": "yours"}')
    run.result.symlink_to(secret)
    archive = open_export(run, b"{}\n")
    assert archive is not None
    with tarfile.open(fileobj=io.BytesIO(b"".join(archive.stream())), mode="r:gz") as tar:
        assert tar.getnames() == ["saved_model.pb", "spec.json"]


def test_an_archive_a_file_of_fails_to_open_closes_those_it_opened(tmp_path: Path) -> None:
    # A file gone is None (a 404); any other failure is raised, and the files opened
    # before it were left to the garbage collector: open for as long as anything held the
    # error's traceback (a handler logging it, a 500 being rendered).
    (tmp_path / "a").write_bytes(b"a")
    (tmp_path / "b").mkdir()  # opened for reading: IsADirectoryError, not a file gone
    fds_before = len(os.listdir("/proc/self/fd"))

    with pytest.raises(IsADirectoryError) as raised:
        archives.archive([("a", tmp_path / "a"), ("b", tmp_path / "b")], [])
    assert raised.tb is not None
    assert len(os.listdir("/proc/self/fd")) == fds_before
    assert archives.archive([("a", tmp_path / "a"), ("c", tmp_path / "c")], []) is None
    assert len(os.listdir("/proc/self/fd")) == fds_before
