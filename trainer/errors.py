"""One line from an exception, for result.json and the service's job list.

Keras wraps an error raised in a layer in a page: "Exception encountered when calling
X.call().", the reason in ANSI bold, then the arguments the layer received; autograph
puts a traceback before the error; an op that fails as the step runs (a
`tf.debugging.assert_*`, a bad index) is "Graph execution error:" and the Python stack
that defined the op, every frame with its full path. `one_line` keeps the reason and
where it was raised. No TensorFlow here: it reads messages only.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_KERAS_CALL = re.compile(
    r"Exception encountered when calling ([\w.]+)\(\)\.\s*\n(.*?)(?:\n\s*Arguments received|\Z)",
    re.S,
)
# Keras's own prefix when it could not trace a functional model's layer.
_KERAS_INFER = re.compile(
    r"^Could not automatically infer the output shape.*?Error encountered:\s*", re.S
)
# The error itself, the last line of an autograph "in user code:" traceback.
_RAISED = re.compile(r"^\s*(\w+(?:Error|Exception|Exit)): (.*)$")
# A TensorFlow op's failure at run time: the node, the stack that defined it, the reason.
_NODE = re.compile(r"^Detected at node (\S+) defined at \(most recent call last\):$")
_FRAME = re.compile(r'^\s*File "(?:[^"]*/)?([^"/]+)", line (\d+), in (\S+)$')
_NOISE = re.compile(r"^(?:Graph execution error:|\s*\[\[\{\{node .*\}\}\]\].*|\s*\[Op:\S+\])$")


def one_line(error: BaseException) -> str:
    """`Type: reason` on one line, without ANSI codes, Keras's arguments or a traceback."""
    kind, text = type(error).__name__, _ANSI.sub("", str(error))
    if text.lstrip().startswith("in user code:"):
        lines = text.splitlines()
        for i, line in enumerate(lines):
            raised = _RAISED.match(line)
            if raised:  # the error after the traceback; Keras's layer page may follow it
                kind, text = raised.group(1), "\n".join([raised.group(2), *lines[i + 1 :]])
                break
    text, where = _graph_error(text)
    call = _KERAS_CALL.search(text)
    if call:
        where = f" (in {call.group(1)}())"
        text = _KERAS_INFER.sub("", call.group(2).strip())
    reason = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return f"{kind}: {reason}{where}"


_FUNCTION_NODE = re.compile(r"\{\{function_node [^}]*\}\}\s*")
_OP_SUFFIX = re.compile(r"\s*\[Op:\w+\].*$")


def op_reason(message: str) -> str:
    """An eager op's message (an `OpError.message`) without the function and op names
    TensorFlow wraps around it: "{{function_node __wrapped__RestoreV2_...}} Read less bytes
    than requested [Op:RestoreV2]" is "Read less bytes than requested". Its first line."""
    lines = message.strip().splitlines()
    first = _FUNCTION_NODE.sub("", lines[0]) if lines else ""
    return _OP_SUFFIX.sub("", first).strip()


def _graph_error(text: str) -> tuple[str, str]:
    """A run-time op failure's reason, and where: its node and the last frame of the stack
    that defined it (the user's line, by file name: the full paths are in the log)."""
    node = frame = None
    kept = []
    for line in text.splitlines():
        if match := _NODE.match(line):
            node = match.group(1)
        elif match := _FRAME.match(line):
            frame = match
        elif not _NOISE.match(line):
            kept.append(line)
    if node is None:
        return text, ""
    where = f"at node {node}"
    if frame is not None:
        where += f", {frame.group(1)} line {frame.group(2)}, in {frame.group(3)}"
    return "\n".join(kept), f" ({where})"


def innermost_frame(
    error: BaseException, in_file: Callable[[str], bool]
) -> traceback.FrameSummary | None:
    """The innermost frame of `error`'s traceback whose file `in_file` takes, so a failure
    in a library that file's code called gives the line that called it; None when none."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if in_file(frame.filename):
            return frame
    return None
