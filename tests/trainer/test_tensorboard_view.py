"""A real job read back through a real TensorBoard's HTTP API, as a user's browser reads it.

One tiny worker run (two towers on logical CPU devices) and one `python -m tensorboard.main`
over its `tb/` (the Rust data server TensorBoard uses by default): every tag is where the
spec says, at its cadence, with its description; the graph shows the towers; the profile
plugin lists the trace and opens it in the trace viewer.
"""

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service.harness import free_port
from tests.trainer.test_run import TINY, run_worker, with_

STEPS = 25
SPEC = with_(
    TINY,
    model={"name": "cnn", "params": {"dropout": 0.2}},
    steps=STEPS,
    optimizer={
        "name": "sgd",
        "learning_rate": 0.1,
        "warmup_steps": 10,
        "schedule": {
            "name": "exponential_decay",
            "decay_steps": 5,
            "decay_rate": 0.5,
            "staircase": True,
        },
    },  # fmt: skip
    eval={"every_steps": 10, "batches": 2},
    summaries={
        "scalars_every": 5,
        "histograms_every": 10,
        "images_every": 10,
        "max_images": 3,
        "trace_steps": [6, 7],
    },
)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    job_dir = tmp_path_factory.mktemp("view") / "job"
    code, _, log = run_worker(job_dir, SPEC)
    assert code == 0, log
    return job_dir


@pytest.fixture(scope="module")
def board(job: Path) -> Iterator[httpx.Client]:
    port = free_port()
    log = job.parent / "tensorboard.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", str(job / "tb")]
            + ["--host", "127.0.0.1", "--port", str(port), "--reload_interval", "1"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                tags = client.get("/data/plugin/scalars/tags").json()
                if {"train", "eval"} <= tags.keys() and "loss" in tags["eval"]:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "TensorBoard did not list the job's runs"
            time.sleep(0.5)
        yield client
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def steps_of(board: httpx.Client, plugin: str, run: str, tag: str) -> list[int]:
    route = {"scalars": "scalars", "histograms": "histograms"}[plugin]
    rows = board.get(f"/data/plugin/{plugin}/{route}", params={"run": run, "tag": tag}).json()
    return [row[1] for row in rows]


def test_every_tag_is_there_with_its_description(board):
    scalars = board.get("/data/plugin/scalars/tags").json()
    histograms = board.get("/data/plugin/histograms/tags").json()
    images = board.get("/data/plugin/images/tags").json()
    layers = {"conv2d", "conv2d_1", "dense", "logits"}
    assert set(scalars["train"]) == {
        "loss", "accuracy", "learning_rate", "grad_norm", "examples_per_sec", "step_time_ms",
        "tower_0/loss", "tower_1/loss", "tower_0/compute_ms", "tower_1/compute_ms",
    } | {f"zero_fraction/{layer}" for layer in layers - {"logits"}}  # fmt: skip
    assert set(scalars["eval"]) == {"loss", "accuracy"}
    assert set(histograms["train"]) == {
        f"{kind}/{layer}/{var}"
        for kind in ("weights", "gradients")
        for layer in layers
        for var in ("kernel", "bias")
    } | {f"activations/{layer}" for layer in layers}  # the `cnn`'s three ReLUs, its logits
    assert set(images["train"]) == {"tower_0/inputs", "tower_1/inputs"}
    assert images["train"]["tower_0/inputs"]["samples"] == 3
    for plugin in (scalars, histograms, images):
        for run, tags in plugin.items():
            for tag, info in tags.items():
                assert info["description"].startswith("<p>"), (run, tag, info)


def test_values_come_at_the_spec_cadences(board):
    every_5 = list(range(5, STEPS, 5))
    # The first step's and the last's too.
    assert steps_of(board, "scalars", "train", "loss") == [1, *every_5, STEPS]
    assert steps_of(board, "scalars", "train", "tower_1/loss") == steps_of(
        board, "scalars", "train", "loss"
    )
    # Evals at their cadence and after the last step.
    assert steps_of(board, "scalars", "eval", "accuracy") == [10, 20, STEPS]
    assert steps_of(board, "histograms", "train", "gradients/dense/kernel")[:3] == [1, 10, 20]
    # The trace of steps 6 and 7 ends at step 7.
    assert steps_of(board, "scalars", "train", "tower_0/compute_ms") == [7]


def test_accuracy_and_learning_rate_read_back_right(board):
    def values(tag: str) -> dict[int, float]:
        rows = board.get("/data/plugin/scalars/scalars", params={"run": "train", "tag": tag})
        return {step: value for _, step, value in rows.json()}

    assert all(0.0 <= value <= 1.0 for value in values("accuracy").values())
    # Step s is the s-th update: warm-up to 0.1 over steps 1-10, then halved every 5 steps.
    expected = {
        s: 0.1 * s / 10 if s <= 10 else 0.1 * 0.5 ** ((s - 11) // 5) for s in (1, *range(5, 26, 5))
    }
    assert values("learning_rate") == pytest.approx(expected)


def test_the_graph_shows_each_tower(board):
    graph = board.get("/data/plugin/graphs/graph", params={"run": "train"}).text
    for scope in ("tower_0/", "tower_1/", "gradient_tape/tower_0/", "average/"):
        assert f'name: "{scope}' in graph, scope


def test_the_profile_plugin_opens_the_trace(board):
    runs = board.get("/data/plugin/profile/runs").json()
    assert len(runs) == 1 and runs[0].endswith("_steps_6-7"), runs  # named by its steps
    tools = board.get("/data/plugin/profile/run_tools", params={"run": runs[0]}).json()
    trace_viewer = next(t for t in tools if t.startswith("trace_viewer"))
    [host] = board.get(
        "/data/plugin/profile/hosts", params={"run": runs[0], "tag": trace_viewer}
    ).json()
    data = board.get(
        "/data/plugin/profile/data",
        params={"run": runs[0], "tag": trace_viewer, "host": host["hostname"]},
    ).json()
    names = {frame["name"] for frame in data["stackFrames"].values()}
    for scope in ("tower_0/", "tower_1/", "gradient_tape/tower_1/"):
        assert any(name.startswith(scope) for name in names), scope


def test_the_profile_overview_page_finds_the_traced_steps(board):
    # The overview page and input-pipeline analyzer find steps by their `step_num` markers
    # alone: without them they said "No step marker observed" and a step time of 0 ms.
    [run] = board.get("/data/plugin/profile/runs").json()
    [host] = board.get(
        "/data/plugin/profile/hosts", params={"run": run, "tag": "overview_page"}
    ).json()
    page = board.get(
        "/data/plugin/profile/data",
        params={"run": run, "tag": "overview_page", "host": host["hostname"]},
    ).text
    assert "No step marker observed" not in page
    [average] = re.findall(r'"steptime_ms_average":\s*"?([0-9.]+)', page)
    assert float(average) > 0, page[:2000]
