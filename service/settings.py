"""The service's settings, read from `TOWERBOARD_*` environment variables.

Everything the service writes lives under one data directory:

    <data_dir>/towerboard.db      the SQLite job store (WAL)
    <data_dir>/towerboard.lock    locked (flock) by the one service using the data dir,
                                  holding its pid (service/main.py)
    <data_dir>/runs/<job_id>/     one run directory per job (see trainer/rundir.py)
    <data_dir>/runs/.deleted/     deleted jobs' run directories, moved aside until they
                                  are removed (service/deletion.py)
    <data_dir>/tensorboard/       the TensorBoard the service launches: logdir/, its view
                                  of the shown jobs (links into runs/), and instance.json,
                                  its pid (service/tensorboard.py)
    <data_dir>/tensorboard.log    output of that TensorBoard

and, when `data_roots` is empty, the data jobs may read, which the service never writes:

    <data_dir>/datasets/          the one data root
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from trainer import modelmodules

_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _split_commas(value: object) -> object:
    # "a, b,,c" -> ["a", "b", "c"]; an empty string is an empty list.
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    """Service settings; each field `x` is read from `TOWERBOARD_X`."""

    model_config = SettingsConfigDict(env_prefix="TOWERBOARD_", extra="ignore")

    data_dir: Path = Field(Path("data"), description="Holds the job store and the runs directory.")
    data_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated folders job data may come from; "
        "empty means <data_dir>/datasets.",
    )
    gpus: Annotated[list[int], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated GPU ids to give to jobs; empty means a CPU-only host.",
    )
    cpu_jobs: int = Field(1, ge=1, le=64, description="Jobs run at once on a CPU-only host.")
    cpu_max_towers: int = Field(
        8, ge=1, le=64, description="Most towers a job may ask for on a CPU-only host."
    )
    token: SecretStr | None = Field(
        None,
        description="When set, every route but /healthz and the dashboard's files (/ and "
        "/static/*, which hold no data) needs `Authorization: Bearer` or the "
        "towerboard_token cookie.",
    )
    tb_idle_minutes: float = Field(
        30.0, gt=0, description="Stop the TensorBoard after this long without a request."
    )
    cancel_grace_seconds: float = Field(
        30.0,
        gt=0,
        description="SIGKILL a cancelled worker that has not exited after SIGTERM, or one "
        "that has written its result and not exited.",
    )
    crash_retries: int = Field(
        2,
        ge=0,
        le=100,
        description="Restart a job whose worker was killed (the OOM killer, a segfault) from "
        "its latest checkpoint this many times before failing it.",
    )
    stop_workers_on_exit: bool = Field(
        False,
        description="On shutdown, SIGTERM running workers and wait (up to the cancel grace "
        "period) while they checkpoint, so the next service resumes them from that step. "
        "For containers, whose stop kills every process; on a host, workers outlive a "
        "restart and are adopted instead.",
    )
    worker_nice: int = Field(10, ge=0, le=19, description="CPU niceness added to workers.")
    head_timeout_seconds: float = Field(
        20.0,
        gt=0,
        le=3600,
        description="Close a connection whose request head, and the body it declares, are not "
        "whole this long after it opened, or after its last response (uvicorn sets no such "
        "deadline).",
    )
    poll_seconds: float = Field(
        0.2, gt=0, le=1.0, description="How often progress files and workers are checked."
    )
    python: str = Field(
        sys.executable, description="Interpreter that runs workers and TensorBoard."
    )
    worker_module: str = Field(
        "trainer", description="Module run as `python -m <module> run --job-dir DIR`."
    )
    model_modules: Annotated[tuple[str, ...] | None, NoDecode] = Field(
        None,
        description="Comma-separated modules a job's custom model (module:function) may "
        "come from, with their submodules; empty allows none; unset allows any.",
    )
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)

    @field_validator("data_roots", "gpus", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        return _split_commas(value)

    @field_validator("model_modules", mode="before")
    @classmethod
    def _modules(cls, value: object) -> object:
        """The worker reads the same variable with `trainer.modelmodules.parse`."""
        if not isinstance(value, str):
            return value
        modules = modelmodules.parse(value)
        bad = [name for name in modules if not _MODULE_NAME.fullmatch(name)]
        if bad:
            raise ValueError(
                f"Expected module names such as 'models' or 'team.models'. Received: {bad}"
            )
        return modules

    @field_validator("token", mode="before")
    @classmethod
    def _token(cls, value: object) -> object:
        """Empty is unset; whitespace around it is dropped (a header value loses it, so a
        token kept with it could never match); what a header cannot carry is refused.
        The messages never show the token: they go to the log."""
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if not isinstance(value, str):
            return value
        if value == "":
            return None
        token = value.strip()
        if not token:
            raise ValueError(
                "Expected a token, not only whitespace (leave it empty or unset for no token)"
            )
        if not all(" " <= c <= "~" for c in token):
            raise ValueError(
                "Expected printable ASCII characters only: the token travels in an HTTP header"
            )
        return token

    @field_validator("python")
    @classmethod
    def _interpreter(cls, python: str) -> str:
        """An interpreter that cannot be run would fail every job (exit 127) and every
        TensorBoard start (a 500) long after the service started: refuse it now."""
        if not python or shutil.which(python) is None:
            raise ValueError(
                "Expected a Python interpreter that exists and can be run, with TensorFlow "
                "and TensorBoard installed (a path, or a name found on PATH)"
            )
        return python

    @field_validator("gpus")
    @classmethod
    def _unique_gpus(cls, gpus: list[int]) -> list[int]:
        if len(set(gpus)) != len(gpus) or any(g < 0 for g in gpus):
            raise ValueError(f"Expected distinct GPU ids >= 0. Received: {gpus}")
        return gpus

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    @property
    def db_path(self) -> Path:
        return self.data_dir / "towerboard.db"

    @property
    def allowed_data_roots(self) -> list[Path]:
        roots = self.data_roots or [self.data_dir / "datasets"]
        return [root.expanduser().resolve() for root in roots]

    def resolved(self) -> Settings:
        """These settings with `data_dir` made absolute, so workers and tests agree on paths."""
        return self.model_copy(update={"data_dir": self.data_dir.expanduser().resolve()})


# `TOWERBOARD_*` variables that are not the service's settings, and what reads each (a
# worker inherits the service's environment). tests/test_docs.py holds the docs to these.
OTHER_VARIABLES = {
    "TOWERBOARD_URL": "the command-line client's --url default",
    "TOWERBOARD_DATASETS": "docker-compose.yml: the host's folder mounted at /datasets",
    "TOWERBOARD_SPLIT_GPU_MB": "trainer/run.py (SPLIT_GPU_ENV), for benchmarks on one card",
    "TOWERBOARD_JOB_ID": "set by the service in each worker's environment",
    "TOWERBOARD_WORKER_DATA_ROOTS": "set by the service in each worker's environment "
    "(trainer/datafiles.py)",
    "TOWERBOARD_TB_SECRET": "set by the service in its TensorBoard's environment "
    "(service/guarded_tensorboard.py)",
    "TOWERBOARD_SCREENSHOTS": "the dashboard tests: where their screenshots go",
    "TOWERBOARD_CHROMIUM": "the dashboard tests: the browser they drive",
    "TOWERBOARD_SLOW_BROWSER": "the dashboard tests: a slowed browser, to bring out races",
}


def missing_data_roots(settings: Settings) -> list[str]:
    """A line for each folder `TOWERBOARD_DATA_ROOTS` names that is no folder here (a
    misspelt root, a share not mounted): every job naming its data there would be refused
    at submit, long after the start. Said, not refused, as a mount may come later; the
    default root (the data dir's `datasets/`, absent on a fresh install) is not said."""
    if not settings.data_roots:
        return []
    lines = []
    for given, root in zip(settings.data_roots, settings.allowed_data_roots, strict=True):
        if os.path.isdir(root):  # os.path's: an unreadable parent is no error here
            continue
        what = "is no folder" if os.path.exists(root) else "does not exist"
        where = "" if str(given) == str(root) else f" ({root})"  # a relative one, found
        lines.append(
            f"TOWERBOARD_DATA_ROOTS names {str(given)!r}, which {what}{where}: a job's "
            "data.path under it is refused until it is a folder"
        )
    return lines


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A line for each `TOWERBOARD_*` variable in `environ` that nothing reads (a misspelt
    setting is otherwise ignored without a word), with the nearest known name."""
    prefix = Settings.model_config.get("env_prefix", "")
    known = {f"{prefix}{name}".upper() for name in Settings.model_fields} | set(OTHER_VARIABLES)
    # Matched without the prefix, which every name shares: with it, BOGUS "was" GPUS.
    rest = {known_name.removeprefix(prefix): known_name for known_name in known}
    lines = []
    for name in sorted(environ):
        if name.upper().startswith(prefix) and name.upper() not in known:
            near = difflib.get_close_matches(
                name.upper().removeprefix(prefix), sorted(rest), n=1, cutoff=0.75
            )
            hint = f"; did you mean {rest[near[0]]}?" if near else ""
            lines.append(f"{name} is set, but it is no setting of Towerboard's: ignored{hint}")
    return lines
