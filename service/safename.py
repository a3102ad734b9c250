"""A job's name as part of a file or folder name: the folder of its runs in the service's
TensorBoard (`service.tensorboard.view_name`) and the name a download of its metrics is
saved as (`service.downloads.job_file_name`). Standard library only."""

from __future__ import annotations

import unicodedata

# The name's share of the folder, at most: a run's name is shown whole in the run
# selector, its id last; and a folder name has at most 255 bytes.
_NAME_CHARS = 60
_NAME_BYTES = 180
# Characters that reorder how the text around them is shown (right-to-left overrides and
# isolates): a name's could show its id, or another job's name, in another place.
_BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)


def safe_name(name: str) -> str:
    """`name` as part of one folder's name: no `/` (nor `\\`, which the proxy reads as one),
    no control characters, line breaks or bidi controls, white space as one space, no
    leading dot or space, and at most _NAME_CHARS characters (an ellipsis where cut).
    Empty where nothing is left."""
    kept = []
    for char in name:
        category = unicodedata.category(char)
        if char in "/\\":
            kept.append("_")
        elif category in ("Cc", "Cs", "Zl", "Zp") or char in _BIDI_CONTROLS:
            continue  # a lone surrogate (Cs) cannot even be written as a file name
        else:
            kept.append(char)
    safe = " ".join("".join(kept).split()).lstrip(". ")
    if len(safe) > _NAME_CHARS or len(safe.encode()) > _NAME_BYTES:
        safe = safe[: _NAME_CHARS - 1]
        while len(safe.encode()) > _NAME_BYTES - len("…".encode()):
            safe = safe[:-1]
        safe = safe.rstrip(" \u200d") + "…"  # nor a joiner left waiting for its emoji
    return safe
