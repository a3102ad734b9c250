"""Which Chromium the browser tests drive, and how."""

from __future__ import annotations

import os
from pathlib import Path

# Debian's Chromium (scripts/e2e-deps.sh); Playwright cannot download its own builds here.
CHROMIUM = Path(os.environ.get("TOWERBOARD_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip

NO_CHROMIUM = (
    f"Chromium is not installed at {CHROMIUM}: run scripts/e2e-deps.sh (as root) "
    "to run the dashboard tests"
)
