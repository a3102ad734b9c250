"""Convergence on real data: the MNIST test set, CNN on two towers."""

import json

import pytest

from tests.trainer.test_run import run_worker
from trainer.data import load_arrays
from trainer.spec import DataSpec

MNIST = (
    __import__("pathlib").Path(__file__).resolve().parents[2].parent
    / "shared"
    / "data"
    / "mnist-t10k"
)


@pytest.mark.slow
def test_cnn_two_towers_reaches_97_percent_on_mnist(tmp_path):
    if not (MNIST / "t10k-images-idx3-ubyte.gz").exists():
        pytest.skip(f"MNIST test set not found at {MNIST}")
    data = {"format": "idx", "path": str(MNIST), "eval_fraction": 0.2}
    arrays = load_arrays(DataSpec.model_validate(data), seed=0)
    # The split the issue names: first 8,000 train, last 2,000 evaluate.
    assert (arrays.num_train, arrays.num_eval) == (8000, 2000)
    spec = {
        "name": "mnist-cnn-2towers",
        "model": {"name": "cnn"},
        "data": data,
        "towers": 2,
        "batch_size": 100,
        "steps": 300,
        "optimizer": {"name": "adam", "learning_rate": 0.001},
        "eval": {"every_steps": 300, "batches": 20},  # 20 x 100 = all 2,000 held-out digits
        "summaries": {"trace_steps": []},
        "checkpoint": {"every_steps": 0, "every_seconds": 0, "keep": 1},
    }
    code, result, log = run_worker(tmp_path / "job", spec)
    assert code == 0, log
    assert result["eval"]["accuracy"] >= 0.97, json.dumps(result)
