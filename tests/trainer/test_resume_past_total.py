"""A job resumed with a total its latest checkpoint has already passed (its spec shortened
after the fact, say `epochs` lowered on resume): it fails saying so, instead of
"succeeding" at step 30 of 20."""

from __future__ import annotations

import json
import shutil

from tests.trainer.test_resume import BASE, finished  # noqa: F401 - the shared fixture
from tests.trainer.test_run import run_worker, with_


def test_resume_past_the_total_fails_saying_so(finished, tmp_path):  # noqa: F811
    job_dir = tmp_path / "job"
    shutil.copytree(finished, job_dir)
    (job_dir / "result.json").unlink()
    kept = sorted(path.name for path in (job_dir / "checkpoints").iterdir())

    code, result, log = run_worker(job_dir, with_(BASE, steps=20))

    assert code == 1, log
    assert result["outcome"] == "failed"
    assert result["message"] == (
        "Cannot resume: the latest checkpoint is at step 30, past this job's total of 20 "
        "steps. Give a larger total (steps or epochs), or use a new job directory to start "
        "again."
    )
    assert (result["step"], result["total"]) == (30, 20)
    assert sorted(path.name for path in (job_dir / "checkpoints").iterdir()) == kept
    end = json.loads((job_dir / "progress.jsonl").read_text().splitlines()[-1])
    assert (end["event"], end["outcome"], end["step"], end["total"]) == ("end", "failed", 30, 20)
