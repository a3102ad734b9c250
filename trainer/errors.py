"""One line from an exception, for result.json and the service's job list.

Keras wraps an error raised in a layer in a page: "Exception encountered when calling
X.call().", the reason in ANSI bold, then the arguments the layer received; autograph
puts a traceback before the error. `one_line` keeps the reason and where it was raised.
No TensorFlow here: it reads messages only.
"""

from __future__ import annotations

import re

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


def one_line(error: BaseException) -> str:
    """`Type: reason` on one line, without ANSI codes, Keras's arguments or a traceback."""
    kind, text = type(error).__name__, _ANSI.sub("", str(error))
    where = ""
    if text.lstrip().startswith("in user code:"):
        lines = text.splitlines()
        for i, line in enumerate(lines):
            raised = _RAISED.match(line)
            if raised:  # the error after the traceback; Keras's layer page may follow it
                kind, text = raised.group(1), "\n".join([raised.group(2), *lines[i + 1 :]])
                break
    call = _KERAS_CALL.search(text)
    if call:
        where = f" (in {call.group(1)}())"
        text = _KERAS_INFER.sub("", call.group(2).strip())
    reason = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return f"{kind}: {reason}{where}"
