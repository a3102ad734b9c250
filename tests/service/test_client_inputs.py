"""Client input checks that need no service: they fail before any request is sent."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli import main
from service.client import common
from tests.service.harness import ROOT

NOWHERE = "http://127.0.0.1:9"  # nothing listens: a request would exit 3


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_submit_spec_with_nan_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], constant: str
) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text('{"data": {"format": "synthetic"}, "steps": ' + constant + "}")
    assert main(["submit", str(spec), "--url", NOWHERE]) == 2
    err = capsys.readouterr().err
    assert err == f"towerboard: error: {spec} is not valid JSON: {constant} is not a JSON number\n"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[" * 100_000 + "]" * 100_000, "its brackets nest too deep (a job spec nests a few "
         "levels)"),
        ('{"steps": ' + "1" * 5000 + "}", "Exceeds the limit (4300 digits) for integer string "
         "conversion: value has 5000 digits"),
    ],
)  # fmt: skip
def test_submit_spec_python_cannot_read_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, said: str
) -> None:
    # Valid JSON that json.loads refuses with other than JSONDecodeError: a RecursionError
    # and a ValueError traceback, exit 1. Read before any request (the service is nowhere).
    spec = tmp_path / "deep.json"
    spec.write_text(text)
    assert main(["submit", str(spec), "--url", NOWHERE]) == 2
    assert capsys.readouterr().err == f"towerboard: error: cannot read the spec {spec}: {said}\n"


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_submit_spec_giving_a_key_twice_is_refused_with_its_places(
    tmp_path: Path, source: str
) -> None:
    # Sent as it is, the service would refuse it too; refused here first, with the file's
    # lines, before any request (the service is nowhere: a request would exit 3).
    text = (
        '{\n  "name": "a",\n  "data": {"format": "synthetic"},\n'
        '  "model": {"name": "mlp", "params": {"hidden": [8],\n\t"hidden": [16]}}\n}'
    )
    spec = tmp_path / "twice.json"
    spec.write_text(text)
    name = str(spec) if source == "file" else "-"
    result = subprocess.run(
        [sys.executable, "-m", "service.cli", "submit", name, "--url", NOWHERE],
        cwd=ROOT, input=text, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    shown = spec if source == "file" else "stdin"
    assert result.stderr == (
        f"towerboard: error: cannot read the spec {shown}: Duplicate key `model.params.hidden`: "
        "given at line 4 column 39 and again at line 5 column 2; give each key once, as only "
        "one of its values would be kept\n"
    )
    assert result.stdout == ""


@pytest.mark.parametrize("bad", ["abc#x", "abc?x", "a%2e", "a b", "../x"])
def test_job_ids_that_a_url_path_cannot_carry_are_usage_errors(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["delete", bad, "--url", NOWHERE])
    assert exited.value.code == 2
    assert f"expected a job id. Received: {bad!r}" in capsys.readouterr().err


def test_url_before_the_verb_is_the_verbs_url(capsys: pytest.CaptureFixture[str]) -> None:
    # `towerboard --url URL status` was a usage error naming the URL as an invalid verb.
    assert main(["--url", NOWHERE, "status"]) == 3
    assert f"cannot reach the service at {NOWHERE}" in capsys.readouterr().err


def test_tensorboard_stop_with_a_selection_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `--stop --jobs X` stopped the TensorBoard every job shares, the selection ignored;
    # refused before anything is sent (the service here is nowhere).
    assert main(["tensorboard", "--stop", "--jobs", "abc", "--open", "--url", NOWHERE]) == 2
    assert capsys.readouterr().err == (
        "towerboard: error: --stop stops the shared TensorBoard; it takes no --jobs, --open\n"
    )


def test_help_lists_the_exit_codes_and_the_variables(capsys: pytest.CaptureFixture[str]) -> None:
    # A script's author learnt what exit 3 or 4 meant only from the README.
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    listed = {int(code) for code in re.findall(r"^  (\d+) ", out, re.M)}
    assert listed == {value for name, value in vars(common).items() if name.startswith("EXIT_")}
    assert re.search(r"^  4    a request was sent and no answer came", out, re.M), out
    assert "$TOWERBOARD_URL" in out and "$TOWERBOARD_TOKEN" in out


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["status", "abc", "--state", "failed", "--limit", "5"], "--state, --limit go with the "
         "list of jobs (status without an ID); status abc shows that one job"),
        (["status", "abc", "--name", "x"], "--name goes with the list of jobs (status without "
         "an ID); status abc shows that one job"),
        (["checkpoints", "abc", "--download", "latest", "--json"], "--json goes with the list "
         "of checkpoints (without --download); a download is the archive itself"),
        (["metrics", "abc", "--json", "--no-header"], "--no-header goes with the CSV; --json "
         "has none"),
    ],
)  # fmt: skip
def test_options_the_command_would_not_use_are_usage_errors(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each was ignored without a word: `status ID --state failed` showed the job whatever
    # its state. Refused before anything is sent (the service here is nowhere).
    assert main([*args, "--url", NOWHERE]) == 2
    assert capsys.readouterr().err == f"towerboard: error: {said}\n"


@pytest.mark.parametrize("verb", [["export", "abc"], ["checkpoints", "abc", "--download", "40"]])
def test_an_archive_to_a_terminal_is_refused(verb: list[str]) -> None:
    # `export ID -o -` on a terminal filled it with gzip's bytes.
    controller, terminal = pty.openpty()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "service.cli", *verb, "-o", "-", "--url", NOWHERE],
            cwd=ROOT, stdout=terminal, stderr=subprocess.PIPE, text=True, timeout=60,
        )  # fmt: skip
    finally:
        os.close(terminal)
        os.close(controller)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        "towerboard: error: -o - writes the archive's bytes to standard output, which is a "
        "terminal here: pipe it (| tar xz) or redirect it (> FILE), or give -o a path\n"
    )


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"towerboard {version('towerboard')}\n"
