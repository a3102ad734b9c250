"""How the service starts a worker process: its command line, environment and import path."""

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
with open(os.path.join(job_dir, "path.json"), "w") as f:
    json.dump(sys.path, f)
"""


def test_a_worker_gets_its_devices_and_no_cluster_config(tmp_path, monkeypatch):
    """...and imports from its PYTHONPATH and the installed packages, never from its
    working directory (the run directory, which `python -m` put first on sys.path): a
    module there would have shadowed any of the same name, numpy or the trainer itself."""
    package = tmp_path / "modules" / "envdump"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(ENV_DUMP)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "modules"))
    monkeypatch.setenv("TOWERBOARD_TOKEN", "the-service-token")
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
        data_roots=[tmp_path / "a", tmp_path / "b"],
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
    # The worker checks the job's data against them again as it starts.
    assert json.loads(env["TOWERBOARD_WORKER_DATA_ROOTS"]) == [
        str(tmp_path / "a"),
        str(tmp_path / "b"),
    ]
    assert "TOWERBOARD_TOKEN" not in env  # job code must not read the service's token
    assert json.loads(run.spec.read_text()) == {"name": "x"}
    path = json.loads((run.root / "path.json").read_text())
    assert str(tmp_path / "modules") in path
    assert not {str(run.root), "", "."} & set(path), path
