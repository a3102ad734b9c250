"""Worker runs started beside each other, two at a time, for the tests that read them.

A worker spends most of its seconds starting up (importing TensorFlow, tracing its step)
on one core: on this 2-core machine two runs at once take some 40% less time than one after
the other (four tiny runs: 31-34 s one at a time, 19-21 s two at a time, with the machine
shared). A test module names the run each such test reads, by the test's name; when the
first of them asks, `start_beside` starts the runs of the tests selected in that module, in
their order, two at a time, and each test waits for its own (and errors with what its run
raised). A module's tests that read runs come after its other tests, so that no run goes
on beside those. Only runs whose checks do not depend on how fast the worker goes belong
here: two at once, each runs slower.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")


def start_beside(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    runs: Mapping[str, Callable[[Path], T]],
) -> Iterator[dict[str, Future[T]]]:
    """For a module-scoped fixture: start `runs[name](folder)`, each in a fresh folder, for
    every test `name` selected in the requesting module, two at a time; yield each test's
    future. When the module ends, runs no test has asked for yet (a test stopped short, or
    -x) are not started, and the ones going are waited for: no worker outlives the module."""
    selected = [
        item.name
        for item in request.session.items
        if getattr(item, "module", None) is request.module and item.name in runs
    ]
    pool = ThreadPoolExecutor(2, thread_name_prefix="beside")
    try:
        yield {
            name: pool.submit(runs[name], tmp_path_factory.mktemp(re.sub(r"\W+", "_", name)[:40]))
            for name in selected
        }
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
