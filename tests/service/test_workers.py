"""How the service starts a worker process: its command line and environment."""

import json
import sys
import time

from service.workers import WorkerExit, spawn_worker
from trainer.rundir import RunDir

# Stands in for `python -m trainer`: writes the environment it was started with.
ENV_DUMP = """
import json, os, sys
job_dir = sys.argv[sys.argv.index("--job-dir") + 1]
with open(os.path.join(job_dir, "env.json"), "w") as f:
    json.dump(dict(os.environ), f)
"""


def test_a_worker_gets_its_devices_and_no_cluster_config(tmp_path, monkeypatch):
    package = tmp_path / "modules" / "envdump"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(ENV_DUMP)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "modules"))
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker"}})
    )
    run = RunDir(tmp_path / "run")
    worker = spawn_worker(
        job_id="job1",
        spec={"name": "x"},
        run=run,
        python=sys.executable,
        module="envdump",
        nice=0,
        cuda_visible_devices="1,2",
        attempt=1,
    )
    deadline = time.monotonic() + 30
    while (exit := worker.poll()) is None:
        assert time.monotonic() < deadline, run.log.read_text()
        time.sleep(0.05)
    assert exit == WorkerExit(code=0), run.log.read_text()
    env = json.loads((run.root / "env.json").read_text())
    assert "TF_CONFIG" not in env  # a job the service runs never joins a cluster
    assert env["CUDA_VISIBLE_DEVICES"] == "1,2"
    assert env["TOWERBOARD_JOB_ID"] == "job1"
    assert json.loads(run.spec.read_text()) == {"name": "x"}
