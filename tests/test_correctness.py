"""Forward and both gradients against float64 F.conv2d on varied shapes."""
import math
import random

import pytest
import torch

import conv2d_ext
from utils import (DEVICES, HAS_CUDA, hopper_kernels, is_hopper_build, option, pair,
                   precision_of, reduction_lengths, reference, rel_err, tf32_mode, tolerance)

# (N, Cin, H, W, Cout, (KH, KW), stride, padding, dilation, groups, bias):
# every specialised kernel size, the generic path, each parameter alone and
# in combination.
HAND_PICKED = [
    (2, 3, 11, 13, 4, (5, 9), 1, 0, 1, 1, False),  # workload a's kernel
    (1, 4, 17, 23, 5, (5, 9), 1, (2, 4), (2, 3), 1, True),  # workload b
    (2, 6, 9, 14, 7, (3, 3), 1, 1, 1, 1, True),  # workload c's kernel
    (1, 5, 8, 8, 3, (1, 1), 1, 0, 1, 1, True),
    (2, 4, 15, 12, 6, (7, 7), 2, 3, 1, 1, False),  # stem
    (1, 3, 10, 9, 4, (3, 5), (2, 1), (1, 2), 1, 1, True),
    (2, 2, 7, 19, 3, (1, 7), (1, 3), (0, 3), (1, 2), 1, False),
    (1, 3, 9, 8, 2, (2, 2), 2, 0, 1, 1, True),
    (2, 8, 10, 11, 8, (3, 3), 1, 1, 1, 8, True),  # depthwise
    (1, 4, 9, 9, 8, (3, 3), (2, 2), 1, 1, 4, False),  # depth multiplier 2
    (1, 6, 13, 7, 9, (3, 3), (3, 2), (2, 1), (3, 2), 3, True),  # grouped
    (1, 16, 9, 34, 20, (3, 3), 1, 1, 1, 1, False),  # channel tiles 16 + 4
    (3, 2, 31, 40, 33, (5, 9), (1, 2), (2, 4), (1, 1), 1, True),  # > 1 tile
    (1, 3, 12, 12, 2, (4, 6), (1, 1), (3, 2), (2, 1), 1, True),  # generic
    (2, 4, 6, 6, 4, (6, 6), 1, 0, 1, 2, False),  # kernel == input
    (1, 1, 1, 1, 1, (1, 1), 1, 0, 1, 1, True),
]

# Shapes for the tensor-core forward (>= 8 channels per group): partial
# channel chunks, partial 64-channel tiles, partial 8x32 pixel tiles, every
# specialised size and the generic one, strides, dilations, groups.
# Layouts of the flat sm_90 kernel with row shifts (at most 32 output
# channels per group: M rows 32..63 compute the next output row), in the
# forward and in dgrad through it: 5x9 with K past 512 (three k8 steps per
# 3xTF32 temporary); b's dilations with dropped columns; an even kernel
# height (an odd number of halo rows: the row phases differ by one); groups;
# a dilated kernel of two rows whose three row phases end in partial tiles.
ROW_SHIFTS = [
    (2, 16, 21, 72, 32, (5, 9), 1, 0, 1, 1, True),
    (1, 24, 40, 48, 20, (5, 9), 1, (2, 4), (2, 3), 1, False),
    (2, 8, 17, 40, 12, (4, 5), 1, (1, 2), 1, 1, True),
    (1, 32, 13, 44, 48, (3, 3), 1, 1, 1, 2, True),
    (2, 16, 40, 36, 16, (2, 3), 1, (0, 1), (3, 1), 1, True),
]

# The flat 3xTF32 kernel over a long K (>= 2048) cuts each item's chain of
# accumulator additions into segments summed in the output: a forward with
# bias, row shifts, b's dilations and an odd output width (8-byte and
# 4-byte read-add-writes); a 3x3 forward over 256 channels with partial
# tiles; a's dgrad shape (K = 64 * 45). The pass each case segments in IEEE
# mode is checked below.
LONG_K = [
    ((1, 48, 14, 84, 24, (5, 9), 1, (2, 3), (2, 3), 1, True), "forward"),
    ((1, 256, 9, 68, 40, (3, 3), 1, 1, 1, 1, True), "forward"),
    ((2, 16, 13, 76, 64, (5, 9), 1, (2, 4), 1, 1, False), "backward_input"),
]

TENSOR_CORE = [
    (2, 8, 12, 40, 16, (5, 9), 1, 0, 1, 1, False),
    (1, 12, 19, 45, 20, (5, 9), 1, (2, 4), (2, 3), 1, True),
    (2, 16, 11, 37, 70, (3, 3), 1, 1, 1, 1, True),
    (1, 24, 9, 33, 16, (1, 1), 1, 0, 1, 1, False),
    (1, 8, 20, 50, 8, (7, 7), 2, 3, 1, 1, True),
    (1, 32, 10, 35, 48, (3, 3), 1, 1, 1, 2, True),
    (1, 16, 13, 40, 24, (4, 6), (1, 2), (2, 1), (2, 1), 1, False),
    (2, 16, 8, 64, 16, (3, 3), (2, 1), 1, (1, 2), 1, True),
    (1, 9, 5, 7, 9, (3, 3), 1, 1, 1, 1, True),
    # Wide rows for the flat sm_90 kernel: several column tiles of each row
    # pitch, odd row counts over the dilation phases, several k8 steps per
    # chunk (1x1) with a partial last chunk.
    (1, 8, 11, 300, 64, (5, 9), 1, (2, 4), (2, 3), 1, True),
    (1, 16, 7, 520, 16, (3, 3), 1, 1, 1, 1, False),
    (2, 8, 13, 200, 8, (2, 11), 1, (1, 5), (3, 2), 1, True),
    (1, 40, 5, 268, 72, (1, 1), 1, 0, 1, 1, True),
    # dgrad runs on the forward kernels at unit stride when the padding is
    # at most dilation*(K-1); here the rows' padding is larger (direct
    # dgrad) and the columns' is asymmetric in the forward dgrad becomes.
    (2, 16, 6, 21, 24, (1, 3), 1, (1, 0), 1, 1, False),
    (1, 24, 9, 30, 8, (3, 5), 1, (2, 1), (1, 2), 1, True),
    # Strided dgrad runs phase by phase on the forward kernels: stride 2 with
    # groups and odd sizes; 1x1 at stride 2 (phases no tap reaches); stride
    # 2 with dilation 3 (a sub-kernel of two taps 3 apart) and with dilation
    # 2 (every tap in one phase); grad_output rows of a multiple of 4 (the
    # flat kernel); padding past the kernel's reach (a phase's forward
    # starts at a later grad_output row); stride 3 (a phase no tap reaches,
    # one starting at a later row).
    (2, 16, 15, 33, 24, (3, 3), 2, 1, 1, 2, True),
    (1, 16, 9, 20, 32, (1, 1), 2, 0, 1, 1, False),
    (1, 8, 17, 26, 16, (3, 3), 2, 3, 3, 1, True),
    (1, 8, 14, 30, 8, (3, 3), 2, 2, 2, 1, False),
    (1, 16, 20, 136, 16, (3, 3), 2, 1, 1, 1, True),
    (1, 8, 10, 12, 8, (1, 1), 2, 1, 1, 1, True),
    (1, 16, 19, 32, 8, (2, 2), 3, 1, 1, 1, True),
    # The sm_90 wgrad (unit stride, input rows of a multiple of 4, outputs
    # at least 70% of their 64-column K tiles): groups, channel counts off
    # the 8-channel units and the 64-channel tile, grad_output rows not a
    # multiple of 4 (copied without TMA), units of several channel groups
    # (7x7), K tiles crossing the bottom and right edges.
    (1, 32, 6, 124, 48, (3, 3), 1, 1, 1, 2, True),
    (1, 12, 5, 60, 70, (3, 3), 1, 0, 1, 1, False),
    (2, 24, 12, 100, 16, (7, 7), 1, 3, 1, 1, True),
    (1, 16, 7, 64, 8, (3, 3), 1, 0, 1, 1, True),
    # The sm_90 wgrad on workload a's 5x9 (four channel groups, a K tile
    # crossing the right edge, several K tiles per block's slice of the
    # batch, so that its tile cursor carries over columns, rows and images)
    # and at column dilation 4.
    (1, 32, 9, 180, 24, (5, 9), 1, 0, 1, 1, True),
    (2, 16, 6, 120, 8, (3, 5), 1, (1, 2), (1, 4), 1, False),
    # Five K tiles per block (1152 K tiles over the H100's 264 block slots):
    # the cursor carries over columns, row phases (dilation 2) and images.
    (12, 8, 188, 100, 8, (3, 3), 1, 1, (2, 1), 1, False),
    # The flat 3xTF32 forward with three k8 steps per temporary (K >= 512):
    # a 9-step stage (3x3) and a 5-step stage (5x5: three, then two).
    (1, 64, 9, 64, 16, (3, 3), 1, 1, 1, 1, True),
    (1, 24, 10, 64, 16, (5, 5), 1, 2, 1, 1, False),
] + ROW_SHIFTS + [case for case, _ in LONG_K]


def _random_case(rng):
    groups = rng.choice([1, 1, 2, 3])
    cin = groups * rng.randint(1, 5)
    cout = groups * rng.randint(1, 6)
    kh, kw = rng.randint(1, 6), rng.randint(1, 9)
    stride = (rng.randint(1, 3), rng.randint(1, 3))
    dilation = (rng.randint(1, 3), rng.randint(1, 3))
    padding = (rng.randint(0, 3), rng.randint(0, 4))
    h = max(dilation[0] * (kh - 1) + 1 - 2 * padding[0], 1) + rng.randint(0, 12)
    w = max(dilation[1] * (kw - 1) + 1 - 2 * padding[1], 1) + rng.randint(0, 12)
    return (rng.randint(1, 3), cin, h, w, cout, (kh, kw), stride, padding, dilation, groups, rng.random() < 0.5)


RANDOM = [_random_case(random.Random(seed)) for seed in range(24)]

# The sm_90 wgrad skips a K tile's k8 steps past the output's right edge,
# in pairs: a last tile of 24 columns (steps 4-7 skipped, so the second
# 3xTF32 temporary of four steps never starts) and of 1 column (steps 2-7;
# B by async copies). Tiles of 33-48 columns (6 steps) are in TENSOR_CORE.
# Last, so that the other cases keep their numbers.
WGRAD_EDGE_STEPS = [
    (1, 16, 6, 152, 16, (3, 3), 1, 1, 1, 1, True),
    (2, 8, 5, 196, 24, (3, 4), 1, 0, 1, 1, False),
]
CASES = HAND_PICKED + TENSOR_CORE + RANDOM + WGRAD_EDGE_STEPS


def _run(case, device, dtype):
    n, cin, h, w, cout, k, stride, padding, dilation, groups, bias = case
    x = torch.randn(n, cin, h, w, device=device, dtype=dtype, requires_grad=True)
    wt = torch.randn(cout, cin // groups, *k, device=device, dtype=dtype, requires_grad=True)
    b = torch.randn(cout, device=device, dtype=dtype, requires_grad=True) if bias else None
    y = conv2d_ext.conv2d(x, wt, b, stride, padding, dilation, groups)
    gy = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, wt] + ([b] if bias else []), gy)
    refs = reference(x, wt, b, stride, padding, dilation, groups, grad_out=gy)
    mags = reference(x, wt, b, stride, padding, dilation, groups, grad_out=gy, absolute=True)
    precision = precision_of(dtype, device)
    k_fprop, k_dgrad, k_wgrad = reduction_lengths(x, wt, y)
    names = ["forward", "grad_input", "grad_weight", "grad_bias"]
    lengths = [k_fprop, k_dgrad, k_wgrad, k_wgrad]
    for name, out, ref, mag, length in zip(names, (y, *grads), refs, mags, lengths):
        err = rel_err(out, ref, mag, length)
        tol = tolerance(dtype, precision, length)
        assert err <= tol, f"{name}: relative error {err:.3g} > {tol:.3g} for {case} ({precision})"


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("device", DEVICES)
def test_against_float64(case, device, dtype):
    _run(case, device, dtype)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_cuda_float32_both_precisions(case, precision):
    _run(case, "cuda", torch.float32)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_more_images_than_grid_blocks(precision):
    """The grid has at most 65535 blocks in y and z, so with a larger batch
    some blocks loop over several images, reusing their shared buffers and
    accumulators: every image must come out whole. Tensor-core channels,
    all passes."""
    case = (65535 + 3, 8, 5, 6, 16, (3, 3), 1, 1, 1, 1, True)
    _run(case, "cuda", torch.float32)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_wgrad_sum_chunks(precision):
    """The strided (mma.sync) wgrad in IEEE mode stores its FP32 sums to a
    workspace slot every 16 K tiles of a slice. 2300 K tiles over 132 SMs
    (H100, H200) make slices of 18 tiles, two chunks each (16 + 2), and a
    last slice of 14 tiles whose second slot holds zeros: every slot must
    be written and summed once."""
    case = (2, 8, 368, 1580, 64, (3, 3), 2, 1, 1, 1, False)
    _run(case, "cuda", torch.float32)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", TENSOR_CORE, ids=[f"tc{i}" for i in range(len(TENSOR_CORE))])
def test_cuda_mma_sync_kernels(case, precision):
    """On a Hopper GPU the forward runs on wgmma; the mma.sync kernels
    that other GPUs run are checked here with the Hopper kernels off."""
    with hopper_kernels(False):
        _run(case, "cuda", torch.float32)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", TENSOR_CORE, ids=[f"tc{i}" for i in range(len(TENSOR_CORE))])
def test_cuda_sm90_pixels_in_m_kernels(case, precision):
    """On a Hopper GPU unit-stride shapes run the flat wgmma kernel; the
    other wgmma kernel (strided shapes) is checked on all cases here, in
    both modes."""
    if not is_hopper_build():
        pytest.skip("needs sm_90 and a build with sm_90a code")
    with option("flat_kernels", False):
        _run(case, "cuda", torch.float32)


def _out_width(case):
    _, _, _, w, _, k, stride, padding, dilation, _, _ = case
    return (w + 2 * pair(padding)[1] - pair(dilation)[1] * (k[1] - 1) - 1) // pair(stride)[1] + 1


def _flat_takes(width, dilation_h):
    """The flat kernel's tensor copies need rows of a multiple of 16 bytes
    and dilated rows at most 8 apart; other shapes take the other wgmma
    kernel."""
    return width % 4 == 0 and dilation_h <= 8


def _wgrad_sm90_takes(case):
    """The sm_90 wgrad: unit stride, TMA-able input rows and dilated rows,
    and outputs that fill at least 70% of their 64-column K tiles."""
    _, _, _, w, _, _, stride, _, dilation, _, _ = case
    out_w = _out_width(case)
    tiles = -(-out_w // 64)
    return (pair(stride) == (1, 1) and w % 4 == 0 and pair(dilation)[0] <= 8
            and 10 * out_w >= 7 * 64 * tiles)


def _dgrad_is_fprop(case):
    """dgrad runs as a forward pass: unit stride, padding <= dilation*(K-1)."""
    _, _, _, _, _, k, stride, padding, dilation, _, _ = case
    return pair(stride) == (1, 1) and all(
        p <= d * (kk - 1) for p, d, kk in zip(pair(padding), pair(dilation), k)
    )


@pytest.mark.parametrize("case", ROW_SHIFTS, ids=[f"shift{i}" for i in range(len(ROW_SHIFTS))])
def test_row_shift_cases_get_row_shifts(case, precision):
    """The ROW_SHIFTS cases test what they claim: the flat layout of their
    forward and of their dgrad has two row shifts, in both modes (a host
    decision: checked without a GPU too). That the plan runs the flat
    kernel on them is checked with the other TENSOR_CORE cases."""
    n, cin, h, w, cout, k, stride, padding, dilation, groups, _ = case
    x = torch.empty(n, cin, h, w)
    wt = torch.empty(cout, cin // groups, *k)
    geometry = (pair(stride), pair(padding), pair(dilation), groups)
    for pass_ in ("forward", "backward_input"):
        shifts = torch.ops.conv2d_ext._flat_row_shifts(pass_, x, wt, *geometry)
        assert shifts == 2, f"{case} {pass_}: {shifts} row shifts"


@pytest.mark.parametrize("case,pass_", LONG_K, ids=[f"long{i}" for i in range(len(LONG_K))])
def test_long_k_cases_get_segments(case, pass_):
    """The LONG_K cases test what they claim: in IEEE mode the flat layout of
    their pass cuts an item's accumulation into several segments, and in
    TF32 mode (no 3xTF32 temporaries) into one (a host decision)."""
    n, cin, h, w, cout, k, stride, padding, dilation, groups, _ = case
    x = torch.empty(n, cin, h, w)
    wt = torch.empty(cout, cin // groups, *k)
    geometry = (pair(stride), pair(padding), pair(dilation), groups)
    with tf32_mode(False):
        segments = torch.ops.conv2d_ext._flat_segments(pass_, x, wt, *geometry)
        assert segments > 1, f"{case} {pass_}: {segments} segments"
    with tf32_mode(True):
        assert torch.ops.conv2d_ext._flat_segments(pass_, x, wt, *geometry) == 1


def test_segments_only_for_long_k():
    """In IEEE mode a's forward (K = 32 * 45) keeps one segment and its dgrad
    (K = 64 * 45) takes several; c's passes (K = 576 and 1152) keep one."""
    ops = torch.ops.conv2d_ext
    with tf32_mode(False):
        geometry = ((1, 1), (0, 0), (1, 1), 1)
        x, wt = torch.empty(8, 32, 512, 512), torch.empty(64, 32, 5, 9)
        assert ops._flat_segments("forward", x, wt, *geometry) == 1
        assert ops._flat_segments("backward_input", x, wt, *geometry) > 1
        assert ops._flat_segments("backward_weight", x, wt, *geometry) == 0
        geometry = ((1, 1), (1, 1), (1, 1), 1)
        x, wt = torch.empty(8, 64, 512, 1024), torch.empty(128, 64, 3, 3)
        assert ops._flat_segments("forward", x, wt, *geometry) == 1
        assert ops._flat_segments("backward_input", x, wt, *geometry) == 1


def test_row_shifts_only_for_narrow_tiles():
    """a's forward (64 output channels) keeps one row shift; its dgrad (32)
    takes two; 1x1 kernels never do (K would double with the outputs)."""
    ops = torch.ops.conv2d_ext
    geometry = ((1, 1), (0, 0), (1, 1), 1)
    x, wt = torch.empty(8, 32, 512, 512), torch.empty(64, 32, 5, 9)
    with tf32_mode(True):
        assert ops._flat_row_shifts("forward", x, wt, *geometry) == 1
        assert ops._flat_row_shifts("backward_input", x, wt, *geometry) == 2
        assert ops._flat_row_shifts("backward_weight", x, wt, *geometry) == 0
        x, wt = torch.empty(2, 64, 64, 64), torch.empty(16, 64, 1, 1)
        assert ops._flat_row_shifts("forward", x, wt, *geometry) == 1


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@option("nhwc_copies", False)  # NCHW's own plan; its copies are test_nhwc's
def test_tensor_core_cases_reach_tensor_core_kernels(precision):
    """The TENSOR_CORE cases test what they claim: on sm_80+ the plan sends
    every forward, every dgrad that is a forward pass (unit stride) or a
    forward per stride phase, and every wgrad to a tensor-core kernel;
    forward and unit-stride dgrad on sm_90 to wgmma when the build has sm_90a
    code: the flat kernel, in both modes; wgrad there to wgmma where its
    tiles take the shape, as on the WGRAD_EDGE_STEPS cases."""
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        pytest.skip("no TF32 tensor cores")
    hopper = is_hopper_build()
    for case in TENSOR_CORE:
        n, cin, h, w, cout, k, stride, padding, dilation, groups, _ = case
        x = torch.empty(n, cin, h, w, device="cuda")
        wt = torch.empty(cout, cin // groups, *k, device="cuda")
        geometry = (pair(stride), pair(padding), pair(dilation), groups)
        unit_stride = pair(stride) == (1, 1)
        dh = pair(dilation)[0]

        def expect(width):
            if not hopper:
                return "implicit_gemm"
            flat = unit_stride and _flat_takes(width, dh)
            return "implicit_gemm_sm90_flat" if flat else "implicit_gemm_sm90"

        expected = expect(w)
        algo = torch.ops.conv2d_ext._algorithm("forward", x, wt, *geometry)
        assert algo == expected, f"{case} forward: {algo}, expected {expected}"
        algo = torch.ops.conv2d_ext._algorithm("backward_input", x, wt, *geometry)
        # dgrad's forward reads grad_output, as wide as the layer's output.
        if _dgrad_is_fprop(case):
            expected = expect(_out_width(case))
        else:  # one forward per stride phase; padding past the reach: direct
            expected = "dgrad_phases" if pair(stride) != (1, 1) else "direct"
        assert algo == expected, f"{case} backward_input: {algo}, expected {expected}"
        # wgrad: wgmma on sm_90 where its tiles take the shape.
        expected = "implicit_gemm_sm90" if hopper and _wgrad_sm90_takes(case) else "implicit_gemm"
        algo = torch.ops.conv2d_ext._algorithm("backward_weight", x, wt, *geometry)
        assert algo == expected, f"{case} backward_weight: {algo}, expected {expected}"
    for case in WGRAD_EDGE_STEPS:
        n, cin, h, w, cout, k, stride, padding, dilation, groups, _ = case
        x = torch.empty(n, cin, h, w, device="cuda")
        wt = torch.empty(cout, cin // groups, *k, device="cuda")
        geometry = (pair(stride), pair(padding), pair(dilation), groups)
        assert _wgrad_sm90_takes(case)
        expected = "implicit_gemm_sm90" if hopper else "implicit_gemm"
        algo = torch.ops.conv2d_ext._algorithm("backward_weight", x, wt, *geometry)
        assert algo == expected, f"{case} backward_weight: {algo}, expected {expected}"


# Last K tiles of 24 and 1 columns (4 and 2 steps), and of 44 columns (6
# steps) at a's 5x9 over four channel groups and at b's padding and dilations.
EDGE_STEP_BITS = WGRAD_EDGE_STEPS + [
    (1, 32, 9, 180, 24, (5, 9), 1, 0, 1, 1, False),
    (1, 32, 12, 124, 24, (5, 9), 1, (2, 4), (2, 3), 1, False),
]


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", EDGE_STEP_BITS,
                         ids=[f"edge{i}" for i in range(len(EDGE_STEP_BITS))])
def test_wgrad_edge_steps_same_bits(case):
    """In IEEE mode the sm_90 wgrad skips the k8 steps of a K tile past the
    output's right edge (in pairs); the switch off runs them on zeros. Both
    against float64, and the same bits: the skipped products are zeros,
    which leave every sum as it is."""
    n, cin, h, w, cout, k, stride, padding, dilation, groups, _ = case
    assert _wgrad_sm90_takes(case)
    geometry = (list(pair(stride)), list(pair(padding)), list(pair(dilation)), groups)
    x = torch.randn(n, cin, h, w, device="cuda")
    wt_shape = [cout, cin // groups, *k]
    ho = h + 2 * pair(padding)[0] - pair(dilation)[0] * (k[0] - 1)  # unit stride
    gy = torch.randn(n, cout, ho, _out_width(case), device="cuda")
    ref = torch.nn.grad.conv2d_weight(x.double(), wt_shape, gy.double(), *geometry)
    length = gy[0, 0].numel() * n
    bound = tolerance(torch.float32, "ieee", length)
    outs = []
    with tf32_mode(False):
        if is_hopper_build():
            wt = torch.empty(wt_shape, device="cuda")
            algo = torch.ops.conv2d_ext._algorithm("backward_weight", x, wt, *geometry)
            assert algo == "implicit_gemm_sm90", algo
        for on in (True, False):
            with option("wgrad_edge_steps", on):
                gw = torch.ops.conv2d_ext.conv2d_backward_weight(gy, x, wt_shape, *geometry)
            err = rel_err(gw, ref, reduction_len=length)
            assert err < bound, f"edge steps {on}: relative error {err:.3g} > {bound:.3g}"
            outs.append(gw)
    assert torch.equal(outs[0], outs[1]), "wgrad_edge_steps on and off give different bits"


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_views_off_16_byte_boundary(precision):
    """The flat kernel copies its halo with the tensor-copy engine, which
    needs a 16-byte aligned base: an input and a grad_output that start one
    element into their storage (contiguous views) must come out right in
    the forward and in dgrad."""
    n, cin, h, w, cout, k = 2, 8, 9, 64, 16, (3, 3)

    def offset_view(*shape):
        numel = math.prod(shape)
        return torch.randn(numel + 1, device="cuda")[1:].view(*shape)

    x = offset_view(n, cin, h, w).requires_grad_()
    assert x.data_ptr() % 16 != 0
    wt = torch.randn(cout, cin, *k, device="cuda", requires_grad=True)
    y = conv2d_ext.conv2d(x, wt, None, 1, 1, 1, 1)  # 64 columns in and out
    gy = offset_view(*y.shape)
    (gx,) = torch.autograd.grad(y, [x], gy)
    y_ref, gx_ref, _ = reference(x, wt, None, 1, 1, 1, 1, grad_out=gy)
    mags = reference(x, wt, None, 1, 1, 1, 1, grad_out=gy, absolute=True)
    k_fprop, k_dgrad, _ = reduction_lengths(x, wt, y)
    for name, out, ref, mag, length in (("forward", y, y_ref, mags[0], k_fprop),
                                        ("grad_input", gx, gx_ref, mags[1], k_dgrad)):
        err = rel_err(out, ref, mag, length)
        tol = tolerance(torch.float32, precision, length)
        assert err <= tol, f"{name}: relative error {err:.3g} > {tol:.3g} ({precision})"


def test_algorithm_query_rejects_unknown_pass():
    x, wt = torch.empty(1, 2, 5, 5), torch.empty(3, 2, 3, 3)
    with pytest.raises(RuntimeError, match="unknown pass 'sideways'"):
        torch.ops.conv2d_ext._algorithm("sideways", x, wt, (1, 1), (0, 0), (1, 1), 1)


@pytest.mark.parametrize("device", DEVICES)
def test_unbatched_input(device):
    x = torch.randn(3, 10, 11, device=device)
    w = torch.randn(4, 3, 3, 3, device=device)
    y = conv2d_ext.conv2d(x, w, padding=1)
    assert y.shape == (4, 10, 11)
    ref = reference(x.unsqueeze(0), w, None, 1, 1, 1, 1)[0]
    assert rel_err(y, ref) <= tolerance(torch.float32, precision_of(torch.float32, device), 27)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel,dilation", [((3, 3), 1), ((4, 2), 1), ((2, 5), (2, 1)), ((3, 4), (1, 3))])
def test_padding_strings(device, kernel, dilation):
    x = torch.randn(2, 3, 9, 10, device=device, dtype=torch.float64)
    w = torch.randn(5, 3, *kernel, device=device, dtype=torch.float64)
    for padding in ("same", "valid"):
        y = conv2d_ext.conv2d(x, w, None, 1, padding, dilation)
        ref = torch.nn.functional.conv2d(x.cpu(), w.cpu(), None, 1, padding, dilation)
        assert y.shape == ref.shape
        assert rel_err(y, ref) <= tolerance(torch.float64, "ieee", 3 * kernel[0] * kernel[1])


def test_torch_ops_entry_point():
    x = torch.randn(1, 2, 8, 8, dtype=torch.float64)
    w = torch.randn(3, 2, 3, 3, dtype=torch.float64)
    y = torch.ops.conv2d_ext.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1)
    assert rel_err(y, reference(x, w, None, 1, 1, 1, 1)) <= tolerance(torch.float64, "ieee", 18)


@pytest.mark.parametrize("device", DEVICES)
def test_stride_and_dilation_beyond_32_bits(device):
    """A stride of 2^40 with a single output row and a dilation of 2^40 on a
    one-tap kernel dimension cannot matter, and do not: the kernels index in
    32 bits, so such values are normalised rather than narrowed."""
    x = torch.randn(2, 3, 9, 10, device=device, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 1, device=device, dtype=torch.float64, requires_grad=True)
    stride, padding, dilation = (2**40, 3), (0, 1), (2, 2**40)
    y = conv2d_ext.conv2d(x, w, None, stride, padding, dilation)
    assert y.shape == (2, 4, 1, 4)
    gy = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, w], gy)
    refs = reference(x, w, None, stride, padding, dilation, 1, grad_out=gy)
    mags = reference(x, w, None, stride, padding, dilation, 1, grad_out=gy, absolute=True)
    for out, ref, mag, length in zip((y, *grads), refs, mags, reduction_lengths(x, w, y)):
        assert rel_err(out, ref, mag, length) <= tolerance(torch.float64, "ieee", length)
