#!/usr/bin/env bash
# compute-sanitizer over a small-shape subset of the GPU tests, with PyTorch's
# caching allocator off so that out-of-bounds accesses hit unowned memory.
# Fails if the tool is missing or reports anything.
#
#   scripts/sanitize.sh OUTDIR [pytest -k expression]
set -uo pipefail
out=${1:?usage: scripts/sanitize.sh OUTDIR [pytest -k expression]}
select=${2:-"cuda and f32 and (case0 or case4 or case8 or case12 or case13)"}
mkdir -p "$out"
cd "$(dirname "$0")/.."
command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer not found"; exit 1; }
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
status=0
for tool in memcheck racecheck; do
  log="$out/sanitize-$tool.log"
  compute-sanitizer --tool "$tool" --error-exitcode 99 --target-processes all \
    python -m pytest tests/test_correctness.py -q -p no:logging -k "$select" >"$log" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -n 1)
  echo "$tool: exit $rc; ${summary:-no summary}; $(grep -E '[0-9]+ passed' "$log" | tail -n 1)"
  [ "$rc" -eq 0 ] || status=1
done
exit $status
