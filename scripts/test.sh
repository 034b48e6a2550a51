#!/usr/bin/env bash
# The test command: set up (cached), lint, then run the whole suite against the real bench.
# Extra arguments go to pytest, e.g. scripts/test.sh -k patch
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
.venv/bin/ruff check tuner tests benchmarks db scripts
.venv/bin/pytest -q "$@"
