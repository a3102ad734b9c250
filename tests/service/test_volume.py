"""The service at volume: what one request, one tick or one failed job may read and keep is
bounded, however long a job ran or however much it wrote. Each test asserts the work done
(bytes, rows, points, calls), never how long it took."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from tests.service.harness import Service, job_spec

# `python -m volume_worker run --job-dir DIR`: what its spec's name says, then exits 1.
#   "long-line": 8 MB on one line of stdout (worker.log), then a traceback's last line.
VOLUME_WORKER = """\
import json, sys
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
name = json.loads((job_dir / "spec.json").read_text())["name"]
if name == "long-line":
    sys.stdout.write("[" + "0.123, " * (8 * 2**20 // 7) + "]\\n")
    sys.stdout.write("ValueError: the array above was wrong\\n")
    sys.stdout.flush()
sys.exit(1)
"""


def volume_service(make_service: Callable[..., Service], tmp_path: Path) -> Service:
    folder = tmp_path / "stand-in"
    folder.mkdir()
    (folder / "volume_worker.py").write_text(VOLUME_WORKER)
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    return make_service(env={"TOWERBOARD_WORKER_MODULE": "volume_worker", "PYTHONPATH": path})


def test_a_failed_jobs_log_tail_is_bounded_whatever_its_lines(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    """A worker that printed 8 MB on one line and failed: the job's error keeps the lines
    that fit in a bounded read of the log, not the 8 MB, which every list of jobs would
    then have carried."""
    service = volume_service(make_service, tmp_path)
    service.start()
    job = service.submit(job_spec(name="long-line"))
    failed = service.wait_state(job["id"], "failed")
    tail = failed["error"]["log_tail"]
    assert tail[-1] == "ValueError: the array above was wrong"
    assert len(json.dumps(failed)) < 20_000
    listed = service.client.get("/api/v1/jobs").json()
    assert len(json.dumps(listed)) < 20_000
