"""The job's spec as TensorBoard hyperparameters (`trainer.hparams`): one per leaf the job
trains by, named by its path; the options nothing reads, and how it is watched and kept,
left out. (A real TensorBoard reads them back in test_tensorboard_view.py.)"""

import subprocess
import sys

from trainer.hparams import MOST, TEXT_CHARS, spec_hparams
from trainer.spec import JobSpec

DATA = {"format": "synthetic", "params": {"shape": [4, 4], "classes": 3, "size": 64}}


def hparams_of(raw: dict) -> dict:
    values, dropped = spec_hparams(JobSpec.model_validate(raw).model_dump(mode="json"))
    assert dropped == 0
    return values


def test_each_leaf_the_job_trains_by_is_one_named_by_its_path() -> None:
    values = hparams_of(
        {
            "name": "lr-sweep-3",
            "data": DATA,
            "model": {"name": "cnn", "params": {"dropout": 0.2}},
            "optimizer": {"name": "adam", "learning_rate": 0.01},
            "towers": 2,
            "batch_size": 64,
            "ema_decay": 0.99,
        }
    )
    assert values["name"] == "lr-sweep-3"
    assert values["model.name"] == "cnn"
    assert values["model.params.dropout"] == 0.2
    assert values["model.params.filters"] == "[32,64]"  # a list: its JSON
    assert values["optimizer.learning_rate"] == 0.01
    assert values["optimizer.beta_1"] == 0.9  # read by adam
    assert values["optimizer.schedule.name"] == "constant"
    assert values["data.augment.flip_left_right"] is False
    assert values["data.params.shape"] == "[4,4]"
    assert (values["towers"], values["batch_size"], values["ema_decay"]) == (2.0, 64.0, 0.99)
    assert values["deterministic"] is False


def test_what_nothing_reads_and_how_the_job_is_watched_are_left_out() -> None:
    values = hparams_of(
        {
            "data": DATA,
            "optimizer": {"name": "sgd", "learning_rate": 0.1},
            "steps": 500,
            "summaries": {"scalars_every": 5},
        }
    )
    # sgd reads no momentum or beta; the schedule, constant, reads no decay_steps.
    assert not [
        name for name in values if name.startswith(("optimizer.momentum", "optimizer.beta"))
    ]
    assert not [name for name in values if name.startswith("optimizer.schedule.decay")]
    for prefix in ("priority", "eval", "summaries", "checkpoint", "steps", "epochs"):
        assert not [name for name in values if name.split(".")[0] == prefix], prefix
    assert "data.shuffle_buffer" not in values
    assert "clip_norm" not in values and "ema_decay" not in values  # unset: nothing to compare


def test_a_custom_models_params_are_cut_to_a_tables_worth(monkeypatch) -> None:
    params = {"words": "w" * 10_000, **{f"p{i:03d}": i for i in range(200)}}
    spec = JobSpec.model_validate({"data": DATA, "model": {"name": "my:model", "params": params}})
    values, dropped = spec_hparams(spec.model_dump(mode="json"))
    words = values["model.params.words"]
    assert isinstance(words, str) and len(words) == TEXT_CHARS and words.endswith("…")
    # The first MOST in the spec's order; the rest counted.
    assert len(values) == MOST and "model.params.p000" in values
    monkeypatch.setattr("trainer.hparams.MOST", 10_000)
    every, none_dropped = spec_hparams(spec.model_dump(mode="json"))
    assert none_dropped == 0 and dropped == len(every) - MOST > 0
    assert list(values) == list(every)[:MOST]


def test_an_integer_a_float_cannot_hold_is_its_digits() -> None:
    # A custom builder's params may hold any JSON integer: past about 1e308 `float` raised
    # OverflowError, which failed the job as its worker started; past 2**53 it rounded,
    # and two seeds one apart showed as one value.
    params = {"huge": 10**400, "seed": 2**53 + 1, "near": 2**53 - 1, "negative": -(2**60)}
    spec = JobSpec.model_validate({"data": DATA, "model": {"name": "my:model", "params": params}})
    values, _ = spec_hparams(spec.model_dump(mode="json"))
    assert values["model.params.huge"] == "1" + "0" * (TEXT_CHARS - 2) + "…"
    assert values["model.params.seed"] == "9007199254740993"
    assert values["model.params.near"] == float(2**53 - 1)
    assert values["model.params.negative"] == str(-(2**60))


def test_importing_it_imports_no_tensorflow() -> None:
    code = "import sys, trainer.hparams; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
