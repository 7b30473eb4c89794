#!/usr/bin/env bash
# The benchmark records of one build, over as many calls as it takes on one
# GPU machine: build (once), the whole test suite (once), then the layer
# benchmark (every group, both precisions and layouts) and the models
# benchmark, each resumed where the last call stopped. Every call stops
# by itself after SECONDS_LEFT seconds (default 560) and copies what
# exists to OUTDIR; run it again until it prints "records: complete". The
# summaries are then `python -m conv2d_ext.benchmark --report h100.json
# --models-json h100-models.json`.
#
#   CONV2D_EXT_COMMIT=<sha> scripts/gpu_records.sh OUTDIR
#
# State between calls lives in .devbuild/ (ignored by git). Every
# precision: float32's two modes, bfloat16 and float16.
set -uo pipefail
out=$(realpath -m "${1:?usage: scripts/gpu_records.sh OUTDIR}")
commit=${CONV2D_EXT_COMMIT:?set CONV2D_EXT_COMMIT to the commit being built}
cd "$(dirname "$0")/.."
deadline=$(( $(date +%s) + ${SECONDS_LEFT:-560} ))
left() { echo $(( deadline - $(date +%s) )); }
state=.devbuild
# State left by another commit's run is not this one's.
if [ -e "$state/commit" ] && [ "$(cat "$state/commit")" != "$commit" ]; then
  rm -rf "$state" conv2d_ext/_C*.so
fi
mkdir -p "$state" "$out"
echo "$commit" >"$state/commit"
export PYTHONUNBUFFERED=1
precisions="--precision tf32,ieee,bf16,fp16"
finish() {
  for f in gpu.txt build.log tests.log h100.json benchmark.log h100-models.json models.log; do
    [ -e "$state/$f" ] && cp "$state/$f" "$out/"
  done
  exit "${1:-0}"
}

if [ ! -e "$state/build.done" ]; then
  SKIP_TESTS=1 SKIP_BENCH=1 scripts/gpu_check.sh "$state" >"$state/gpu_check.txt" 2>&1 || { tail -20 "$state/gpu_check.txt"; finish 1; }
  grep "^build:" "$state/gpu_check.txt"
  touch "$state/build.done"
fi
if [ ! -e "$state/tests.done" ] && [ "$(left)" -gt 200 ]; then
  timeout "$(left)" python -m pytest tests -q -p no:logging -rfE >"$state/tests.log" 2>&1
  rc=$?
  grep -E "^(FAILED|ERROR)" "$state/tests.log" | head -20
  tail -n 1 "$state/tests.log"
  [ $rc -eq 124 ] || touch "$state/tests.done"  # failures are reported, a cut-off run is repeated
fi
[ -e "$state/tests.done" ] || finish 0
if [ ! -e "$state/layers.done" ] && [ "$(left)" -gt 30 ]; then
  timeout "$(left)" python -m conv2d_ext.benchmark --json "$state/h100.json" --resume $precisions \
    >/dev/null 2>>"$state/benchmark.log" && touch "$state/layers.done"
  tail -n 1 "$state/benchmark.log"
fi
if [ -e "$state/layers.done" ] && [ ! -e "$state/models.done" ] && [ "$(left)" -gt 30 ]; then
  timeout "$(left)" python -m conv2d_ext.benchmark --models --json "$state/h100-models.json" --resume $precisions \
    >/dev/null 2>>"$state/models.log" && touch "$state/models.done"
  tail -n 1 "$state/models.log"
fi
[ -e "$state/models.done" ] && echo "records: complete"
finish 0
