#!/usr/bin/env bash
# On a machine with a CUDA GPU: build conv2d_ext, run the whole test suite,
# then the benchmark. Logs and the benchmark JSON go to OUTDIR; a short
# summary goes to stdout.
#
#   scripts/gpu_check.sh OUTDIR [benchmark arguments...]
#
# SKIP_BUILD=1, SKIP_TESTS=1 or SKIP_BENCH=1 leave a stage out; PYTEST_ARGS
# narrows the tests. The host compiler: some toolchains link libstdc++
# into the module statically, which the check after the build refuses, and
# a preset CXX was seen to be such a one, so the build uses
# the distribution's /usr/bin/g++ and gcc where they exist;
# GPU_CHECK_CXX and GPU_CHECK_CC name others.
set -uo pipefail
if [ -n "${GPU_CHECK_CXX:-}" ]; then
  export CXX=$GPU_CHECK_CXX CC=${GPU_CHECK_CC:-${CC:-cc}}
elif [ -x /usr/bin/g++ ] && [ -x /usr/bin/gcc ]; then
  export CXX=/usr/bin/g++ CC=/usr/bin/gcc
fi
out=${1:?usage: scripts/gpu_check.sh OUTDIR [benchmark arguments...]}
shift
mkdir -p "$out"
cd "$(dirname "$0")/.."
export MAX_JOBS=${MAX_JOBS:-$(nproc)} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} PYTHONUNBUFFERED=1
status=0

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv >"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  start=$(date +%s)
  if ! python -m pip install --no-build-isolation --no-deps -v -e . >"$out/build.log" 2>&1; then
    grep -E "error|Error" "$out/build.log" | head -40
    echo "BUILD FAILED (log: build.log)"
    exit 1
  fi
  echo "build: $(( $(date +%s) - start )) s"
  # Each translation unit's compile time (start and end in ms), for the
  # build's critical path.
  # (An editable install may build under a temporary folder.)
  ninja_log=$(ls -t $(find build /tmp -name .ninja_log 2>/dev/null) 2>/dev/null | head -n 1)
  [ -n "$ninja_log" ] && cp "$ninja_log" "$out/ninja_log.txt"
fi
# Refuse a module with unexpected dependencies or its own static libstdc++
# (some compilers link it in; the first error message it formats crashes).
module=$(ls conv2d_ext/_C*.so 2>/dev/null | head -n 1)
if [ -n "$module" ] && ! python scripts/check_module_deps.py "$module"; then
  echo "BUILD UNUSABLE (compiler: ${CXX:-c++})"
  exit 1
fi

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  start=$(date +%s)
  python -m pytest tests -q -p no:logging -rfE ${PYTEST_ARGS:-} >"$out/tests.log" 2>&1 || status=1
  grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -40
  tail -n 1 "$out/tests.log"
  echo "tests: $(( $(date +%s) - start )) s"
fi

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  start=$(date +%s)
  python -m conv2d_ext.benchmark --json "$out/benchmark.json" "$@" \
    >"$out/benchmark.md" 2>"$out/benchmark.progress" || status=1
  cat "$out/benchmark.md"
  tail -n 3 "$out/benchmark.progress"
  echo "benchmark: $(( $(date +%s) - start )) s"
fi
exit $status
