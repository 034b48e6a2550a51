#!/usr/bin/env bash
# The main job on the bundled bench, from a fresh machine: set up (cached), profile the bench,
# recommend N, check it live, and write the report.
# Results go to out/demo.db and out/report/ (override with TUNER_DB and OUT).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export TUNER_DB=${TUNER_DB:-sqlite:///$OUT/demo.db}
tuner=.venv/bin/tuner
spec=profiles/bench-smollm2-cpu.toml
model=smollm2-135m-f32

$tuner profile "$spec" --resume
$tuner recommend --model "$model" > "$OUT/server.env"
$tuner validate --model "$model" --resume
$tuner report --model "$model" --out "$OUT/report"
echo
echo "recommendation: $(cat "$OUT/server.env")   (also in $OUT/server.env)"
echo "report:         $OUT/report/"
