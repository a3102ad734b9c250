"""Reading a worker log by lines: the tail, and whole lines from a byte offset on."""

import time
import tracemalloc
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
    # 15 MB of 500-byte lines (TensorFlow's warnings run long), all 30,000 asked for:
    # reading each block once takes well under a second; recounting all read so far took
    # seconds.
    log = tmp_path / "worker.log"
    log.write_bytes((b"W" * 499 + b"\n") * 30_000)
    started = time.monotonic()
    lines, end = tail_with_end(log, 30_000)
    assert time.monotonic() - started < 1.5
    assert len(lines) == 30_000 and lines[0] == "W" * 499
    assert end == 15_000_000


def test_tail_of_a_log_without_newlines_reads_a_bounded_window(tmp_path: Path) -> None:
    """64 MB and no newline (a progress bar that never ends its line, say): 200 lines read
    back at most 8 KiB each, not the whole file (it was read, and sent, whole)."""
    log = tmp_path / "worker.log"
    with open(log, "wb") as f:
        f.write(b"start\n")
        f.truncate(64 * 2**20)  # zeros, no newline after the first line
    tracemalloc.start()
    try:
        lines, end = tail_with_end(log, 200)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    budget = 200 * 8 * 1024
    assert lines == ["\0" * (budget + 1)]  # the unfinished line's last part
    assert end == 64 * 2**20 - budget - 1  # read on from where the window began
    assert peak < 4 * budget
    # A follower reading on from there moves on through the line in `limit`-sized parts.
    assert read_lines_from(log, end, 1024) == ("\0" * 1024, end + 1024)


def test_tail_past_its_budget_leaves_out_lines_it_did_not_read_from_their_start(
    tmp_path: Path,
) -> None:
    log = tmp_path / "worker.log"
    log.write_bytes(b"a" * 50_000 + b"\n" + b"b" * 60_000 + b"\n" + b"c" * 10 + b"\nd")
    # 2 lines asked for: 64 KiB read back, which starts inside the "b" line.
    lines, end = tail_with_end(log, 2)
    assert lines == ["c" * 10, "d"]
    assert end == log.stat().st_size - 1
    # A last whole line longer than the budget: its end, rather than nothing.
    log.write_bytes(b"x\n" + b"y" * 100_000 + b"\n")
    lines, end = tail_with_end(log, 1)
    assert lines == ["y" * 65_536]
    assert end == log.stat().st_size
    # The whole budget holds lines: the tail is as many as fit, whole.
    log.write_bytes((b"z" * 1023 + b"\n") * 20_000)  # 20 MB; 16 MiB at most is read back
    lines, end = tail_with_end(log, 20_000)
    assert len(lines) == 16 * 1024 and set(lines) == {"z" * 1023}
    assert end == 20_000 * 1024


def test_tail_lines_cuts_each_line_for_a_failed_jobs_error(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text("Traceback (most recent call last):\n" + "x" * 5000 + "\nValueError: bad\n")
    assert tail_lines(log, 3) == [
        "Traceback (most recent call last):",
        "x" * 2000 + "[… 3000 more characters]",
        "ValueError: bad",
    ]


@pytest.mark.parametrize("count", [1, 2, 63, 64, 65, 129, 1000])
def test_tail_across_block_edges_matches_every_line(tmp_path: Path, count: int) -> None:
    log = tmp_path / "worker.log"
    # Lines of 1,023 and 1,024 bytes: newlines fall just before, on and after 64 KiB edges.
    text = b"".join(b"%05d" % i + b"x" * (1018 + i % 2) + b"\n" for i in range(300))
    log.write_bytes(text)
    lines, end = tail_with_end(log, count)
    assert lines == text.decode().splitlines()[-count:]
    assert end == len(text)
