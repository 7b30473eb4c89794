#!/usr/bin/env bash
# On a machine with a CUDA GPU and torch installed: build a wheel of
# conv2d_ext, install it into a new virtual environment that sees only the
# torch of the current one (no checkout, no editable install), and run the whole test
# suite and the benchmark against the installed package from a directory
# outside the source tree. Logs and the benchmark JSON go to OUTDIR.
#
#   scripts/wheel_check.sh OUTDIR [benchmark arguments...]
set -uo pipefail
out=$(mkdir -p "${1:?usage: scripts/wheel_check.sh OUTDIR [benchmark arguments...]}" && cd "$1" && pwd)
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
export MAX_JOBS=${MAX_JOBS:-$(nproc)} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} PYTHONUNBUFFERED=1
work=$(mktemp -d)
status=0

cd "$repo"
start=$(date +%s)
if ! python -m pip wheel --no-build-isolation --no-deps -w "$work/dist" . >"$out/wheel-build.log" 2>&1; then
  tail -n 40 "$out/wheel-build.log"
  echo "WHEEL BUILD FAILED"
  exit 1
fi
wheel=$(ls "$work"/dist/conv2d_ext-*.whl)
echo "wheel: $(basename "$wheel") ($(( $(date +%s) - start )) s)"
python scripts/check_module_deps.py "$wheel" || exit 1

# The new environment sees torch and the test tools of the one running this
# script through a path entry (its .pth files, an editable install's
# included, are not run), and gets the wheel as its only package.
python -m venv "$work/venv"
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$site/outer_environment.pth"
"$work/venv/bin/python" -m pip install -q --no-deps --no-index "$wheel" || exit 1
cd "$work"
"$work/venv/bin/python" - <<'PY' || exit 1
import conv2d_ext, sys
where = conv2d_ext.__file__
assert where.startswith(sys.prefix), f"conv2d_ext imported from {where}, not from the new environment"
print("installed:", where, conv2d_ext.build_info())
PY
start=$(date +%s)
"$work/venv/bin/python" -m pytest "$repo/tests" -q -p no:cacheprovider -p no:logging -rfE >"$out/wheel-tests.log" 2>&1 || status=1
grep -E "^(FAILED|ERROR)" "$out/wheel-tests.log" | head -20
echo "wheel tests: $(tail -n 1 "$out/wheel-tests.log") ($(( $(date +%s) - start )) s)"
"$work/venv/bin/python" -m conv2d_ext.benchmark --json "$out/wheel-benchmark.json" "$@" \
  >"$out/wheel-benchmark.md" 2>/dev/null || status=1
cat "$out/wheel-benchmark.md"
exit $status
