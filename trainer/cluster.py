"""Which task of a multi-worker cluster this process is, read from `TF_CONFIG`.

A job outgrows one machine by running the same `python -m trainer run` on every host,
each with `TF_CONFIG` naming the cluster and its own task, the way TensorFlow's
`tf.distribute.MultiWorkerMirroredStrategy` expects (trainer/multiworker.py). This module
only reads and checks that variable, without TensorFlow, so a mistake in it is a clear
exit 2 before anything is imported or connected.

Tasks that train are the `chief` (at most one) and the `worker`s. The chief is task 0
(the `chief`, else `worker` 0): it writes the job's run directory. Every other task
writes its own under `workers/<type>-<index>/` of the job dir it was given, so workers
that share one directory over NFS never write the same file. A task whose `TF_CONFIG`
is wrong, or whose port is taken, writes no file at all (exit 2, saying why on stderr):
it cannot tell that it is the chief, and the directory may be a running chief's (the
same worker started twice).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainer import duplicate_keys
from trainer.duplicate_keys import DuplicateKeyError

TRAINING_TASKS = ("chief", "worker")

log = logging.getLogger(__name__)

# How often a worker waiting for the others says it still is.
WAIT_LOG_SECONDS = 30.0


class ClusterError(ValueError):
    """`TF_CONFIG` is not a cluster this trainer can run in."""


class ClusterMismatch(RuntimeError):
    """The workers of one cluster were not given the same job, or cannot resume together
    (raised by trainer/multiworker.py; here, so the trainer catches it without
    TensorFlow)."""


class ClusterNotFormed(ClusterMismatch):
    """Every task answered, but TensorFlow did not form the cluster in time (raised by
    trainer/multiworker.py)."""


@dataclass(frozen=True)
class Cluster:
    """This process's place in the cluster: `workers` training tasks, this one at `index`."""

    workers: int = 1
    index: int = 0
    task_type: str = "worker"
    task_index: int = 0
    addresses: tuple[str, ...] = ()  # every training task's host:port, the chief first

    @property
    def is_multi_worker(self) -> bool:
        return self.workers > 1

    @property
    def is_chief(self) -> bool:
        return self.index == 0

    @property
    def name(self) -> str:
        return task_name(self.task_type, self.task_index)

    def run_dir(self, job_dir: Path) -> Path:
        """Where this task writes: the job dir for the chief, a directory of its own otherwise."""
        return job_dir if self.is_chief else job_dir / "workers" / self.name


def task_name(task_type: str, task_index: int) -> str:
    """A task as its `TF_CONFIG` names it (`worker-1`, `chief-0`): its directory's name
    under `workers/`, and how messages and `result.json` name it."""
    return f"{task_type}-{task_index}"


def _fail(problem: str, received: object) -> ClusterError:
    return ClusterError(f"TF_CONFIG: {problem}. Received: {received!r}")


def cluster_from_env(environ: Mapping[str, str] | None = None) -> Cluster:
    """The cluster `TF_CONFIG` describes; a single worker when it is unset or empty."""
    raw = (os.environ if environ is None else environ).get("TF_CONFIG", "").strip()
    if not raw:
        return Cluster()
    try:
        config = duplicate_keys.loads(raw)
    except DuplicateKeyError as e:  # `task` given twice: which worker this is is a guess
        raise _fail(str(e), raw) from e
    except (ValueError, RecursionError) as e:
        # Not only JSONDecodeError: an integer of thousands of digits is a ValueError, and
        # brackets nested thousands deep a RecursionError.
        raise _fail(f"expected JSON ({e})", raw) from e
    if not isinstance(config, dict):
        raise _fail("expected a JSON object with `cluster` and `task`", config)
    cluster, task = config.get("cluster"), config.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise _fail("expected `cluster`, an object of task type to a list of host:port", cluster)
    for task_type, addresses in cluster.items():
        if task_type not in TRAINING_TASKS:
            raise _fail(
                f"task type {task_type!r} is not used: MultiWorkerMirroredStrategy trains "
                f"on {' and '.join(TRAINING_TASKS)} tasks only",
                sorted(cluster),
            )
        if (
            not isinstance(addresses, list)
            or not addresses
            or not all(isinstance(a, str) and a for a in addresses)
        ):
            raise _fail(f"expected `cluster.{task_type}` to be a list of host:port", addresses)
    if len(cluster.get("chief", [])) > 1:
        raise _fail("expected at most one chief", cluster["chief"])
    if not isinstance(task, dict):
        raise _fail("expected `task`, an object with `type` and `index`", task)
    task_type, task_index = task.get("type"), task.get("index", 0)
    # A string first: a list or an object is no key of `cluster` (unhashable, the lookup
    # raised TypeError).
    if not isinstance(task_type, str) or task_type not in cluster:
        raise _fail(f"expected `task.type` to be one of {sorted(cluster)}", task_type)
    addresses = (*cluster.get("chief", []), *cluster.get("worker", []))
    # A cluster of one trains as one process, and TensorFlow never reads its TF_CONFIG:
    # the index and addresses matter only to a cluster of several.
    several = len(addresses) > 1
    if several and "index" not in task:
        # TensorFlow refuses a task without one, but only after the wait for the others.
        raise _fail(
            f"expected `task.index`, this task's place among the {len(cluster[task_type])} "
            f"{task_type} task(s)",
            task,
        )
    if (
        not isinstance(task_index, int)
        or isinstance(task_index, bool)
        or not 0 <= task_index < len(cluster[task_type])
    ):
        raise _fail(
            f"expected `task.index` in 0..{len(cluster[task_type]) - 1} for "
            f"{len(cluster[task_type])} {task_type} task(s)",
            task_index,
        )
    if several:
        for address in addresses:
            _host_port(address)
    chiefs = len(cluster.get("chief", []))
    index = task_index if task_type == "chief" else chiefs + task_index
    return Cluster(
        workers=len(addresses),
        index=index,
        task_type=task_type,
        task_index=task_index,
        addresses=addresses,
    )


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    # isascii: str.isdigit() holds for '²' too, which int() refuses.
    if not host or not (port.isascii() and port.isdigit()):
        raise _fail("expected every address to be host:port", address)
    # Its length first: int() refuses more than 4,300 digits with a ValueError of its own.
    if len(port) > 5 or not 0 < int(port) < 65536:
        raise _fail("expected every address's port to be in 1..65535", address)
    host = host.strip("[]")
    try:
        # What the socket module does with a host name before it looks it up: a label
        # longer than 63 characters, an empty one or a character it cannot encode raised
        # UnicodeError from the wait for the other tasks, not this exit 2.
        host.encode("idna")
    except UnicodeError as e:
        raise _fail(
            f"expected every address's host to be a host name or IP address ({e})", address
        ) from e
    return host, int(port)


def _answers(address: str, listeners: list[socket.socket], name: str, why: dict[str, str]) -> bool:
    """Whether another task answers at `address` (if not, `why[address]` says why, for the
    log); a `ClusterError` where one of this task's own `listeners` does (`name`: this
    task's)."""
    try:
        probe = socket.create_connection(_host_port(address), timeout=1)
    except OSError as e:
        # A host name with a typo and a host not up yet read alike without it.
        why[address] = e.strerror or str(e) or type(e).__name__
        return False
    with probe:
        # Both ends: Linux gives one local port to live connections to different places,
        # so another task's probe of this one may come from the very address this probe
        # left from; only this probe also arrived where it was sent.
        mine = (probe.getsockname(), probe.getpeername())
        # Connected means queued on the listener it reached: if that is this task's own,
        # the probe is among its connections. Those of the other tasks' probes are taken
        # and closed with them.
        for listener in listeners:
            while True:
                try:
                    accepted, peer = listener.accept()
                except OSError:  # none left (the listener does not block)
                    break
                with accepted:
                    arrived = accepted.getsockname()
                if (peer, arrived) != mine:
                    continue
                # TF_CONFIGs that give two tasks one address, or this task another's index
                # (host-a given index 1 with the same port on every host): TensorFlow then
                # waits for a task that is not coming.
                raise _fail(
                    f"another task's address is this task's own ({name}): every task "
                    "must have a host:port of its own, and `task.index` must be this "
                    "host's place in the list",
                    address,
                )
    return True


def _listen(port: int, own: str, name: str) -> list[socket.socket]:
    """Non-blocking sockets listening on `port` of every IPv4 address and, where the host
    has IPv6, of every IPv6 address (`own`, `name`: this task's address and name, for the
    error). Both, as TensorFlow's server listens on both: with IPv4 alone, tasks whose
    addresses are IPv6 (`[fd00::2]:2222`, or a name that resolves to one) found nothing
    at each other's ports, and waited for ever."""
    listeners: list[socket.socket] = []
    for family, host in ((socket.AF_INET, ""), (socket.AF_INET6, "::")):
        try:
            listener = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # a kernel without IPv6 (IPv4 is never missing)
            continue
        listeners.append(listener)
        # The last run's TensorFlow server leaves its connections in TIME_WAIT on this port
        # for a minute after it exits: without this, every worker started again at once (to
        # resume after a stop) was refused as if the port were taken. A port another process
        # listens on is still refused (SO_REUSEADDR lets no two sockets listen on one port).
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            if family == socket.AF_INET6:
                # IPv6 alone: the IPv4 socket takes IPv4, and each probe's addresses then
                # read the same at both ends (not as IPv4-mapped IPv6 ones).
                listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            listener.bind((host, port))
            listener.listen()
            listener.setblocking(False)
        except OSError as e:
            listener.close()
            listeners.pop()
            if family == socket.AF_INET6 and e.errno != errno.EADDRINUSE:
                continue  # IPv6 present but with no address to listen on: IPv4 alone
            for other in listeners:
                other.close()
            raise _fail(
                f"cannot listen on this task's address ({name}): {e.strerror} "
                "(is another process using that port?)",
                own,
            ) from e
    return listeners


_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


@contextlib.contextmanager
def signals_held(stop: threading.Event) -> Iterator[None]:
    """SIGTERM and Ctrl-C held back (blocked) on this thread, and on every thread started
    from it meanwhile, TensorFlow's own among them; at the end, the handlers that set
    `stop` are put back and the signals let through, so one that came meanwhile sets
    `stop` then. Entered before TensorFlow is imported; `wait_for_peers` takes them as
    they come.

    Why: making the strategy starts TensorFlow's coordination service, which installs a
    SIGTERM handler of its own (a preemption notice it would act on alone). A SIGTERM
    while the cluster formed went to it and was lost: the job trained to its end. Held,
    it waits for the handler that stops the job, with the cluster, at its first step.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        try:
            for signum in _STOP_SIGNALS:
                signal.signal(signum, lambda *_: stop.set())
        finally:  # never left blocked
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _stopped(stop: threading.Event, seconds: float) -> bool:
    """Whether `stop` is set within `seconds`, taking a held SIGTERM or Ctrl-C as one."""
    if signal.pthread_sigmask(signal.SIG_BLOCK, []) >= _STOP_SIGNALS:
        if signal.sigtimedwait(_STOP_SIGNALS, seconds) is not None:
            stop.set()
        return stop.is_set()
    return stop.wait(seconds)


def wait_for_peers(
    cluster: Cluster, stop: threading.Event, log_every: float = WAIT_LOG_SECONDS
) -> bool:
    """Listen on this task's port and wait until every other task's port answers; False
    when `stop` is set first (a SIGTERM or Ctrl-C).

    TensorFlow's own wait for the cluster (making the strategy) says nothing for as long as
    it lasts and holds the interpreter, so a SIGTERM cannot stop it: this wait, in Python,
    comes first. Each task listens on its own port meanwhile, so the others find it before
    its TensorFlow server starts, and a port already taken is said plainly.
    """
    own = cluster.addresses[cluster.index]
    listeners = _listen(_host_port(own)[1], own, cluster.name)
    others = [a for i, a in enumerate(cluster.addresses) if i != cluster.index]
    log.info("waiting for the other tasks of the cluster to start: %s", ", ".join(others))
    started = said = time.monotonic()
    why: dict[str, str] = {}
    try:
        while others := [a for a in others if not _answers(a, listeners, cluster.name, why)]:
            if _stopped(stop, 0.5):
                return False
            if time.monotonic() - said >= log_every:
                said = time.monotonic()
                log.info(
                    "still waiting, after %d s, for the tasks at %s: not started yet, or "
                    "not reachable at that address",
                    said - started,
                    ", ".join(f"{a} ({why.get(a, 'no answer')})" for a in others),
                )
    finally:
        for listener in listeners:
            listener.close()
    log.info("every task of the cluster answered after %.1f s", time.monotonic() - started)
    return True
