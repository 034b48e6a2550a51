#!/usr/bin/env bash
# Install everything tuner needs on a fresh machine: a virtualenv (.venv) with tuner and its test
# tools, then the bench (patched llama-server + bench models), cached under ~/.cache/tuner.
# Safe to rerun: a second run reuses the cached build (first build: ~11 min on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[test]' 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
.venv/bin/python -c "import tuner, optuna, sqlalchemy, scipy" \
    || { echo "setup: the virtualenv is incomplete (pip install failed?)" >&2; exit 1; }
.venv/bin/tuner bench setup
