#!/usr/bin/env bash
# The whole test set-up on a fresh machine: make .venv, install Towerboard with its test
# extras, run the suite. Arguments are passed to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
exec python -m pytest "$@"
