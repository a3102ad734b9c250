"""What each TensorBoard tag of a job means: the description TensorBoard shows with its chart.

Kept apart from `summaries.py` (which writes) and from the controller (which names the
tags), so the words a user reads are in one place. No TensorFlow: a table and a lookup.
A tag this table does not know gets no description (TensorBoard then shows the tag alone).
"""

from __future__ import annotations

import re

_EMA = "with the EMA weights when `ema_decay` is set"
# How a step computes its loss and accuracy, and how an eval does: charted together, a
# train curve below its eval one (dropout, augmentation) looked like a fault otherwise.
_TRAINING = (
    "its inputs as `data.augment` made them, dropout on, batch norm's batch statistics, the "
    "weights before its update"
)
_INFERENCE = "in inference (inputs not augmented, dropout off, batch norm's moving statistics)"

# (sub-directory, tag pattern, description); `{i}` is the tower, `{name}` the variable.
_TABLE: list[tuple[str, str, str]] = [
    ("train", r"loss",
     "Mean loss of this step's global batch, over every tower, as the step trained on it: "
     f"{_TRAINING} (cross-entropy; the L2 weight decay and a custom model's own regularizer "
     "losses are not in it). The `eval` run's loss, in the same chart, is in inference."),
    ("train", r"accuracy",
     "Fraction of this step's global batch classified right (0 to 1), as the step trained "
     f"on it: {_TRAINING}. The `eval` run's accuracy, in the same chart, is in inference."),
    ("train", r"learning_rate",
     "Learning rate this step's update used: the linear warm-up, then the schedule."),
    ("train", r"grad_norm",
     "Global L2 norm of this step's gradient, averaged over the towers, weight decay "
     "included, before clipping."),
    ("train", r"loss_scale",
     "Loss scale this step multiplied the loss by (a model computing in float16 only: "
     "dynamic loss scaling, as Keras's LossScaleOptimizer does it). Halved after a step "
     "whose scaled gradients overflowed (that step's update was skipped), doubled after "
     "2000 finite steps in a row."),
    ("train", r"examples_per_sec",
     "Examples trained per second over the steps since the previous point, timing the "
     "steps alone (input, the step, reading its loss): summaries, evals and checkpoints "
     "are left out."),
    ("train", r"step_time_ms",
     "Mean milliseconds a step took over the steps since the previous point (input, the "
     "step, reading its loss): summaries, evals and checkpoints are left out."),
    ("train", r"tower_(?P<i>\d+)/loss",
     "Mean loss of the examples tower {i} trained on this step (no point where its shard "
     "was empty)."),
    ("train", r"tower_(?P<i>\d+)/compute_ms",
     "Milliseconds tower {i}'s ops ran a step, forward and backward, measured in the device "
     "trace that ended at this step (on a GPU, its kernels' time on the device)."),
    ("train", r"tower_(?P<i>\d+)/memory_mb",
     "Peak MiB TensorFlow's allocator held on tower {i}'s GPU since the previous point: "
     "its tensors (the weights, the activations a step keeps for its backward pass), not "
     "what the process or the driver reserves."),
    ("train", r"tower_(?P<i>\d+)/inputs",
     "Images tower {i} trained on at this step, after augmentation (the first "
     "`summaries.max_images` of its shard)."),
    ("train", r"weights/(?P<name>.+)", "Values of `{name}` after this step's update."),
    ("train", r"gradients/(?P<name>.+)",
     "Gradient of `{name}` at this step, averaged over the towers, weight decay included, "
     "before clipping."),
    ("train", r"activations/(?P<name>.+)",
     "Outputs of layer `{name}` for tower 0's first examples of this step's batch (at "
     "most 32), in inference (dropout off, batch norm's moving statistics), with the "
     "weights as this step left them. A ReLU's units that put out 0 for every example "
     "are dead: they train no more."),
    ("train", r"zero_fraction/(?P<name>.+)",
     "Fraction of layer `{name}`'s outputs that are exactly 0, of those its "
     "`activations/{name}` histogram shows at this step (a ReLU's units switched off). "
     "One that climbs toward 1 is a layer going dead."),
    ("eval", r"loss", f"Mean loss over the held-out eval batches, {_INFERENCE}, {_EMA}."),
    ("eval", r"accuracy",
     f"Fraction of the held-out eval examples classified right (0 to 1), {_INFERENCE}, {_EMA}."),
]  # fmt: skip

_COMPILED = [(subdir, re.compile(pattern), text) for subdir, pattern, text in _TABLE]


def describe(subdir: str, tag: str) -> str:
    """The description of `tag` under `tb/<subdir>`, or '' for a tag the table lacks."""
    for where, pattern, text in _COMPILED:
        if where == subdir and (match := pattern.fullmatch(tag)):
            return text.format(**match.groupdict())
    return ""
