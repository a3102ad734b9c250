"""`service.modulesource`: whether a module defines a name, told from its source alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.modulesource import defines, module_source


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
