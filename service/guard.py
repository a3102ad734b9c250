"""The guard of a pass that repeats for the service's whole life: an error in one of its
parts is logged, not raised, and the next pass tries that part again.

An error that repeats every pass is logged once, with its traceback, and again only when
it changes; a part that works again after failing says so. TensorBoard's watch task
(`service.tensorboard`) runs each pass under one: an error ended it for good, unseen, as
nobody awaits it ("Task exception was never retrieved", at exit). The supervisor runs each
job's part of a tick, and the scheduling, under one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager


class Guard:
    """`with guard(key, what):` runs one part of a pass; `key` names the part (its last
    error is kept under it), `what` says it in the log ("Scheduling queued jobs")."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._errors: dict[Hashable, str] = {}

    @contextmanager
    def __call__(self, key: Hashable, what: str) -> Iterator[None]:
        try:
            yield
        except Exception as error:
            message = f"{type(error).__name__}: {error}"
            if self._errors.get(key) != message:
                self._errors[key] = message
                self._log.exception(
                    "%s failed; retrying each tick, logged again if it changes", what
                )
        else:
            if self._errors.pop(key, None) is not None:
                self._log.info("%s works again", what)

    def forget(self, matches: Callable[[Hashable], bool]) -> None:
        """Drop the last errors of the parts whose keys `matches` (a job no longer watched):
        a part of that name later logs its first error again."""
        for key in [key for key in self._errors if matches(key)]:
            del self._errors[key]
