#!/usr/bin/env bash
# The whole test set-up on a fresh machine: make .venv, install Towerboard with its test
# extras, install Debian's Chromium for the dashboard tests (when root; they skip and say
# why otherwise), run the suite. Arguments are passed to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
bash scripts/e2e-deps.sh
exec python -m pytest "$@"
