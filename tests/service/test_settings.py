"""Settings from TOWERBOARD_* environment variables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.settings import Settings, missing_data_roots, unknown_variables

VARIABLE = re.compile(r"TOWERBOARD_[A-Z][A-Z_]*[A-Z]")


def test_read_settings_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TOWERBOARD_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TOWERBOARD_DATA_ROOTS", "/data/a, /data/b,")
    monkeypatch.setenv("TOWERBOARD_GPUS", "0,1,3")
    monkeypatch.setenv("TOWERBOARD_CPU_JOBS", "2")
    monkeypatch.setenv("TOWERBOARD_TOKEN", "t")
    monkeypatch.setenv("TOWERBOARD_TB_IDLE_MINUTES", "5")
    settings = Settings()
    assert settings.data_dir == tmp_path
    assert settings.data_roots == [Path("/data/a"), Path("/data/b")]
    assert settings.gpus == [0, 1, 3]
    assert settings.cpu_jobs == 2
    assert settings.token is not None and settings.token.get_secret_value() == "t"
    assert settings.tb_idle_minutes == 5.0
    assert settings.db_path == tmp_path / "towerboard.db"
    assert settings.runs_dir == tmp_path / "runs"


def test_read_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DATA_DIR", "DATA_ROOTS", "GPUS", "CPU_JOBS", "TOKEN", "TB_IDLE_MINUTES"):
        monkeypatch.delenv(f"TOWERBOARD_{name}", raising=False)
    monkeypatch.setenv("TOWERBOARD_TOKEN", "")
    settings = Settings().resolved()
    assert settings.gpus == [] and settings.cpu_jobs == 1 and settings.cpu_max_towers == 8
    assert settings.token is None
    assert settings.allowed_data_roots == [settings.data_dir / "datasets"]
    assert settings.host == "127.0.0.1" and settings.port == 8000


def test_read_settings_duplicate_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOWERBOARD_GPUS", "0,0")
    with pytest.raises(
        ValidationError, match=r"Expected distinct GPU ids >= 0. Received: \[0, 0\]"
    ):
        Settings()


def test_read_settings_token_whitespace(monkeypatch: pytest.MonkeyPatch) -> None:
    # `TOWERBOARD_TOKEN="s3cret "` (a space from a copy, or a line end from a file): the
    # header's value loses the space, so no request could ever match; it is dropped.
    monkeypatch.setenv("TOWERBOARD_TOKEN", " s3cret \n")
    token = Settings().token
    assert token is not None and token.get_secret_value() == "s3cret"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("   ", "Expected a token, not only whitespace"),
        ("s3c\x01ret", "Expected printable ASCII characters only"),
        ("sécret", "Expected printable ASCII characters only"),
    ],
)
def test_read_settings_token_refused(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    # Whitespace alone would have been a token no client can send (not no token: that
    # would turn auth off); so would a character a header cannot carry.
    monkeypatch.setenv("TOWERBOARD_TOKEN", value)
    with pytest.raises(ValidationError, match=message) as raised:
        Settings()
    # What `towerboard serve` logs of it: the message, never the secret.
    [error] = raised.value.errors()
    assert value.strip() not in error["msg"] or not value.strip()


def test_a_variable_nothing_reads_is_named_with_the_setting_it_is_near() -> None:
    lines = unknown_variables(
        {
            "TOWERBOARD_CPU_JOB": "2",  # misspelt: the service would run with the default
            "TOWERBOARD_BOGUS": "1",
            "TOWERBOARD_TOKEN": "t",
            "TOWERBOARD_URL": "http://h:1",  # the client's, not the service's
            "TOWERBOARD_SPLIT_GPU_MB": "8192",  # the workers'
            "PATH": "/bin",
        }
    )
    assert lines == [
        "TOWERBOARD_BOGUS is set, but it is no setting of Towerboard's: ignored",
        "TOWERBOARD_CPU_JOB is set, but it is no setting of Towerboard's: ignored; did you "
        "mean TOWERBOARD_CPU_JOBS?",
    ]


def test_every_towerboard_variable_the_code_reads_is_known() -> None:
    # So that no variable that something does read is called unknown at the service's
    # start. (This file alone names unknown ones, on purpose.)
    root = Path(__file__).resolve().parents[2]
    files = [root / "docker-compose.yml", *(root / "scripts").glob("*.sh")]
    for folder in ("service", "trainer", "tests", "bench"):
        files += [path for path in (root / folder).rglob("*.py") if path != Path(__file__)]
    read = {name for path in files for name in VARIABLE.findall(path.read_text())}
    assert "TOWERBOARD_TOKEN" in read and "TOWERBOARD_SPLIT_GPU_MB" in read
    assert unknown_variables(dict.fromkeys(read, "")) == []


def test_a_data_root_that_is_no_folder_is_named_at_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A misspelt root, or a share not mounted yet: every job naming data there would be
    # refused at submit. Said at start; the default root, absent on a fresh install, not.
    monkeypatch.delenv("TOWERBOARD_DATA_ROOTS", raising=False)
    (tmp_path / "data").mkdir()
    (tmp_path / "a-file").write_text("not a folder")
    tmp_path = tmp_path.resolve()  # as the roots are, so each line names one as given
    settings = Settings(
        data_dir=tmp_path / "svc",
        data_roots=[tmp_path / "data", tmp_path / "dtaa", tmp_path / "a-file"],
    )
    end = "a job's data.path under it is refused until it is a folder"
    assert missing_data_roots(settings) == [
        f"TOWERBOARD_DATA_ROOTS names {str(tmp_path / 'dtaa')!r}, which does not exist: {end}",
        f"TOWERBOARD_DATA_ROOTS names {str(tmp_path / 'a-file')!r}, which is no folder: {end}",
    ]
    # A relative root is said as given, and where it was looked for.
    relative = Settings(data_dir=tmp_path / "svc", data_roots=[Path("no-such-root")])
    assert missing_data_roots(relative) == [
        f"TOWERBOARD_DATA_ROOTS names 'no-such-root', which does not exist "
        f"({Path('no-such-root').resolve()}): {end}"
    ]
    assert missing_data_roots(Settings(data_dir=tmp_path / "svc")) == []
