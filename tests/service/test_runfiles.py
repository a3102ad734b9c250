"""Reading a worker log by lines: the tail, and whole lines from a byte offset on."""

import time
from pathlib import Path

import pytest

from service.runfiles import OffsetPastEnd, inside, read_lines_from, tail_lines, tail_with_end


def test_tail_offset_is_the_end_of_the_last_whole_line(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_bytes(b"one\ntwo\nthr")
    lines, end = tail_with_end(log, 2)
    assert lines == ["two", "thr"]  # an unfinished line is shown...
    assert end == len(b"one\ntwo\n")  # ...and comes again, whole, from the offset
    with open(log, "ab") as f:
        f.write(b"ee\nfour\n")
    assert read_lines_from(log, end, 1024) == ("three\nfour\n", log.stat().st_size)
    assert tail_lines(log, 1) == ["four"]


def test_read_lines_from_holds_back_an_unfinished_line(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_bytes(b"alpha\nbet")
    assert read_lines_from(log, 0, 1024) == ("alpha\n", 6)
    assert read_lines_from(log, 6, 1024) == ("", 6)  # nothing whole yet: stay put
    with open(log, "ab") as f:
        f.write(b"a\n")
    assert read_lines_from(log, 6, 1024) == ("beta\n", 11)


def test_read_lines_from_ends_within_limit_at_a_line_end(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_bytes(b"".join(f"line {i}\n".encode() for i in range(100)))
    text, offset, read = "", 0, []
    while True:
        text, next_offset = read_lines_from(log, offset, 50)
        if next_offset == offset:
            break
        assert text.endswith("\n") and len(text.encode()) <= 50
        read.append(text)
        offset = next_offset
    assert "".join(read) == log.read_text()  # every line once, in order


def test_read_lines_from_moves_on_through_a_line_longer_than_the_limit(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_bytes(b"x" * 30 + b"\nok\n")
    assert read_lines_from(log, 0, 10) == ("x" * 10, 10)
    assert read_lines_from(log, 30, 10) == ("\nok\n", 34)


def test_read_lines_from_refuses_an_offset_past_the_end(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_bytes(b"abc\n")
    with pytest.raises(OffsetPastEnd, match=r"^offset 9 is past the end of the log \(4 bytes\)$"):
        read_lines_from(log, 9, 10)
    assert read_lines_from(tmp_path / "missing.log", 0, 10) == ("", 0)
    with pytest.raises(OffsetPastEnd, match=r"\(0 bytes\)"):
        read_lines_from(tmp_path / "missing.log", 1, 10)


def test_inside_refuses_links_out_of_the_run_dir(tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    outside.write_text("no")
    run = tmp_path / "run"
    run.mkdir()
    (run / "worker.log").symlink_to(outside)
    (run / "real.log").write_text("yes")
    assert not inside(run, run / "worker.log")
    assert inside(run, run / "real.log")


def test_tail_long_log_in_linear_time(tmp_path: Path) -> None:
    # 30 MB of 1 kB lines (TensorFlow's warnings run long), all 30,000 asked for: reading
    # each block once takes well under a second; recounting all read so far took seconds.
    log = tmp_path / "worker.log"
    log.write_bytes((b"W" * 999 + b"\n") * 30_000)
    started = time.monotonic()
    lines, end = tail_with_end(log, 30_000)
    assert time.monotonic() - started < 1.5
    assert len(lines) == 30_000 and lines[0] == "W" * 999
    assert end == 30_000_000


@pytest.mark.parametrize("count", [1, 2, 63, 64, 65, 129, 1000])
def test_tail_across_block_edges_matches_every_line(tmp_path: Path, count: int) -> None:
    log = tmp_path / "worker.log"
    # Lines of 1,023 and 1,024 bytes: newlines fall just before, on and after 64 KiB edges.
    text = b"".join(b"%05d" % i + b"x" * (1018 + i % 2) + b"\n" for i in range(300))
    log.write_bytes(text)
    lines, end = tail_with_end(log, count)
    assert lines == text.decode().splitlines()[-count:]
    assert end == len(text)
