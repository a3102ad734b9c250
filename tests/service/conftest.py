"""Fixtures for the service suite (the harness itself is in harness.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.service.harness import Service


@pytest.fixture
def make_service(tmp_path: Path) -> Iterator[Callable[..., Service]]:
    """Build services on demand (`make_service(env=...)`); all are closed afterwards."""
    made: list[Service] = []

    def make(env: dict[str, str] | None = None, data_dir: Path | None = None) -> Service:
        service = Service(data_dir or tmp_path / f"data{len(made)}", env)
        made.append(service)
        return service

    yield make
    for service in made:
        service.close()
