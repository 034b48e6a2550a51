#!/usr/bin/env bash
# The test command: set up (cached), lint, then run the whole suite against the real bench.
# Extra arguments go to pytest, e.g. scripts/test.sh -k patch
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
.venv/bin/ruff check tuner tests benchmarks db scripts
.venv/bin/ruff format --check tuner tests benchmarks db scripts
# A throwaway PostgreSQL server (Debian's package, installed if missing) for the tests marked
# `postgres`; stopped and removed on exit.
export TUNER_PG_DIR=${TUNER_PG_DIR:-$(mktemp -d -t tuner-pg.XXXXXX)}
trap 'scripts/postgres.sh stop' EXIT
TUNER_TEST_PG_URL=$(scripts/postgres.sh start)
export TUNER_TEST_PG_URL
.venv/bin/pytest -q "$@"
