"""`python -m trainer run --job-dir DIR [--spec FILE]`: run one job, exit with its code.

Exit codes: 0 succeeded, 1 failed, 2 invalid spec, 3 stopped by SIGTERM after a checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path


def _drop_checkpoint_chatter(record: logging.LogRecord) -> bool:
    """TensorFlow logs "Sharding callback duration: N microseconds" at INFO on every
    checkpoint save: in a long job most of worker.log, and all of the lines a failed job's
    error keeps as its log tail."""
    return not str(record.msg).startswith("Sharding callback duration")


def main(argv: list[str] | None = None) -> int:
    # A SIGTERM (a cancel) from here on asks for a stop: one that lands while TensorFlow is
    # imported (the first 0.3 s and more) killed the worker with no result.json, which
    # the service took for a crash and ran again.
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    parser = argparse.ArgumentParser(
        prog="python -m trainer", description="Towerboard's tower trainer."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train the job in a run directory")
    run.add_argument(
        "--job-dir", type=Path, required=True, help="the run directory (reads spec.json there)"
    )
    run.add_argument(
        "--spec", type=Path, help="read the spec from this file instead (copied to the job dir)"
    )
    args = parser.parse_args(argv)

    # TensorFlow's C++ start-up chatter (CUDA probes on CPU hosts) would bury the job's log.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("absl").addFilter(_drop_checkpoint_chatter)
    # Autograph writes every function it converts to a temp file and deletes it at exit,
    # an exit this worker skips (below): each job left 17 or more files in /tmp for good.
    # Its own folder, removed as it ends, keeps them in one place; a worker killed
    # outright still leaves that one folder.
    tempfile.tempdir = tempfile.mkdtemp(prefix="towerboard-worker-")
    try:
        from trainer.run import run_job

        return int(run_job(args.job_dir, args.spec, stop=stop))
    finally:
        shutil.rmtree(tempfile.tempdir, ignore_errors=True)


if __name__ == "__main__":
    code = main()
    # Every file the service reads is written and closed by now (result.json last).
    # Skip the interpreter's teardown: TensorFlow's takes 3 to 11 seconds, while the
    # service, which waits for the process to end, would still show the job running.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
