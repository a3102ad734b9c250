#!/usr/bin/env bash
# What the browser tests (tests/e2e/) need beyond the venv: Debian's Chromium, which
# Playwright drives through `executable_path` (Playwright's own browser builds cannot be
# downloaded here). Idempotent: does nothing when /usr/bin/chromium is already there.
# Needs root for apt-get; without it, the tests skip and say why.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "e2e-deps: not root, cannot apt-get install chromium; the browser tests will skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
