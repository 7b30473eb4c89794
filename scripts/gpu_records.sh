#!/usr/bin/env bash
# The benchmark records of one build, over as many calls as it takes on one
# GPU machine: build (once), the whole test suite (once), then the layer
# benchmark (every group, both precisions and layouts) and the models
# benchmark, each resumed where the last call stopped. Every call stops
# by itself after SECONDS_LEFT seconds (default 560) and copies what
# exists to OUTDIR; run it again until it prints "records: complete".
#
#   CONV2D_EXT_COMMIT=<sha> scripts/gpu_records.sh OUTDIR
#
# State between calls lives in .devbuild/ (ignored by git).
set -uo pipefail
out=${1:?usage: scripts/gpu_records.sh OUTDIR}
cd "$(dirname "$0")/.."
deadline=$(( $(date +%s) + ${SECONDS_LEFT:-560} ))
left() { echo $(( deadline - $(date +%s) )); }
state=.devbuild
mkdir -p "$state" "$out"
export PYTHONUNBUFFERED=1
finish() {
  for f in gpu.txt tests.log h100.json h100-summary.md benchmark.log h100-models.json models-summary.md models.log; do
    [ -e "$state/$f" ] && cp "$state/$f" "$out/"
  done
  exit "${1:-0}"
}

if ! ls conv2d_ext/_C*.so >/dev/null 2>&1; then
  SKIP_TESTS=1 SKIP_BENCH=1 scripts/gpu_check.sh "$state" >"$state/gpu_check.txt" 2>&1 || { tail -20 "$state/gpu_check.txt"; finish 1; }
  grep "^build:" "$state/gpu_check.txt"
fi
if [ ! -e "$state/tests.done" ] && [ "$(left)" -gt 200 ]; then
  python -m pytest tests -q -p no:logging -rfE >"$state/tests.log" 2>&1
  grep -E "^(FAILED|ERROR)" "$state/tests.log" | head -20
  tail -n 1 "$state/tests.log"
  touch "$state/tests.done"
fi
[ -e "$state/tests.done" ] || finish 0
if [ ! -e "$state/layers.done" ] && [ "$(left)" -gt 30 ]; then
  timeout "$(left)" python -m conv2d_ext.benchmark --json "$state/h100.json" --resume \
    >"$state/h100-summary.md" 2>>"$state/benchmark.log" && touch "$state/layers.done"
  tail -n 1 "$state/benchmark.log"
fi
if [ -e "$state/layers.done" ] && [ ! -e "$state/models.done" ] && [ "$(left)" -gt 30 ]; then
  timeout "$(left)" python -m conv2d_ext.benchmark --models --json "$state/h100-models.json" --resume \
    >"$state/models-summary.md" 2>>"$state/models.log" && touch "$state/models.done"
  tail -n 1 "$state/models.log"
fi
[ -e "$state/models.done" ] && echo "records: complete"
finish 0
