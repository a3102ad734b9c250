"""The README's "Using a trained model" snippets, run as a user runs them: in a fresh Python,
on the export and checkpoint archives the service serves of a real worker's job on IDX
files of uint8 pixels (MNIST's kind), with the job's EMA."""

import json
import os
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import numpy as np

from service.archives import Archive
from service.checkpoints import list_checkpoints, open_archive
from service.exports import open_export
from tests.test_docs import README, _fenced, _section, _text
from tests.trainer.test_data import write_idx_pair
from tests.trainer.test_run import REPO, run_worker
from trainer.rundir import RunDir
from trainer.spec import JobSpec, without_unread

CLASSES = 10


def _idx_folder(folder: Path, n: int = 600) -> None:
    """Learnable 28x28 digits of a kind: a pattern per class, noise on each image."""
    rng = np.random.default_rng(0)
    patterns = rng.integers(0, 256, (CLASSES, 28, 28))
    labels = rng.integers(0, CLASSES, n)
    noise = rng.integers(-60, 61, (n, 28, 28))
    images = np.clip(patterns[labels] + noise, 0, 255).astype(np.uint8)
    write_idx_pair(folder, "t10k", images, labels.astype(np.uint8))


def _extract(archive_bytes: bytes, folder: Path) -> None:
    folder.mkdir()
    with tarfile.open(fileobj=BytesIO(archive_bytes), mode="r:gz") as tar:
        tar.extractall(folder, filter="data")


def _read_archive(archive: Archive | None) -> bytes:
    assert archive is not None, "the service would serve a 404: there is nothing to archive"
    try:
        return b"".join(archive.stream())
    finally:
        archive.close()


def test_readme_snippets_predict_from_the_export_and_restore_the_checkpoint(tmp_path: Path):
    _idx_folder(tmp_path / "mnist")
    spec = {
        "name": "digits",
        "model": {"name": "mlp", "params": {"hidden": [64]}},
        "data": {"format": "idx", "path": str(tmp_path / "mnist")},
        "towers": 2,
        "batch_size": 32,
        "steps": 40,
        "ema_decay": 0.9,
        # 2 batches of 32: 64 of the 120 held out, so the snippet's slice to them counts.
        "eval": {"every_steps": 20, "batches": 2},
        "summaries": {"histograms_every": 0, "images_every": 0, "trace_steps": []},
    }
    # As the service stores it at submit, and so serves it in its archives: every default.
    spec = without_unread(JobSpec.model_validate(spec).model_dump(mode="json"))
    job_dir = tmp_path / "job"
    code, result, log = run_worker(job_dir, spec)
    assert code == 0, log
    assert result["eval"]["examples"] == 64

    # The archives as the service serves them (`GET .../export`, `.../checkpoints/latest`,
    # data.json from the job's progress.data: its worker's start line), extracted as the
    # README's bash block does.
    user = tmp_path / "user"
    user.mkdir()
    run = RunDir(job_dir)
    spec_json = (job_dir / "spec.json").read_bytes()
    _extract(_read_archive(open_export(run, spec_json)), user / "model")
    lines = [json.loads(line) for line in (job_dir / "progress.jsonl").read_text().splitlines()]
    data = json.dumps(next(line["data"] for line in lines if line["event"] == "start"))
    latest = list_checkpoints(run)[-1]
    _extract(_read_archive(open_archive(latest, spec_json, data.encode())), user / "ck")

    section = _section(_text(README), "### Using a trained model")
    blocks = [body for language, body in _fenced(section) if language == "python"]
    assert len(blocks) == 2, "the section's two snippets: the export, then the checkpoint"
    check = (
        "np.save('export_logits.npy', out['logits'].numpy())\n"
        "np.save('checkpoint_logits.npy', logits.numpy())\n"
        "json.dump({'accuracy': accuracy, 'about': about}, open('seen.json', 'w'))\n"
    )
    (user / "snippets.py").write_text("\n".join([*blocks, check]))
    ran = subprocess.run(
        [sys.executable, "snippets.py"],
        cwd=user,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-4000:]

    seen = json.loads((user / "seen.json").read_text())
    assert seen["accuracy"] > 0.5, "the model learned, so its accuracy tells models apart"
    # The snippet's examples are the job's eval's: its accuracy, up to an example that the
    # eval's batches of 32 and the snippet's one batch round to the other class.
    assert abs(seen["accuracy"] - result["eval"]["accuracy"]) <= 1 / 64 + 1e-9
    assert f"the job's eval said {result['eval']['accuracy']:.4f}" in ran.stdout
    about = seen["about"]
    assert about["inputs"]["images"]["shape"] == [None, 28, 28, 1]
    assert "divide yours by 255" in about["inputs"]["images"]["scaling"]
    assert (about["classes"], about["weights"], about["step"]) == (CLASSES, "ema", 40)
    # The checkpoint restored with its averages is the model the export holds.
    np.testing.assert_allclose(
        np.load(user / "checkpoint_logits.npy"), np.load(user / "export_logits.npy"), atol=1e-4
    )
    assert "dense" in ran.stdout  # the weights' paths and shapes it printed
