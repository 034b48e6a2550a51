#!/usr/bin/env bash
# The test command, in two tiers:
#   scripts/test.sh         set up (virtualenv and bench, cached), lint, type check, a throwaway
#                           PostgreSQL, then the whole suite against the real bench; what CI runs
#                           (.ci/run)
#   scripts/test.sh --fast  the virtualenv only, lint, type check, then every test that needs
#                           neither the bench nor PostgreSQL and is not marked `slow` (under a
#                           minute on 2 cores)
# Tests that need no bench run in three processes on two cores (pytest-xdist, work stealing; a
# costly module fixture has one test that reads it, or each process would make its own): much
# of that tier waits rather than computes (subprocesses starting, twin servers in wall time,
# polls), and a third process fills those waits (that tier on 2 cores: 302 s in two processes,
# 232 s in three). The bench tests run one at a time, each with the machine to itself, as a
# user's tuner would.
# Extra arguments go to pytest, e.g. scripts/test.sh -k patch, scripts/test.sh --fast -x
set -euo pipefail
cd "$(dirname "$0")/.."

fast=false
if [ "${1:-}" = --fast ]; then
    fast=true
    shift
fi

if $fast; then
    scripts/setup-venv.sh
else
    scripts/setup.sh
fi
.venv/bin/ruff check tuner tests benchmarks db scripts
.venv/bin/ruff format --check tuner tests benchmarks db scripts
# mypy reads its configuration (what it checks, strictly) from pyproject.toml
.venv/bin/mypy
# docs/results.md is rendered from the benchmarks' results files: it must be current
.venv/bin/python benchmarks/record.py render --check

if $fast; then
    # No bench for this tier even where one is built: a test that needs it without its marker
    # fails here, on every machine, instead of passing wherever the bench happens to exist.
    export TUNER_BENCH_MANIFEST=/nonexistent/tuner-fast-tier/bench.toml
    exec .venv/bin/pytest -q -n 3 --dist worksteal -m "not bench and not postgres and not slow" "$@"
fi

# A throwaway PostgreSQL server (Debian's package, installed if missing) for the tests marked
# `postgres`; stopped and removed on exit.
export TUNER_PG_DIR=${TUNER_PG_DIR:-$(mktemp -d -t tuner-pg.XXXXXX)}
trap 'scripts/postgres.sh stop' EXIT
TUNER_TEST_PG_URL=$(scripts/postgres.sh start)
export TUNER_TEST_PG_URL
if [ $# -gt 0 ]; then
    exec .venv/bin/pytest -q "$@"  # a selection: as asked, in one process
fi
status=0
.venv/bin/pytest -q -n 3 --dist worksteal -m "not bench" --durations=30 || status=$?
.venv/bin/pytest -q -m bench --durations=30 || status=$?
exit $status
