#!/usr/bin/env bash
# Install everything tuner needs on a fresh machine: a virtualenv (.venv) with tuner and its test
# tools, then the bench (patched llama-server + bench models), cached under ~/.cache/tuner.
# Safe to rerun: a second run reuses the cached build (first build: ~11 min on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-venv.sh
.venv/bin/tuner bench setup
