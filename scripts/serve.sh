#!/usr/bin/env bash
# Run the Towerboard service: API on 127.0.0.1:8000, job store and runs under ./data.
# Arguments are passed to `towerboard serve` (--host, --port, --data-dir); settings come
# from TOWERBOARD_* environment variables.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
exec towerboard serve "$@"
