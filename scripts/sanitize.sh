#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck) over a small-shape
# subset of the GPU tests, with PyTorch's caching allocator off so that
# out-of-bounds accesses hit unowned memory. Fails if the tool is missing,
# reports anything or prints no summary, or if no test ran.
#
#   scripts/sanitize.sh OUTDIR [pytest -k expression]
#
# Default subset (66 tests):
# - tests/test_correctness.py, each test running the forward, dgrad and
#   wgrad (through autograd) of one case: the direct kernels on cases 0
#   (5x9), 4 (7x7, stride 2; its dgrad), 8 (depthwise), 12 (5x9, several
#   tiles) and 13 (generic kernel size), TF32 mode; the tensor-core forward,
#   the dgrad that runs on it and the tensor-core wgrad on cases 16 (5x9)
#   and 18 (3x3, partial channel tile), TF32 and IEEE modes; the flat sm_90
#   forward and dgrad on cases 25 (dilated 5x9, several column tiles) and
#   28 (1x1, several k8 steps per chunk, partial chunk), TF32 and IEEE
#   (3xTF32) modes; strided dgrad phase by phase on cases 31 (stride 2,
#   groups), 35 (stride 2, phases on the flat kernel) and 37 (stride 3: a
#   phase no tap reaches, one starting at a later grad_output row), IEEE
#   mode; the sm_90 wgrad (also on cases 25 and 28) on cases 39 (grad_output
#   copied without TMA, a K tile past the right edge) and 40 (7x7, units of
#   several channel groups, padding), TF32 and IEEE modes; the flat
#   3xTF32 forward with three k8 steps per temporary on cases 42 (a 9-step
#   stage) and 43 (5x5: a 5-step stage), IEEE mode; the flat forward and
#   dgrad with row shifts on cases 46 (4x5: an odd number of halo rows) and
#   48 (two dilated kernel rows, partial tiles in three row phases), TF32
#   and IEEE modes; the flat 3xTF32 kernel over a long K (accumulation
#   segments summed in the output) on cases 52 (forward with bias, an odd
#   output width) and 54 (5x9 dgrad), IEEE mode;
# - tests/test_determinism.py::test_bitwise_reproducible[*-f32-cuda], both
#   modes: the dgrad and wgrad ops called directly, wgrad split over many
#   blocks;
# - tests/test_few_channels.py::test_few_channels_against_float64, TF32
#   mode (the small-channel kernels are FFMA in both modes), forward, dgrad
#   and wgrad of one case: the depthwise kernels on cases 0 (3x3), 1 (3x3,
#   depth multiplier 2, stride 2), 3 (5x5, rows of 64 and 60 floats: the
#   forward and dgrad stage by TMA on Hopper) and 7 (generic 3x5,
#   multiplier 2, stride (2, 1)); the few-channel kernels on cases 13 (RGB
#   stem, 7x7, stride 2) and 17 (rows of 68 floats: TMA); the narrow tile
#   with 4 output channels per group on case 24; wide tiles striding over
#   more work items than a wave of blocks on case 27; tall depthwise tiles
#   (two columns a thread) on cases 28 (one wave over whole planes), 29
#   (rows of 45 floats), 40 (two column tiles, an odd lead: pairs loaded
#   from the column before; also without the tensor-copy engine) and 42 (an
#   odd output width), one column on the generic kernel size (41);
#   the strided dgrad staged by TMA with prearranged phase weights on cases
#   30 (7x7, two groups, a partial last chunk) and 32 (dilation = stride),
#   two chunks staged at a time; one at a time on case 39 (a 41-row halo).
#   The few-channel wgrad on tensor cores runs on the wide cases there
#   (13, 17, 27, 30, 32) in TF32 (mma.sync), and in 3xTF32 on cases 13 and
#   30 (IEEE mode: wgmma on Hopper); case 17 also without the tensor-copy engine (grad_output staged
#   into its swizzled layout by 16-byte async copies). The few-channel
#   forward on tensor cores (32 or more output channels per group) runs on
#   cases 13, 21 and 27 in TF32 and on 13 and 21 in 3xTF32: rows of 30 and
#   130 floats staged by 4-byte async copies, rows of 64 by the tensor-copy
#   engine with a partial second channel tile (case 21). On Hopper it runs
#   on wgmma, and cases 33 (several stages per block) and 34 (two groups,
#   stride 2) store its output by the tensor-copy engine, in both modes.
# - tests/test_few_channels.py::test_wgrad_3xtf32_stages_on_hopper: the
#   few-channel wgrad's 3xTF32 stages on Hopper: mma.sync on cases 13 and
#   30; wgmma (the default there) on cases 13 (three m64 tiles of rows in
#   one block), 14 (one tile, its warpgroups splitting the pixels), 35 (two
#   tiles) and 36 (three and one, a partial last stage), whose grad_output
#   rows (15 to 70 floats, not multiples of 4) are staged by async copies
#   into the swizzled layout, and 30 (three tiles, two groups) and 33 (one
#   tile, two channel tiles), staged by the tensor-copy engine.
# - tests/test_few_channels.py::test_tf32_dgrad_on_tensor_cores: the
#   TF32 dgrad of every stride phase at once (also run by the TF32 cases
#   13, 17 and 34 above) on cases 37 (a partial chunk of output channels,
#   async copies) and 38 (phases no tap reaches, the tensor-copy engine).
# A -k expression replaces it, selecting from those three files.
set -uo pipefail
out=${1:?usage: scripts/sanitize.sh OUTDIR [pytest -k expression]}
mkdir -p "$out"
cd "$(dirname "$0")/.."
command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer not found"; exit 1; }

if [ $# -ge 2 ]; then
  tests=(tests/test_correctness.py tests/test_determinism.py tests/test_few_channels.py -k "$2")
else
  tests=()
  for c in 0 4 8 12 13 16 18; do
    tests+=("tests/test_correctness.py::test_against_float64[cuda-f32-case$c]")
  done
  for c in 16 18; do
    tests+=("tests/test_correctness.py::test_cuda_float32_both_precisions[ieee-case$c]")
  done
  for c in 25 28 39 40 46 48; do
    for mode in tf32 ieee; do
      tests+=("tests/test_correctness.py::test_cuda_float32_both_precisions[$mode-case$c]")
    done
  done
  for c in 31 35 37 42 43 52 54; do
    tests+=("tests/test_correctness.py::test_cuda_float32_both_precisions[ieee-case$c]")
  done
  for mode in ieee tf32; do
    tests+=("tests/test_determinism.py::test_bitwise_reproducible[$mode-f32-cuda]")
  done
  for c in 0 1 3 7 13 17 21 24 27 28 29 30 32 33 34 39 40 41 42; do
    tests+=("tests/test_few_channels.py::test_few_channels_against_float64[tf32-cuda-case$c]")
  done
  for c in 13 21 30 33 34 43; do
    tests+=("tests/test_few_channels.py::test_few_channels_against_float64[ieee-cuda-case$c]")
  done
  tests+=("tests/test_few_channels.py::test_strided_dgrad_one_column_a_thread[ieee-case43]")
  tests+=("tests/test_few_channels.py::test_few_channels_without_copy_engine[tf32-case17]")
  tests+=("tests/test_few_channels.py::test_few_channels_without_copy_engine[tf32-case40]")
  for c in 13 14 30 33 35 36; do
    tests+=("tests/test_few_channels.py::test_wgrad_3xtf32_stages_on_hopper[case$c-wgmma]")
  done
  for c in 13 30; do
    tests+=("tests/test_few_channels.py::test_wgrad_3xtf32_stages_on_hopper[case$c-mma_sync]")
  done
  tests+=("tests/test_few_channels.py::test_tf32_dgrad_on_tensor_cores[case37-async_copies]")
  tests+=("tests/test_few_channels.py::test_tf32_dgrad_on_tensor_cores[case38-hopper]")
fi

export PYTORCH_NO_CUDA_MEMORY_CACHING=1
status=0
for tool in memcheck racecheck synccheck; do
  log="$out/sanitize-$tool.log"
  compute-sanitizer --tool "$tool" --error-exitcode 99 --target-processes all \
    python -m pytest -q -p no:logging "${tests[@]}" >"$log" 2>&1
  rc=$?
  # memcheck and synccheck: "ERROR SUMMARY: N errors"; racecheck:
  # "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)".
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -n 1)
  result=$(grep -E '[0-9]+ (passed|skipped|deselected|failed)' "$log" | tail -n 1)
  echo "$tool: exit $rc; ${summary:-no summary}; ${result:-no test result}"
  # Nothing run (no GPU: every test skipped) counts as a failure too.
  [ "$rc" -eq 0 ] && [ -n "$summary" ] && grep -qE '[0-9]+ passed' <<<"$result" || status=1
done
exit $status
