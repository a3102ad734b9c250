# Sourced by scripts/test.sh and scripts/serve.sh: create .venv if needed, install the
# project (pinned in pyproject.toml) when pyproject.toml changed since the last install,
# and activate it.
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=.venv/.towerboard-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[test]"
  touch "$stamp"
fi
# shellcheck disable=SC1091
source .venv/bin/activate
