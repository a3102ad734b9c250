"""Resumable downloads against a real service: HEAD, Range, If-Range and ETag on the
checkpoint and export routes, and the CLI resuming a partial download.

The job is the stand-in worker's (it succeeds at once); its checkpoints and export are
real files written into its run directory here, as the trainer would leave them, so the
tests can add, change and size them at will.
"""

from __future__ import annotations

import fcntl
import http.server
import io
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.service.harness import ROOT, Service, fake_index, fake_worker_env, job_spec

DOWNLOAD_HEADERS = (
    "content-type", "content-length", "content-disposition", "etag", "accept-ranges",
)  # fmt: skip


def serve_job(service: Service) -> tuple[Service, str, Path]:
    """Start `service`, run a job to success, and give its run directory checkpoints 20
    and 40 (1.5 MB of data each: many stored blocks) and an export."""
    service.start()
    job = service.submit(job_spec(name="quick"))
    service.wait_state(job["id"], "succeeded")
    run = service.data_dir / "runs" / job["id"]
    for step in (20, 40):
        write_checkpoint(run, step)
    (run / "export" / "variables").mkdir(parents=True)
    (run / "export" / "saved_model.pb").write_bytes(os.urandom(40_000))
    (run / "export" / "variables" / "variables.index").write_bytes(b"v" * 300)
    (run / "export" / "variables" / "variables.data-00000-of-00001").write_bytes(
        os.urandom(900_000)
    )
    return service, job["id"], run


@pytest.fixture
def served(make_service: Callable[..., Service], tmp_path: Path) -> tuple[Service, str, Path]:
    """A service, a succeeded job's id, and its run directory (`serve_job`), for a test
    that changes the job's files or restarts the service."""
    return serve_job(make_service(env=fake_worker_env(tmp_path)))


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, str, Path]]:
    """The same, one for the whole module, for the tests that only read it: a service of
    their own cost each of them a service start (2-3 s on a busy machine), 15 in all."""
    folder = tmp_path_factory.mktemp("downloads")
    service = Service(folder / "data", fake_worker_env(folder))
    try:
        yield serve_job(service)
    finally:
        service.close()


def write_checkpoint(run: Path, step: int, size: int = 1_500_000) -> None:
    folder = run / "checkpoints"
    folder.mkdir(exist_ok=True)
    (folder / f"ckpt-{step}.data-00000-of-00001").write_bytes(os.urandom(size))
    (folder / f"ckpt-{step}.index").write_bytes(fake_index())


def urls(job_id: str) -> list[str]:
    base = f"/api/v1/jobs/{job_id}"
    return [f"{base}/checkpoints/20", f"{base}/checkpoints/latest", f"{base}/export"]


def test_head_answers_the_headers_a_get_does(shared: tuple[Service, str, Path]) -> None:
    service, job_id, _ = shared
    for url in urls(job_id):
        got = service.client.get(url)
        head = service.client.head(url)
        assert got.status_code == head.status_code == 200, (url, head.status_code)
        assert head.content == b""
        assert {h: head.headers.get(h) for h in DOWNLOAD_HEADERS} == {
            h: got.headers.get(h) for h in DOWNLOAD_HEADERS
        }
        assert head.headers["content-length"] == str(len(got.content))
        assert head.headers["accept-ranges"] == "bytes"
        assert head.headers["etag"].startswith('"')
    head = service.client.head(f"/api/v1/jobs/{job_id}/checkpoints/30")
    assert head.status_code == 404 and head.content == b""


def test_range_is_that_slice_of_the_whole(shared: tuple[Service, str, Path]) -> None:
    service, job_id, _ = shared
    for url in urls(job_id):
        whole = service.client.get(url)
        data, size, tag = whole.content, len(whole.content), whole.headers["etag"]
        assert size > 900_000  # many stored blocks
        cases = {
            f"bytes={size // 3}-": (size // 3, size),
            f"bytes=10-{size // 2}": (10, size // 2 + 1),
            "bytes=0-0": (0, 1),
            f"bytes={size - 3}-{size + 1000}": (size - 3, size),  # past the end: to the end
            "bytes=-100": (size - 100, size),
            f"bytes=-{size * 2}": (0, size),
            "BYTES=70000-70100": (70_000, 70_101),  # the unit in any case
        }
        for header, (start, stop) in cases.items():
            for extra in ({}, {"If-Range": tag}):
                part = service.client.get(url, headers={"Range": header, **extra})
                assert part.status_code == 206, (url, header, part.text[:200])
                assert part.content == data[start:stop], (url, header)
                assert part.headers["content-range"] == f"bytes {start}-{stop - 1}/{size}"
                assert part.headers["content-length"] == str(stop - start)
                assert part.headers["etag"] == tag
                assert part.headers["content-type"] == "application/gzip"


def test_range_past_the_end_is_416(shared: tuple[Service, str, Path]) -> None:
    service, job_id, _ = shared
    url = urls(job_id)[0]
    size = int(service.client.head(url).headers["content-length"])
    for header in (
        f"bytes={size}-",
        f"bytes={size + 5}-{size + 10}",
        "bytes=-0",
        "bytes=" + "9" * 40 + "-",
    ):
        refused = service.client.get(url, headers={"Range": header})
        assert refused.status_code == 416, header
        assert refused.headers["content-range"] == f"bytes */{size}"
        assert refused.json()["detail"] == (
            f"Range {header!r} starts at or past the end of the archive, which is {size} bytes: "
            "ask for a range that starts before it."
        )


def test_if_range_not_this_etag_sends_the_whole(shared: tuple[Service, str, Path]) -> None:
    service, job_id, _ = shared
    url = urls(job_id)[2]
    whole = service.client.get(url)
    tag = whole.headers["etag"]
    for if_range in (
        '"0123456789abcdef0123456789abcdef"',
        f"W/{tag}",
        "Wed, 21 Oct 2015 07:28:00 GMT",
    ):
        got = service.client.get(url, headers={"Range": "bytes=100-", "If-Range": if_range})
        assert got.status_code == 200, if_range
        assert "content-range" not in got.headers
        assert got.content == whole.content
    # The If-Range comes first: a range it turns down is not checked either.
    got = service.client.get(url, headers={"Range": "bytes=999999999-", "If-Range": '"old"'})
    assert got.status_code == 200 and got.content == whole.content


@pytest.mark.parametrize(
    "header",
    ["bytes=abc", "bytes=5-2", "items=0-5", "bytes=", "bytes=-", "bytes 0-5", "bytes=0-1,5-6",
     "bytes=0-1, -5", "bytes=1.5-"],
)  # fmt: skip
def test_malformed_or_several_ranges_send_the_whole(
    shared: tuple[Service, str, Path], header: str
) -> None:
    service, job_id, _ = shared
    url = urls(job_id)[0]
    whole = service.client.get(url).content
    got = service.client.get(url, headers={"Range": header})
    assert got.status_code == 200
    assert got.content == whole
    # HEAD answers as a GET without Range would: Range is for GET alone.
    assert service.client.head(url, headers={"Range": "bytes=5-"}).status_code == 200


def test_etag_changes_with_the_files_and_only_then(served: tuple[Service, str, Path]) -> None:
    service, job_id, run = served
    step20, latest, export = urls(job_id)

    def etag(url: str) -> str:
        return service.client.head(url).headers["etag"]

    before = {url: etag(url) for url in (step20, latest, export)}
    assert len(set(before.values())) == 3
    write_checkpoint(run, 60, size=1000)  # a new checkpoint: `latest` is another archive
    assert etag(latest) != before[latest]
    assert etag(latest) == service.client.get(latest).headers["etag"]
    assert (
        service.client.get(latest)
        .headers["content-disposition"]
        .endswith(f'"{job_id}-ckpt-60.tar.gz"')
    )
    assert etag(step20) == before[step20]  # its own files did not change
    (run / "export" / "assets").mkdir()
    (run / "export" / "assets" / "vocab.txt").write_text("a\nb\n")
    assert etag(export) != before[export]


def test_same_bytes_after_a_restart(served: tuple[Service, str, Path]) -> None:
    service, job_id, _ = served
    before = [service.client.get(url) for url in urls(job_id)]
    service.stop()
    service.start()
    for url, old in zip(urls(job_id), before, strict=True):
        new = service.client.get(url)
        assert new.headers["etag"] == old.headers["etag"]
        assert new.content == old.content, url


# --- the CLI ---------------------------------------------------------------------------


def towerboard(
    service: Service, *args: str, url: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TOWERBOARD_TOKEN", "TOWERBOARD_URL")}
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args, "--url", url or service.base_url],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_cli_resumes_a_partial_download(shared: tuple[Service, str, Path], tmp_path: Path) -> None:
    service, job_id, _ = shared
    folder = tmp_path / "fresh"
    fresh = towerboard(service, "checkpoints", job_id, "--download", "20", "-o", f"{folder}/")
    assert fresh.returncode == 0, fresh.stderr
    name = f"{job_id}-ckpt-20.tar.gz"
    whole = (folder / name).read_bytes()
    assert sorted(p.name for p in folder.iterdir()) == [name]  # no .part left behind
    tag = service.client.head(urls(job_id)[0]).headers["etag"]

    out = tmp_path / "resumed" / "ckpt.tar.gz"
    out.parent.mkdir()
    part, saved_tag = Path(f"{out}.part"), Path(f"{out}.part.etag")
    part.write_bytes(whole[: len(whole) * 6 // 10])  # a download cut at 60%
    saved_tag.write_text(tag)
    resumed = towerboard(service, "checkpoints", job_id, "--download", "20", "-o", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {name} at 882.4 KiB of 1.4 MiB" in resumed.stderr
    assert out.read_bytes() == whole
    assert not part.exists() and not saved_tag.exists()

    # What is in the part is kept, not fetched again: a byte changed in it stays changed.
    out.unlink()  # a download never replaces a file already there (see the test below)
    marked = bytearray(whole[:1000])
    marked[500] ^= 0xFF
    part.write_bytes(marked)
    saved_tag.write_text(tag)
    again = towerboard(service, "checkpoints", job_id, "--download", "20", "-o", str(out))
    assert again.returncode == 0, again.stderr
    assert out.read_bytes() == bytes(marked) + whole[1000:]

    # Another download writing the same part holds it: this one says so and leaves it be.
    out.unlink()
    part.write_bytes(whole[:1000])
    with open(part, "ab") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        busy = towerboard(service, "checkpoints", job_id, "--download", "20", "-o", str(out))
    assert busy.returncode == 1
    assert busy.stderr == (
        f"towerboard: error: {part} is being written by another download; wait for it to end\n"
    )
    assert part.read_bytes() == whole[:1000]


def test_cli_starts_over_when_the_archive_changed(
    served: tuple[Service, str, Path], tmp_path: Path
) -> None:
    service, job_id, run = served
    out = tmp_path / "model.tar.gz"
    part, saved_tag = Path(f"{out}.part"), Path(f"{out}.part.etag")
    part.write_bytes(b"x" * 5000)
    saved_tag.write_text('"0123456789abcdef0123456789abcdef"')  # of files since replaced
    got = towerboard(service, "export", job_id, "-o", str(out))
    assert got.returncode == 0, got.stderr
    assert "resuming" not in got.stderr
    assert out.read_bytes() == service.client.get(urls(job_id)[2]).content
    assert not part.exists() and not saved_tag.exists()
    assert f"the 4.9 KiB in {part} are of another version of" in got.stderr

    # A part with no tag beside it: its version cannot be told, and the message says so.
    part.write_bytes(out.read_bytes()[:1000])
    untold = towerboard(service, "export", job_id, "-o", str(out), "--force")
    assert untold.returncode == 0, untold.stderr
    assert out.read_bytes() == service.client.get(urls(job_id)[2]).content
    assert f"in {part} have no {saved_tag.name} beside them to say which version of " in (
        untold.stderr
    )

    # `latest` moved on since the part was saved: another archive, downloaded whole.
    write_checkpoint(run, 60, size=1000)
    part.write_bytes(b"y" * 3000)
    saved_tag.write_text(service.client.head(urls(job_id)[1]).headers["etag"])
    write_checkpoint(run, 80, size=2000)  # `latest` moves on after the tag was saved
    latest = towerboard(
        service, "checkpoints", job_id, "--download", "latest", "-o", str(out), "--force"
    )
    assert latest.returncode == 0, latest.stderr
    assert out.read_bytes() == service.client.get(urls(job_id)[1]).content
    with tarfile.open(out) as tar:
        assert "ckpt-80.index" in tar.getnames()
    assert "are of another version of" in latest.stderr  # the part it threw away is named


def test_cli_download_never_replaces_a_file_silently(
    shared: tuple[Service, str, Path], tmp_path: Path
) -> None:
    """A file already at the target is kept and named (exit 1); `--force` replaces it. It
    was renamed over without a word: `-o model.tar.gz` twice, or a file of one's own."""
    service, job_id, _ = shared
    whole = service.client.get(urls(job_id)[2]).content
    mine = tmp_path / "model.tar.gz"
    mine.write_text("my own file")
    named = tmp_path / f"{job_id}-ckpt-20.tar.gz"  # the name the service gives, in a folder
    named.write_text("an earlier download")
    for args, kept in (
        (["export", job_id, "-o", str(mine)], mine),
        (["checkpoints", job_id, "--download", "20", "-o", f"{tmp_path}/"], named),
    ):
        refused = towerboard(service, *args)
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr == (
            f"towerboard: error: {kept} already exists; remove it, give -o another path, or "
            "add --force to replace it\n"
        )
        assert refused.stdout == ""
    assert mine.read_text() == "my own file"
    assert named.read_text() == "an earlier download"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, named.name])

    forced = towerboard(service, "export", job_id, "-o", str(mine), "--force")
    assert forced.returncode == 0, forced.stderr
    assert mine.read_bytes() == whole

    # Never over what is not a plain file, even with --force (as `-o /dev/null` would
    # have renamed a file over the device): here a FIFO, which needs no root to make.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    device = towerboard(service, "export", job_id, "-o", str(fifo), "--force")
    assert device.returncode == 1, device.stderr
    assert device.stderr == (
        f"towerboard: error: cannot save to {fifo}: it is not a plain file; give -o a file "
        "or folder path (or - for standard output)\n"
    )
    assert fifo.is_fifo()


class CuttingProxy(http.server.ThreadingHTTPServer):
    """A proxy to the service that drops the connection after `cut` bytes of a GET's body,
    as a network that fails mid-download does; with `stall`, it first waits for `go_on`
    to be set (or 60 s), as a download that crawls."""

    def __init__(self, service: Service, cut: int, *, stall: bool = False) -> None:
        self.service, self.cut, self.stall = service, cut, stall
        self.go_on = threading.Event()
        super().__init__(("127.0.0.1", 0), _CuttingHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _CuttingHandler(http.server.BaseHTTPRequestHandler):
    server: CuttingProxy

    def do_HEAD(self) -> None:
        self._forward(body=False)

    def do_GET(self) -> None:
        self._forward(body=True)

    def _forward(self, *, body: bool) -> None:
        asked = {k: v for k, v in self.headers.items() if k.lower() in ("range", "if-range")}
        with self.server.service.client.stream(self.command, self.path, headers=asked) as answer:
            self.send_response(answer.status_code)
            for name in (*DOWNLOAD_HEADERS, "content-range"):
                if name in answer.headers:
                    self.send_header(name, answer.headers[name])
            self.end_headers()
            if body:
                self.wfile.write(answer.read()[: self.server.cut])
                self.wfile.flush()
                if self.server.stall:
                    self.server.go_on.wait(timeout=60)
        self.close_connection = True  # and short of its Content-Length: the client sees a cut

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_cli_download_cut_short_resumes_on_the_next_run(
    shared: tuple[Service, str, Path], tmp_path: Path
) -> None:
    service, job_id, _ = shared
    whole = service.client.get(urls(job_id)[2]).content
    out = tmp_path / "model.tar.gz"
    proxy = CuttingProxy(service, cut=len(whole) // 2)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        cut = towerboard(service, "export", job_id, "-o", str(out), url=proxy.url)
    finally:
        proxy.shutdown()
        proxy.server_close()
    assert cut.returncode == 3, cut.stderr
    part = Path(f"{out}.part")
    assert part.read_bytes() == whole[: len(whole) // 2]
    assert cut.stderr.startswith(
        f"towerboard: error: the download of {job_id}-export.tar.gz was cut off at 462.3 KiB "
        "of 924.6 KiB (RemoteProtocolError: "
    ), cut.stderr
    assert cut.stderr.endswith(
        f"; 462.3 KiB kept in {part}: run the same command again to resume\n"
    ), cut.stderr
    assert not out.exists()

    resumed = towerboard(service, "export", job_id, "-o", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {job_id}-export.tar.gz at 462.3 KiB of 924.6 KiB" in resumed.stderr
    assert out.read_bytes() == whole
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("model")) == [out.name]


def test_cli_names_a_part_whose_checkpoint_is_gone(
    served: tuple[Service, str, Path], tmp_path: Path
) -> None:
    # A download of step 60 cut short, then the job's rotation deleted step 60: the part
    # can never be finished. The error says so and names it; the part is left to the person.
    service, job_id, run = served
    write_checkpoint(run, 60, size=1000)
    out = tmp_path / "ckpt-60.tar.gz"
    part, saved_tag = Path(f"{out}.part"), Path(f"{out}.part.etag")
    part.write_bytes(service.client.get(f"/api/v1/jobs/{job_id}/checkpoints/60").content[:700])
    saved_tag.write_text(
        service.client.head(f"/api/v1/jobs/{job_id}/checkpoints/60").headers["etag"]
    )
    for file in (run / "checkpoints").glob("ckpt-60.*"):
        file.unlink()
    gone = towerboard(service, "checkpoints", job_id, "--download", "60", "-o", str(out))
    assert gone.returncode == 1, gone.stderr
    assert gone.stderr.startswith("towerboard: error: "), gone.stderr
    assert gone.stderr.endswith(
        f"Retained steps: 20, 40. The 700 B in {part} were of it and can no longer be "
        f"finished: remove it and {saved_tag.name}.\n"
    ), gone.stderr
    assert part.stat().st_size == 700 and saved_tag.exists()
    # A step that never had a part: the service's error alone.
    never = towerboard(service, "checkpoints", job_id, "--download", "80", "-o", f"{out}.x")
    assert never.returncode == 1 and "finished" not in never.stderr, never.stderr


def test_cli_cut_short_download_of_latest_says_how_to_resume_it_by_its_step(
    shared: tuple[Service, str, Path], tmp_path: Path
) -> None:
    # "Run the same command again" fetched whatever checkpoint was latest by then, whole,
    # and left the part of the one cut off behind for good.
    service, job_id, _ = shared
    whole = service.client.get(f"/api/v1/jobs/{job_id}/checkpoints/40").content
    out = tmp_path / "ckpt.tar.gz"
    proxy = CuttingProxy(service, cut=len(whole) // 2)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        cut = towerboard(
            service, "checkpoints", job_id, "--download", "latest", "-o", str(out), url=proxy.url
        )
    finally:
        proxy.shutdown()
        proxy.server_close()
    assert cut.returncode == 3, cut.stderr
    # With the --url it was given: run as said, without it, it went to another service.
    command = f"towerboard checkpoints {job_id} --download 40 -o {out} --url {proxy.url}"
    assert cut.stderr.endswith(f"kept in {out}.part: resume it with `{command}`\n"), cut.stderr

    resumed = towerboard(service, *command.split()[1:])  # the service's --url, added, wins
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming " in resumed.stderr and out.read_bytes() == whole


def test_cli_interrupted_download_of_latest_says_how_to_resume_it_by_its_step(
    shared: tuple[Service, str, Path], tmp_path: Path
) -> None:
    # Ctrl-C said "run the same command again to resume", which fetched whatever was
    # latest by then, whole, leaving the interrupted part and its tag behind for good (a
    # cut connection already named the step).
    service, job_id, _ = shared
    whole = service.client.get(f"/api/v1/jobs/{job_id}/checkpoints/40").content
    cut = len(whole) // 2
    proxy = CuttingProxy(service, cut=cut, stall=True)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    part = tmp_path / f"{job_id}-ckpt-40.tar.gz.part"
    env = {k: v for k, v in os.environ.items() if k not in ("TOWERBOARD_TOKEN", "TOWERBOARD_URL")}
    try:
        running = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "checkpoints", job_id, "--download", "latest",
             "-o", f"{tmp_path}/", "--url", proxy.url],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        # All it was sent is in, but what its file's buffer holds (8 KiB at most).
        while not part.exists() or part.stat().st_size < cut - 8192:
            assert running.poll() is None and time.monotonic() < deadline, running.communicate()
            time.sleep(0.05)
        running.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = running.communicate(timeout=60)
    finally:
        proxy.go_on.set()
        proxy.shutdown()
        proxy.server_close()
    assert running.returncode == 130, err
    command = f"towerboard checkpoints {job_id} --download 40 -o {tmp_path}/ --url {proxy.url}"
    # One line after the terminal's ^C, and no blank one after it (both the download and
    # the command's end wrote a new line).
    assert re.fullmatch(
        rf"\ninterrupted; [\d.]+ KiB kept in {re.escape(str(part))}: resume it with "
        rf"`{re.escape(command)}`\n",
        err,
    ), err
    assert out == ""
    assert part.stat().st_size == cut

    resumed = towerboard(service, *command.split()[1:])  # the service's --url, added, wins
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming " in resumed.stderr
    assert (tmp_path / f"{job_id}-ckpt-40.tar.gz").read_bytes() == whole
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{job_id}-ckpt-40.tar.gz"]


def _limit_file_size(most: int) -> Callable[[], None]:
    """A `preexec_fn` that limits the size of any file the process writes to `most` bytes
    (RLIMIT_FSIZE): a write past it fails with EFBIG, as one on a full disk fails."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (most, most))


def test_cli_download_its_disk_took_no_more_of_says_what_it_kept(
    shared: tuple[Service, str, Path], tmp_path: Path
) -> None:
    # It said "cannot write TARGET: ..." of the file it had not got to, and left a .part
    # and its .part.etag unsaid, which the next run resumes from.
    service, job_id, _ = shared
    whole = service.client.get(urls(job_id)[2]).content
    out = tmp_path / "model.tar.gz"
    part, saved_tag = Path(f"{out}.part"), Path(f"{out}.part.etag")
    env = {k: v for k, v in os.environ.items() if k not in ("TOWERBOARD_TOKEN", "TOWERBOARD_URL")}

    def export(most: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "service.cli", "export", job_id, "-o", str(out), "--url",
             service.base_url],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
            preexec_fn=_limit_file_size(most),
        )  # fmt: skip

    full = export(300_000)
    assert full.returncode == 1, full.stderr
    assert full.stderr == (
        f"towerboard: error: cannot write {part}: File too large; 293.0 KiB kept in {part}: "
        "run the same command again to resume\n"
    )
    assert part.read_bytes() == whole[:300_000] and saved_tag.exists() and not out.exists()

    resumed = towerboard(service, "export", job_id, "-o", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {job_id}-export.tar.gz at 293.0 KiB of 924.6 KiB" in resumed.stderr
    assert out.read_bytes() == whole

    # Not even the tag could be written: it names the tag, and leaves nothing behind.
    out.unlink()
    none = export(0)
    assert none.returncode == 1, none.stderr
    assert none.stderr == f"towerboard: error: cannot write {saved_tag}: File too large\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_cli_writes_a_download_to_stdout(shared: tuple[Service, str, Path], tmp_path: Path) -> None:
    """`-o -` sends the archive to standard output, for a pipe into `tar xz` (it wrote a
    file named `-`); what it says goes to stderr, so the stream stays the archive's."""
    service, job_id, _ = shared
    env = {k: v for k, v in os.environ.items() if k not in ("TOWERBOARD_TOKEN", "TOWERBOARD_URL")}
    for args, url in (
        (["export", job_id], f"/api/v1/jobs/{job_id}/export"),
        (["checkpoints", job_id, "--download", "20"], f"/api/v1/jobs/{job_id}/checkpoints/20"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "service.cli", *args, "-o", "-", "--url", service.base_url],
            cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True,
            timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout == service.client.get(url).content
        assert b"to stdout" in result.stderr
        assert not (tmp_path / "-").exists()
    with tarfile.open(fileobj=io.BytesIO(result.stdout)) as archive:
        assert any(name.endswith(".index") for name in archive.getnames())


def test_cli_download_to_a_stdout_that_takes_nothing_more_is_one_line(
    shared: tuple[Service, str, Path],
) -> None:
    # `export ID -o - > /dev/full`: an OSError traceback.
    service, job_id, _ = shared
    env = {k: v for k, v in os.environ.items() if k not in ("TOWERBOARD_TOKEN", "TOWERBOARD_URL")}
    for args, name in (
        (["export", job_id], f"{job_id}-export.tar.gz"),
        (["checkpoints", job_id, "--download", "20"], f"{job_id}-ckpt-20.tar.gz"),
    ):
        with open("/dev/full", "wb") as full:
            result = subprocess.run(
                [sys.executable, "-m", "service.cli", *args, "-o", "-", "--url", service.base_url],
                cwd=ROOT, env=env, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120,
            )  # fmt: skip
        assert result.returncode == 1, result.stderr
        assert result.stderr == (
            f"towerboard: error: cannot write the download of {name} to standard output (No "
            "space left on device); what was written is incomplete\n"
        )


def test_cli_names_a_file_given_as_the_folder_to_save_into(
    shared: tuple[Service, str, Path], tmp_path: Path
) -> None:
    service, job_id, _ = shared
    (tmp_path / "afile").write_text("mine")
    result = towerboard(service, "export", job_id, "-o", f"{tmp_path / 'afile'}/")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"towerboard: error: cannot save into {tmp_path / 'afile'}/: {tmp_path / 'afile'} is "
        "a file, not a folder"
    )
    assert (tmp_path / "afile").read_text() == "mine"


def test_a_download_its_client_leaves_stalled_lets_go_of_its_files(
    served: tuple[Service, str, Path],
) -> None:
    # A client that stops reading, then goes away: Starlette cancels the answer and leaves
    # its body unclosed, so the files it read stayed open until Python's cycle collector
    # came by, which a quiet service may not do for hours: a deleted job's disk space was
    # not freed meanwhile.
    service, job_id, run = served
    write_checkpoint(run, 60, size=20_000_000)  # more than the sockets' buffers hold
    data = run / "checkpoints" / "ckpt-60.data-00000-of-00001"
    assert service.process is not None
    fds = Path(f"/proc/{service.process.pid}/fd")

    def holds_it() -> bool:
        return any(os.path.realpath(fd) == str(data) for fd in fds.iterdir())

    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", service.port))
        ask = f"GET /api/v1/jobs/{job_id}/checkpoints/60 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        client.sendall(ask.encode())
        assert client.recv(4096).startswith(b"HTTP/1.1 200 ")
        time.sleep(1.0)  # the service fills the socket's buffers and waits for the client
        assert holds_it()
    deadline = time.monotonic() + 10
    while holds_it() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not holds_it(), "the checkpoint stayed open after its client had gone"
