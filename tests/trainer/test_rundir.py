"""The run directory's files are JSON any reader takes: no NaN or Infinity in them; and
progress.jsonl is read past whatever a crashed host left in it. A profile request the
service writes while the worker takes the last one is kept."""

import json
import math
import os
from pathlib import Path

import pytest

from tests.trainer.progress_lines import progress_lines
from tests.trainer.test_run import run_custom_model
from trainer.rundir import (
    ProgressWriter,
    RunDir,
    evaluated_at,
    json_object,
    reported_at,
    write_json_atomic,
)

REPO = Path(__file__).resolve().parents[2]


def strict_loads(text: str):
    """json.loads as JSON is: Python's own reader takes NaN and Infinity, browsers do not."""

    def refuse(constant: str):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_write_json_atomic_writes_non_finite_numbers_as_null(tmp_path: Path) -> None:
    payload = {"eval": {"loss": math.nan, "accuracy": 0.5}, "steps": [1.0, math.inf, -math.inf]}

    write_json_atomic(tmp_path / "result.json", payload)

    assert strict_loads((tmp_path / "result.json").read_text()) == {
        "eval": {"loss": None, "accuracy": 0.5},
        "steps": [1.0, None, None],
    }


def test_progress_lines_write_non_finite_numbers_as_null(tmp_path: Path) -> None:
    writer = ProgressWriter(tmp_path / "progress.jsonl")
    writer.write("eval", step=2, eval_loss=math.nan, eval_accuracy=0.25)
    writer.close()

    line = strict_loads((tmp_path / "progress.jsonl").read_text())
    assert (line["eval_loss"], line["eval_accuracy"]) == (None, 0.25)
    assert progress_lines(tmp_path / "progress.jsonl")[0]["eval_loss"] is None


@pytest.mark.parametrize(
    "cut",
    [
        b'{"event": "progress", "loss": 0.5, "st',  # a disk that filled mid-line
        b"\x00" * 4096,  # a crashed host's NULs
    ],
)
def test_a_run_after_a_line_cut_short_has_its_own_lines_read(tmp_path: Path, cut: bytes) -> None:
    # Appended to the cut line, the next run's `start` line was part of it and was
    # skipped with it: the service never saw the job restart from its checkpoint.
    path = tmp_path / "progress.jsonl"
    path.write_bytes(b'{"event": "start", "step": 0, "time": 1}\n' + cut)
    writer = ProgressWriter(path)
    writer.write("start", step=5, total=20)
    writer.write("progress", step=6, total=20)
    writer.close()

    lines = progress_lines(path)
    assert [(line["event"], line["step"]) for line in lines] == [
        ("start", 0),
        ("start", 5),
        ("progress", 6),
    ]
    # A file that ends a line, or is empty, is appended to as it is.
    before = path.read_bytes()
    ProgressWriter(path).close()
    ProgressWriter(tmp_path / "new.jsonl").close()
    assert path.read_bytes() == before
    assert (tmp_path / "new.jsonl").read_bytes() == b""


# Lines that hold no JSON object, on which `json.loads` raises other than JSONDecodeError:
# a crashed host's run of NULs (the worker's next line appended after it) reads as UTF-32,
# a UTF-16 byte-order mark, brackets nested past the parser's depth, too many digits.
JUNK = [
    b"\x00" * 4093 + b'{"event": "eval", "step": 8}',
    b"\xff\xfe{",
    b'{"event": "eval", "step": ' + b"[" * 10_000,
    b'{"event": "eval", "step": 1' + b"0" * 5000 + b"}",
]


@pytest.mark.parametrize("junk", JUNK, ids=["nul-run", "utf-16", "nested", "digits"])
def test_json_object_of_junk_is_none(junk: bytes) -> None:
    assert json_object(junk) is None
    assert json_object(b"[1, 2]") is None  # JSON, but no object
    assert json_object(b'{"event": "eval"}') == {"event": "eval"}


def test_progress_readers_read_past_what_a_crashed_host_left(tmp_path: Path) -> None:
    # A resume from the final checkpoint (its worker died while exporting) reads the last
    # report for its result: it failed with UnicodeDecodeError (exit 1) on a run of NULs.
    path = tmp_path / "progress.jsonl"
    path.write_bytes(
        b'{"event": "eval", "step": 4}\n{"event": "progress", "step": 5}\n'
        + b"".join(junk + b"\n" for junk in JUNK)
        + b"\x00" * 4093  # and a run of NULs the file ends with
    )
    assert reported_at(path, 5) == {"event": "progress", "step": 5}
    assert evaluated_at(path, 4)
    assert not evaluated_at(path, 8)  # the line after the NULs is lost with them


def test_reported_at_finds_a_steps_numbers_far_back_or_in_a_cancelled_end(tmp_path: Path) -> None:
    # A job finished at the checkpoint of a run that failed 500 steps later: the report of
    # the checkpoint's step lies far before the file's end (the tail alone missed it).
    path = tmp_path / "progress.jsonl"
    progress = ProgressWriter(path)
    progress.write("progress", step=100, loss=0.5, accuracy=0.75, examples_per_sec=900.0)
    for step in range(101, 3000):
        progress.write("progress", step=step, loss=0.25, accuracy=0.5)
    progress.write("end", step=3000, outcome="failed", phase="done")
    # A run cancelled at 3000 says its step's numbers in its end line; one cancelled
    # before any step had none to say.
    progress.write("end", step=3000, outcome="cancelled", loss=0.125, accuracy=0.875)
    progress.write("end", step=3001, outcome="cancelled", loss=None, accuracy=None)
    # A succeeded run's end says its last report's loss, but not its speed: the report is
    # the one that says the step.
    progress.write("progress", step=3002, loss=0.5, accuracy=0.5, examples_per_sec=800.0)
    progress.write("end", step=3002, outcome="succeeded", loss=0.5, accuracy=0.5)
    progress.close()
    assert path.stat().st_size > 64 * 1024
    at_100 = reported_at(path, 100)
    assert at_100 is not None and at_100["event"] == "progress"
    assert (at_100["loss"], at_100["accuracy"], at_100["examples_per_sec"]) == (0.5, 0.75, 900.0)
    at_3000 = reported_at(path, 3000)
    assert at_3000 is not None and (at_3000["event"], at_3000["loss"]) == ("end", 0.125)
    assert reported_at(path, 3001) is None
    at_3002 = reported_at(path, 3002)
    assert at_3002 is not None and at_3002["examples_per_sec"] == 800.0
    assert reported_at(path, 5000) is None
    assert reported_at(tmp_path / "missing.jsonl", 1) is None


@pytest.mark.slow
def test_worker_whose_eval_loss_is_nan_writes_json_files(tmp_path: Path) -> None:
    # A model that answers inf only in inference: training goes on, eval loss is NaN, and
    # result.json and progress.jsonl held `NaN`, which JSON.parse and jq refuse.
    code, _, log = run_custom_model(
        tmp_path,
        "evalinf",
        "import keras\n"
        "class Blowup(keras.layers.Layer):\n"
        "    def call(self, x, training=False):\n"
        "        return x if training else x * float('inf')\n"
        "def build(input_shape, num_classes):\n"
        "    inputs = keras.Input(input_shape)\n"
        "    x = keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs))\n"
        "    return keras.Model(inputs, Blowup()(x))\n",
        data={"format": "synthetic", "params": {"shape": [4, 4], "classes": 2, "size": 64}},
        batch_size=8,
        steps=2,
        eval={"every_steps": 2, "batches": 1},
    )
    job_dir = tmp_path / "job"
    assert code == 0, log
    result = strict_loads((job_dir / "result.json").read_text())
    assert result["eval"]["loss"] is None and 0.0 <= result["eval"]["accuracy"] <= 1.0
    lines = [strict_loads(line) for line in (job_dir / "progress.jsonl").read_text().splitlines()]
    assert [line["eval_loss"] for line in lines if line["event"] == "eval"] == [None]


def test_a_profile_request_written_while_the_worker_takes_one_is_kept(tmp_path, monkeypatch):
    # The worker read the file, then deleted it: a request the service wrote in between
    # (after telling its client the trace would cover it) was deleted unseen.
    run = RunDir(tmp_path)
    write_json_atomic(run.profile_request, {"steps": 3})
    real_replace = os.replace

    def replace_then_service_writes(src, dst):  # the service's write, in the window
        real_replace(src, dst)
        if str(dst).endswith(".taken"):
            write_json_atomic(run.profile_request, {"steps": 50})

    monkeypatch.setattr(os, "replace", replace_then_service_writes)
    assert json.loads(run.take_profile_request() or "") == {"steps": 3}
    monkeypatch.setattr(os, "replace", real_replace)
    assert json.loads(run.take_profile_request() or "") == {"steps": 50}
    assert run.take_profile_request() is None
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "content",
    [
        b"[]",
        b"3",
        b'"succeeded"',
        b"null",
        b"{not json",
        b'{"outcome": "\xff"}',
        b"",
        b"[" * 100_000,
    ],
    ids=["list", "number", "string", "null", "not-json", "not-utf8", "empty", "nested"],
)
def test_read_result_that_is_no_json_object_is_none(tmp_path: Path, content: bytes) -> None:
    # A custom model runs in the worker with the run directory as its working directory,
    # so result.json may hold anything: a list or a number came back as the result (typed
    # a dict, and `.get` on it raised in the service), and bytes that are no UTF-8 raised.
    run = RunDir(tmp_path)
    run.result.write_bytes(content)
    assert run.read_result() is None


def test_read_result_reads_an_object(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert run.read_result() is None  # none written
    run.result.write_text(json.dumps({"outcome": "succeeded", "steps": 3}))
    assert run.read_result() == {"outcome": "succeeded", "steps": 3}
