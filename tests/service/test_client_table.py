"""How the CLI shows jobs: tables that line up by the columns a terminal gives each
character, the reasons and summaries in them."""

from __future__ import annotations

import io

from service.client.display import end_reason, shortened, summary, table, width


def test_wide_and_combining_characters_keep_the_columns_in_line() -> None:
    # A name in Chinese, padded by its length, pushed every column after it out of line.
    rows = [
        ["NAME", "STATE"],
        ["训练任务", "running"],
        ["café", "queued"],
        ["e\u0301t\u00e9", "failed"],
    ]
    out = io.StringIO()
    table(rows, out)
    lines = out.getvalue().splitlines()
    # Each state starts at the same terminal column: 8 (the widest name) + 2.
    for line, (name, state) in zip(lines, rows, strict=True):
        assert line == name + " " * (8 - width(name)) + "  " + state
    assert [width(name) for name, _ in rows] == [4, 8, 4, 3]


def test_the_last_column_is_cut_to_the_terminal() -> None:
    # A failure's reason, the table's last column, wrapped under its row on a terminal.
    rows = [["ID", "WHY"], ["abc", "x" * 100], ["d", "short"]]
    out = io.StringIO()
    table(rows, out, last_within=30)
    lines = out.getvalue().splitlines()
    assert lines == ["ID   WHY", "abc  " + "x" * 24 + "…", "d    short"]
    assert max(width(line) for line in lines) == 30
    # Never below 20 columns, however wide the others are.
    out = io.StringIO()
    table([["a" * 50, "b" * 40]], out, last_within=30)
    assert out.getvalue() == "a" * 50 + "  " + "b" * 19 + "…\n"


def test_shortened_counts_terminal_columns() -> None:
    assert shortened("训练任务", 8) == "训练任务"
    assert shortened("训练任务", 7) == "训练任…"  # 6 columns and the ellipsis
    assert shortened("abc", 2) == "a…"


def test_end_reason_is_its_first_line_without_the_state() -> None:
    assert end_reason({"error": {"reason": "Failed: loss is nan at step 7\nmore"}}) == (
        "loss is nan at step 7"
    )
    assert end_reason({"error": {"reason": "cancelled: stopped by a user"}}) == "stopped by a user"
    assert end_reason({"error": {"reason": "bad\tname"}}) == "bad\\tname"  # printed, not a tab
    assert end_reason({"error": None}) == end_reason({}) == ""


def test_a_summary_leaves_out_the_step_of_a_job_that_took_none() -> None:
    # A job failed at its set-up (a model that cannot be built) summed up "step -".
    failed = {"id": "abc", "state": "failed", "progress": None, "error": {"reason": "bad model"}}
    assert summary(failed) == "abc failed: error: bad model"
    assert summary({"id": "abc", "state": "cancelled"}) == "abc cancelled"
    ran = {"id": "abc", "state": "succeeded", "progress": {"step": 40, "total": 40}}
    assert summary(ran) == "abc succeeded: step 40/40"


def test_a_summary_marks_the_training_batch_figures_train() -> None:
    # "loss X, accuracy 98.4%, eval accuracy 94.9%" read the batch's accuracy as the model's.
    job = {
        "id": "abc",
        "state": "succeeded",
        "progress": {"step": 40, "total": 40, "loss": 0.25, "accuracy": 0.984},
        "eval": {"accuracy": 0.949},
    }
    assert summary(job) == (
        "abc succeeded: step 40/40, train loss 0.25, train accuracy 98.4%, eval accuracy 94.9%"
    )
