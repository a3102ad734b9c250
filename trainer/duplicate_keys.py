"""JSON read strictly: an object that gives a key twice is refused, naming the key.

Python's `json.loads` keeps the last of a key's values and drops the others without a word;
in a spec that is usually a copy-paste mistake (`"steps": 5, ..., "steps": 7`), and one of
the two values the user wrote is lost. Every reader of a user's JSON reads it with `loads`
here: the service's request bodies (`service/jsonbody.py`), the CLI's spec file, the
worker's spec and `TF_CONFIG`.

The check is an `object_pairs_hook` on the C parser (a `dict` of each object's pairs, one
length compared), which marks an object that gave a key twice; only then is the parsed
value searched for the first marked object, which gives the key's path
(`model.params.hidden`, a list's index as a number), and the text read again along that
path alone (what lies off it skipped by the C scanner) for the line and column of both
places. No TensorFlow: the service imports this.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from json.scanner import make_scanner
from typing import Any

from trainer.unknown_keys import shown_path

Path = tuple[str | int, ...]


class DuplicateKeyError(json.JSONDecodeError):
    """A JSON object gives a key twice. A `JSONDecodeError` (so a `ValueError`), so every
    reader that refuses JSON it cannot read refuses this too; `pos`, `lineno` and `colno`
    are where the key is given again, `first_lineno` and `first_colno` where it was given
    first, `path` the keys and list indices from the top down to the key (the key last)."""

    def __init__(self, doc: str, path: Path, first: int, again: int) -> None:
        self.path = path
        self.first = first
        self.first_lineno, self.first_colno = _line_column(doc, first)
        line, column = _line_column(doc, again)
        self.places = (
            f"given at line {self.first_lineno} column {self.first_colno} "
            f"and again at line {line} column {column}"
        )
        super().__init__(f"Duplicate key `{shown_path(path)}`: {self.places}", doc, again)

    def __str__(self) -> str:
        return f"{self.msg}; give each key once, as only one of its values would be kept"

    def __reduce__(self) -> tuple[Any, ...]:  # JSONDecodeError's takes (msg, doc, pos)
        return type(self), (self.doc, self.path, self.first, self.pos)

    @property
    def here(self) -> str:
        """What a field error says, its field being `path`."""
        return (
            f"Duplicate key here: {self.places}. Give each key once: only one of its "
            "values would be kept."
        )


class _Marked(dict[str, Any]):
    """An object that gave `key` twice, as the parser built it (its last value kept)."""

    key: str


def loads(document: str | bytes | bytearray, **options: Any) -> Any:
    """`json.loads`, but raising `DuplicateKeyError` for an object that gives a key twice
    (the same key once decoded: `"a"` and `"\\u0061"` are one key), the first such in the
    text. Bytes are decoded as `json.loads` decodes them (UTF-8, -16 or -32, told by the
    first bytes). `options` are `json.loads`'s (`parse_constant`, ...), but for
    `object_pairs_hook` and `object_hook`, which this needs for its own. Text that is not
    JSON raises `JSONDecodeError` as `json.loads` does, a key given twice or not."""
    text = document
    if isinstance(document, (bytes, bytearray)):
        text = document.decode(json.detect_encoding(document), "surrogatepass")
    assert isinstance(text, str)
    marked = False

    def unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal marked
        result = dict(pairs)
        if len(result) == len(pairs):
            return result
        result = _Marked(result)
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                result.key = key
                break
            seen.add(key)
        marked = True
        return result

    value = json.loads(text, object_pairs_hook=unique_pairs, **options)
    if marked:
        path = _marked_path(value)
        raise DuplicateKeyError(text, path, *_places(text, path))
    return value


def _marked_path(value: Any) -> Path:
    """The path to the first key given twice (its object's path, then the key): the first
    marked object in the text's order. Iterators of its own, not recursion, so a value as
    deep as the parser reads is searched too."""
    if isinstance(value, _Marked):
        return (value.key,)
    path: list[str | int] = []  # the key of each level below the top
    levels = [_children(value)]
    while levels:
        for key, node in levels[-1]:
            if isinstance(node, _Marked):
                return (*path, key, node.key)
            if isinstance(node, (dict, list)) and node:
                path.append(key)
                levels.append(_children(node))
                break
        else:
            levels.pop()
            if path:
                path.pop()
    raise AssertionError("no object marked")


def _children(node: Any) -> Iterator[tuple[str | int, Any]]:
    return iter(node.items()) if isinstance(node, dict) else enumerate(node)


# Parses one value whole (a key too) and says where it ends; on text parsed already.
_scan_once = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's white space, as `json.decoder` has it


def _skip(text: str, pos: int) -> int:
    """Past the white space at `pos`."""
    space = _SPACE.match(text, pos)
    return space.end() if space else pos


def _past_value(text: str, pos: int) -> int:
    """Past the value at `pos`, the white space after it and the comma after that."""
    return _skip(text, _skip(text, _scan_once(text, pos)[1]) + 1)


def _places(text: str, path: Path) -> tuple[int, int]:
    """The offsets where the last key of `path` is given first and again (at its opening
    quote), read along `path` in `text`, each value off the path skipped whole by the C
    scanner. Above the last key each object gives its key once (else it was marked, and
    came first), so the path reads one way."""
    pos = _skip(text, 0)
    *above, last = path
    for step in above:
        pos = _skip(text, pos + 1)  # past `{` or `[`
        if isinstance(step, int):
            for _ in range(step):
                pos = _past_value(text, pos)
            continue
        while True:
            key, pos = _member(text, pos)
            if key == step:
                break
            pos = _past_value(text, pos)
    pos = _skip(text, pos + 1)
    first = -1
    while True:
        key, value = _member(text, pos)
        if key == last:
            if first >= 0:
                return first, pos
            first = pos
        pos = _past_value(text, value)


def _member(text: str, pos: int) -> tuple[str, int]:
    """The key of the object member at `pos` (its opening quote) and where its value
    starts."""
    key, end = _scan_once(text, pos)
    return key, _skip(text, _skip(text, end) + 1)  # past the colon


def _line_column(doc: str, pos: int) -> tuple[int, int]:
    """As `JSONDecodeError` counts them: both from 1."""
    return doc.count("\n", 0, pos) + 1, pos - doc.rfind("\n", 0, pos)
