"""`trainer.duplicate_keys.loads`: `json.loads`, but an object giving a key twice is refused,
saying which key and where (no TensorFlow needed)."""

from __future__ import annotations

import json
import pickle
import random
from typing import Any

import pytest

from trainer.duplicate_keys import DuplicateKeyError, loads


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "a", "model": {"name": "mlp"}}',  # one key in two objects
        '[{"a": 1}, {"a": 2}, {"b": {"a": 3}}]',
        '{"a": {}, "b": [], "c": [{}], "d": "{\\"a\\": 1, \\"a\\": 2}"}',
        "  7 ",
        '"text"',
    ],
)
def test_without_a_key_given_twice_reads_as_json_loads(text: str) -> None:
    assert loads(text) == json.loads(text)
    for encoding in ("utf-8", "utf-16", "utf-32-le"):
        assert loads(text.encode(encoding)) == json.loads(text.encode(encoding))


@pytest.mark.parametrize(
    ("text", "path", "first", "again"),
    [
        ('{"steps": 5, "steps": 7}', ("steps",), (1, 2), (1, 14)),
        ('{"a": 1, "\\u0061": 2}', ("a",), (1, 2), (1, 10)),  # one key, once decoded
        ('{\n "m": {"p": {\n  "h": [1],\n  "h": [2]}}}', ("m", "p", "h"), (3, 3), (4, 3)),
        ('[0, {"x": [{}, {"y": 1, "z": 2, "y": 3}]}]', (1, "x", 1, "y"), (1, 17), (1, 33)),
        ('{"a.b": {"": 1, "": 2}}', ("a.b", ""), (1, 10), (1, 17)),
        # The first object in the text that does: the outer one opens first.
        ('{"o": {"i": 1, "i": 2}, "o": 3}', ("o",), (1, 2), (1, 25)),
        ('{"a": 1, "b": 2, "a": 3, "b": 4}', ("a",), (1, 2), (1, 18)),
    ],
)
def test_a_key_given_twice_is_named_with_both_places(
    text: str, path: tuple[Any, ...], first: tuple[int, int], again: tuple[int, int]
) -> None:
    with pytest.raises(DuplicateKeyError) as raised:
        loads(text)
    error = raised.value
    assert error.path == path
    assert (error.first_lineno, error.first_colno) == first
    assert (error.lineno, error.colno) == again
    assert isinstance(error, json.JSONDecodeError) and error.doc == text
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.path, copy.pos) == (str(error), error.path, error.pos)


def test_what_it_says() -> None:
    with pytest.raises(DuplicateKeyError) as raised:
        loads('{"model": {"params": {"hidden": [1],\n "hidden": [2]}}}')
    assert str(raised.value) == (
        "Duplicate key `model.params.hidden`: given at line 1 column 23 and again at line 2 "
        "column 2; give each key once, as only one of its values would be kept"
    )
    assert raised.value.here == (
        "Duplicate key here: given at line 1 column 23 and again at line 2 column 2. Give each "
        "key once: only one of its values would be kept."
    )


def test_text_that_is_not_json_is_a_json_error_a_key_given_twice_or_not() -> None:
    with pytest.raises(json.JSONDecodeError) as raised:
        loads('{"a": 1, "a": 2, oops}')
    assert not isinstance(raised.value, DuplicateKeyError)
    assert raised.value.msg == "Expecting property name enclosed in double quotes"


def test_options_are_json_loads_ones() -> None:
    def no_constant(name: str) -> Any:
        raise ValueError(f"no {name}")

    with pytest.raises(ValueError, match="no NaN"):
        loads('{"a": NaN}', parse_constant=no_constant)


def test_as_deep_as_json_loads_reads() -> None:
    # Found, and its places read, without recursion of its own.
    depth = 500
    text = "[" * depth + '{"k": 1, "k": 2}' + "]" * depth
    with pytest.raises(DuplicateKeyError) as raised:
        loads(text)
    assert raised.value.path == (0,) * depth + ("k",)
    assert raised.value.colno == depth + 10


def _random_json(rng: random.Random, depth: int = 0) -> str:
    space = lambda: rng.choice(["", " ", "\n", "\t", "\r\n "])  # noqa: E731
    roll = rng.random()
    if depth > 4 or roll < 0.3:
        return rng.choice(["1", "-2.5e3", '"s}t]r,:"', "true", "null", '"\\\\"', '"\\""'])
    if roll < 0.6:
        items = [space() + _random_json(rng, depth + 1) + space() for _ in range(rng.randint(0, 4))]
        return "[" + ",".join(items) + "]"
    keys = ['"a"', '"b"', '"\\u0061"', '"c.d"', '""', '"\\"q"']
    members = [
        f"{space()}{rng.choice(keys)}{space()}:{space()}{_random_json(rng, depth + 1)}{space()}"
        for _ in range(rng.randint(0, 4))
    ]
    return "{" + ",".join(members) + "}"


def _pairs(text: str) -> Any:
    """The text with each object as its list of (key, value) pairs, nothing dropped."""
    return json.loads(text, object_pairs_hook=lambda pairs: ("object", pairs))


def _gives_a_key_twice(value: Any) -> bool:
    if isinstance(value, tuple):
        keys = [key for key, _ in value[1]]
        return len(set(keys)) < len(keys) or any(_gives_a_key_twice(v) for _, v in value[1])
    return isinstance(value, list) and any(_gives_a_key_twice(v) for v in value)


def test_random_json_is_refused_exactly_where_a_key_is_given_twice() -> None:
    rng = random.Random(7)
    refused = 0
    for _ in range(3000):
        text = _random_json(rng)
        pairs = _pairs(text)
        try:
            value = loads(text)
        except DuplicateKeyError as error:
            refused += 1
            assert _gives_a_key_twice(pairs), text
            node = pairs
            for step in error.path[:-1]:  # the path leads to an object giving the key twice
                node = dict(node[1])[step] if isinstance(node, tuple) else node[step]
            assert [key for key, _ in node[1]].count(error.path[-1]) >= 2, (text, error.path)
            for place in (error.first, error.pos):  # each place is the key's opening quote
                assert json.JSONDecoder().raw_decode(text, place)[0] == error.path[-1], text
            assert error.first < error.pos
        else:
            assert not _gives_a_key_twice(pairs), text
            assert value == json.loads(text)
    assert refused > 300
