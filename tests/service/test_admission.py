"""`service.admission.admit` on its own: what it makes of a relative data path."""

from pathlib import Path

import numpy as np

from service.admission import admit
from service.devices import DevicePool
from trainer.spec import JobSpec

POOL = DevicePool(devices=("cpu:0",), gpu=False, max_towers=8)


def _spec(path: str) -> JobSpec:
    return JobSpec.model_validate({"data": {"format": "npz", "path": path}})


def _roots(tmp_path: Path) -> list[Path]:
    roots = [tmp_path / "first", tmp_path / "second"]
    for root in roots:
        root.mkdir()
    (roots[1] / "set").mkdir()
    np.savez(roots[1] / "set" / "a.npz", x=np.zeros((2, 4, 4), np.uint8), y=np.zeros(2, int))
    return roots


def test_admit_takes_a_relative_path_under_the_root_that_holds_it(tmp_path: Path) -> None:
    roots = _roots(tmp_path)
    spec, errors = admit(_spec("set/a.npz"), pool=POOL, data_roots=roots)
    assert errors == [] and spec.data.path == str(roots[1] / "set" / "a.npz")


def test_admit_takes_a_relative_glob_under_the_root_it_matches_in(tmp_path: Path) -> None:
    # The glob was looked for under the first root only: "matches no such file".
    roots = _roots(tmp_path)
    spec, errors = admit(_spec("set/*.npz"), pool=POOL, data_roots=roots)
    assert errors == [] and spec.data.path == str(roots[1] / "set" / "*.npz")


def test_admit_names_the_first_root_for_a_glob_that_matches_nowhere(tmp_path: Path) -> None:
    roots = _roots(tmp_path)
    spec, [error] = admit(_spec("set/*.nothing.npz"), pool=POOL, data_roots=roots)
    assert spec.data.path == str(roots[0] / "set" / "*.nothing.npz")
    assert error["field"] == "data.path" and "matches no such file" in error["message"]


def test_admit_counts_one_device_in_the_singular(tmp_path: Path) -> None:
    one_gpu = DevicePool(devices=("gpu:3",), gpu=True, max_towers=1)
    spec = JobSpec.model_validate({"data": {"format": "synthetic"}, "towers": 2})
    _, errors = admit(spec, pool=one_gpu, data_roots=[tmp_path])
    assert errors == [
        {
            "field": "towers",
            "message": "Expected at most 1 tower, the devices this service can give "
            "(1 GPU (TOWERBOARD_GPUS=3)). Received: 2",
        }
    ]


def test_admit_keeps_variables_on_a_gpu_only_where_jobs_get_one(tmp_path: Path) -> None:
    # On a CPU-only host the worker put them on the CPU, saying so only in its log, while
    # the job's spec went on saying gpu0.
    spec = JobSpec.model_validate({"data": {"format": "synthetic"}, "parameter_device": "gpu0"})
    _, errors = admit(spec, pool=POOL, data_roots=[tmp_path])
    assert errors == [
        {
            "field": "parameter_device",
            "message": "Expected 'cpu' on this host, whose jobs get no GPU (a CPU-only host "
            "(TOWERBOARD_CPU_MAX_TOWERS=8)). Received: 'gpu0'",
        }
    ]
    one_gpu = DevicePool(devices=("gpu:3",), gpu=True, max_towers=1)
    assert admit(spec, pool=one_gpu, data_roots=[tmp_path])[1] == []
