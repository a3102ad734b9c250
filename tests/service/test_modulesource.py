"""`service.modulesource`: whether a module defines a name, and whether its function takes
the worker's arguments, told from its source alone."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from service.modulesource import call_refusal, defines, module_source


def _module(folder: Path, name: str, source: str) -> Path:
    path = folder / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path


BINDS = """\
import os.path as osp, json
from collections import OrderedDict as Ordered
try:
    from fast import build_fast
except ImportError as missing:
    build_fast = None
if osp:
    def build(shape, classes): ...
else:
    build = None
class Net: ...
(first, *rest) = [1, 2]
for looped in range(2): ...
with open(__file__) as handle: ...
kept = [inner for inner in range(3)]
if (walrus := 3): ...
match kept:
    case [matched, *others]: ...
    case {"k": _, **remaining}: ...
def outer():
    inside = 1
"""


@pytest.mark.parametrize(
    "name",
    ["osp", "json", "Ordered", "build_fast", "missing", "build", "Net", "first", "rest",
     "looped", "handle", "kept", "walrus", "matched", "others", "remaining", "outer"],
)  # fmt: skip
def test_every_way_a_module_binds_a_name_counts(tmp_path: Path, name: str) -> None:
    assert defines(_module(tmp_path, "models", BINDS), name) is True


@pytest.mark.parametrize("name", ["inside", "nope", "shape", "Ordered_"])
def test_a_name_bound_nowhere_or_only_in_a_function_is_not_defined(
    tmp_path: Path, name: str
) -> None:
    assert defines(_module(tmp_path, "models", BINDS), name) is False


@pytest.mark.parametrize(
    "source",
    [
        "from keras.layers import *\n",
        "def __getattr__(name): ...\n",
        "globals()['build'] = print\n",
        "import sys\nsys.modules[__name__].build = print\n",
        "def make():\n    global build\n    build = print\nmake()\n",
        "for n in ['build']:\n    exec(f'{n} = print')\n",
        "def build(:\n",  # does not parse
    ],
    ids=["star", "getattr", "globals", "sys.modules", "global", "exec", "syntax"],
)
def test_a_source_that_cannot_say_is_left_to_the_worker(tmp_path: Path, source: str) -> None:
    assert defines(_module(tmp_path, "models", source), "build") is None


def test_a_packages_submodule_is_left_to_the_worker(tmp_path: Path) -> None:
    # `team:cnn` works once something has imported team.cnn, which no reading of
    # team/__init__.py can tell.
    init = _module(tmp_path / "team", "__init__", "")
    _module(tmp_path / "team", "cnn", "def build(): ...\n")
    assert defines(init, "cnn") is None
    assert defines(init, "rnn") is False


def test_a_submodule_is_found_without_running_its_packages_init(tmp_path: Path) -> None:
    # Were team/__init__.py run, the test would fail here.
    _module(tmp_path / "team", "__init__", "raise SystemExit('ran')\n")
    models = _module(tmp_path / "team" / "vision", "models", "def build(): ...\n")
    (tmp_path / "team" / "vision" / "__init__.py").write_text("raise SystemExit('ran')\n")
    assert module_source("team.vision.models", [str(tmp_path)]) == models
    assert module_source("team.vision.nope", [str(tmp_path)]) is None
    assert module_source("team.vision.models.deeper", [str(tmp_path)]) is None


def test_what_is_no_plain_source_file_is_left_to_the_worker(tmp_path: Path) -> None:
    (tmp_path / "namespace").mkdir()  # a namespace package: no file to read
    assert module_source("namespace", [str(tmp_path)]) is None
    assert module_source("math", [str(tmp_path)]) is None  # built into the interpreter
    assert module_source("no_such_module_anywhere", [str(tmp_path)]) is None


SIGNATURES = [
    "input_shape, num_classes",
    "input_shape, classes",
    "input_shape, num_classes, depth",
    "input_shape, num_classes, depth=3",
    "input_shape, /, num_classes",
    "input_shape=1, /, num_classes=2",
    "**kw",
    "input_shape, num_classes, *, depth",
    "*args",
    "input_shape, num_classes, **kw",
    "a, /, **kw",
    "",
]


@pytest.mark.parametrize(
    "keywords", [["input_shape", "num_classes"], ["input_shape", "num_classes", "depth"]]
)
@pytest.mark.parametrize("signature", SIGNATURES)
def test_call_refusal_says_what_inspect_bind_says(
    tmp_path: Path, signature: str, keywords: list[str]
) -> None:
    # The worker checks its call with `inspect.signature(builder).bind(**kwargs)`; the
    # service, from the source alone, must refuse exactly those calls, saying the same.
    source = f"def build({signature}):\n    ...\n"
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # noqa: S102 - the test's own source, to compare with
    try:
        inspect.signature(namespace["build"]).bind(**dict.fromkeys(keywords, 1))
        expected = None
    except TypeError as error:
        expected = f"a function build({signature}) ({error})"
    refusal = call_refusal(_module(tmp_path, "m", source), "build", keywords)
    assert (refusal and refusal.text) == expected
    if refusal is not None:  # the argument it names, as `bind` names it
        assert repr(refusal.argument) in refusal.text
        assert refusal.missing == ("missing a required argument" in refusal.text)
        takes = inspect.signature(namespace["build"]).parameters
        has_kwargs = any(p.kind is p.VAR_KEYWORD for p in takes.values())
        named = {n for n, p in takes.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        expected_unexpected = () if has_kwargs else tuple(k for k in keywords if k not in named)
        assert refusal.unexpected == expected_unexpected


@pytest.mark.parametrize(
    "source",
    [
        "import functools\n@functools.cache\ndef build(x): ...\n",  # a decorator may change it
        "def build(x): ...\nbuild = make(build)\n",  # bound again
        "class build:\n    def __init__(self, x): ...\n",
        "from elsewhere import build\n",
        "from elsewhere import *\ndef build(x): ...\n",
        "def build(x):\n",  # does not parse
    ],
    ids=["decorated", "rebound", "class", "import", "star", "syntax"],
)
def test_call_refusal_cannot_say_where_the_source_does_not_show_the_function(
    tmp_path: Path, source: str
) -> None:
    assert call_refusal(_module(tmp_path, "m", source), "build", ["input_shape"]) is None
