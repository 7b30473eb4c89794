"""The channels_last engine (csrc/cuda/nhwc/): the forward, dgrad (unit
stride, and by phases in place) and wgrad of channels_last float32
operands in TF32 mode, against float64, the forward on wgmma (Hopper) and
on mma.sync; split-K and 128 x 256 tiles; TF32 rounding on wgmma; no
activation copies in a training step.
Shapes leave partial tiles in every GEMM dimension (pixels across images,
output channels, input channels short of a 32-channel K tile) and cover
each tile size, strides, dilations, padding and bias."""
import math

import pytest
import torch

import conv2d_ext
from utils import (between_tf32, cuda_kernel_names, cuda_only, is_hopper_build, option,
                   reference, rel_err, tf32_mode, tf32_round, tf32_truncate, tolerance)

CL = torch.channels_last
ops = torch.ops.conv2d_ext

# name: (N, C, H, W, K, R, S, stride, padding, dilation)
CASES = {
    "r50_3x3_7x7_plane": (3, 64, 7, 7, 72, 3, 3, 1, 1, 1),
    "r50_1x1_14": (4, 96, 14, 14, 40, 1, 1, 1, 0, 1),
    "1x1_stride2": (2, 32, 15, 13, 48, 1, 1, 2, 0, 1),
    "3x3_stride2": (2, 40, 17, 19, 64, 3, 3, 2, 1, 1),
    "c_not_multiple_of_32": (2, 12, 20, 21, 10, 3, 3, 1, 1, 1),
    "k_odd_pairs": (2, 36, 11, 9, 18, 5, 3, 1, (2, 1), 1),
    "dilated_asymmetric": (2, 16, 23, 18, 24, 3, 5, 1, (2, 4), (2, 2)),
    "7x7_stem_like": (2, 8, 30, 30, 16, 7, 7, 2, 3, 1),
    "big_128x128_tiles": (8, 64, 56, 56, 256, 1, 1, 1, 0, 1),
    "big_128x64_tiles": (8, 64, 56, 56, 64, 3, 3, 1, 1, 1),
    "split_k_1x1": (8, 64, 56, 56, 64, 1, 1, 1, 0, 1),  # wgrad: one tile, K split
    "wide_128x128": (4, 128, 28, 28, 128, 3, 3, 1, 1, 1),  # wgrad: 128-channel M and N tiles
    "wide_c_64x128": (4, 128, 28, 28, 64, 3, 3, 1, 1, 1),  # wgrad: 64 x 128 tiles
    # 128 x 128 and 128 x 64 forward tiles (wgmma on Hopper), partial in M,
    # N and K.
    "partial_128x128": (7, 40, 45, 45, 200, 3, 3, 1, 1, 1),
    "partial_128x64": (6, 36, 60, 50, 56, 3, 3, 1, 1, 1),
    # Strided dgrad by phases, in place; big_* on 128-row tiles.
    "3x3_s2_dilated": (2, 24, 19, 17, 40, 3, 3, 2, 2, 2),
    "stride_2x1": (2, 16, 14, 15, 32, 3, 3, (2, 1), 1, 1),
    "1x1_s2_pad1": (2, 32, 15, 13, 48, 1, 1, 2, 1, 1),  # a phase starts late: not the engine
    "big_1x1_s2": (16, 48, 89, 91, 64, 1, 1, 2, 0, 1),
    "big_3x3_s2": (24, 40, 57, 59, 64, 3, 3, 2, 1, 1),
    # Few 128-row tiles over long K: split-K (option nhwc_split_k).
    "deep_7x7": (4, 256, 7, 7, 192, 3, 3, 1, 1, 1),
    "deep_s2": (4, 96, 13, 13, 256, 3, 3, 2, 1, 1),
    # 128 x 256 forward tiles (option nhwc_wide_tiles), partial in M, N, K.
    "wide_partial": (6, 40, 47, 61, 320, 3, 3, 1, 1, 1),
}

# The wgmma forward's N tile for the cases with 128-row tiles on an H100.
WGMMA_FORWARD = {"big_128x128_tiles": 128, "partial_128x128": 128, "big_128x64_tiles": 64,
                 "partial_128x64": 64}

# Whether the engine runs each strided case's dgrad.
STRIDED_DGRAD = {"1x1_stride2": True, "3x3_stride2": True, "3x3_s2_dilated": True,
                 "stride_2x1": True, "1x1_s2_pad1": False, "big_1x1_s2": True,
                 "big_3x3_s2": True, "deep_s2": True}


def _operands(case, seed=0):
    n, c, h, w, k, r, s, stride, padding, dilation = CASES[case]
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, c, h, w, device="cuda", generator=g).to(memory_format=CL)
    wt = torch.randn(k, c, r, s, device="cuda", generator=g).to(memory_format=CL)
    b = torch.randn(k, device="cuda", generator=g)
    return x, wt, b, dict(stride=stride, padding=padding, dilation=dilation)


def _pair(v):
    return [v, v] if isinstance(v, int) else list(v)


def _args(x, w, kw):
    return (x, w, _pair(kw["stride"]), _pair(kw["padding"]), _pair(kw["dilation"]), 1)


@cuda_only
@pytest.mark.parametrize("wgmma", [True, False], ids=["wgmma", "mma_sync"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_and_dgrad_against_float64(case, wgmma):
    x, w, b, kw = _operands(case)
    with tf32_mode(True), option("nhwc_wgmma", wgmma):
        assert ops._algorithm("forward", *_args(x, w, kw)) == "implicit_gemm_nhwc"
        sm = torch.cuda.get_device_capability()
        report = ops._kernel("forward", *_args(x, w, kw), 10 * sm[0] + sm[1])
        assert f"wgmma={int(wgmma and is_hopper_build())}" in report, report
        if case in WGMMA_FORWARD and is_hopper_build():
            names = cuda_kernel_names(lambda: conv2d_ext.conv2d(x, w, b, **kw))
            kernel = f"fprop_nhwc_wgmma_kernel<{WGMMA_FORWARD[case]}, float, float>"
            launched = any(kernel in n for n in names)
            assert launched == wgmma, names
        # dgrad runs as a forward over grad_output (one per phase at larger
        # strides): K (its input channels) in 16-byte rows, C (its outputs)
        # in pairs.
        k, c = w.shape[0], w.shape[1]
        got = ops._algorithm("backward_input", *_args(x, w, kw))
        if kw["stride"] == 1:
            assert (got == "implicit_gemm_nhwc") == (k % 4 == 0 and c % 2 == 0), got
        elif case in STRIDED_DGRAD:
            assert (got == "implicit_gemm_nhwc") == STRIDED_DGRAD[case], got
            if STRIDED_DGRAD[case]:
                report = ops._kernel("backward_input", *_args(x, w, kw), 10 * sm[0] + sm[1])
                assert "phases=" in report, report
        xg = x.clone().requires_grad_()
        y = conv2d_ext.conv2d(xg, w, b, **kw)
        assert y.is_contiguous(memory_format=CL)
        gy = torch.randn_like(y)
        (gx,) = torch.autograd.grad(y, [xg], gy)
        assert gx.is_contiguous(memory_format=CL)
    y64, gx64, _, _ = reference(x, w, b, kw["stride"], kw["padding"], kw["dilation"], 1,
                                grad_out=gy)
    taps = w.shape[2] * w.shape[3]
    assert rel_err(y, y64) <= tolerance(torch.float32, "tf32", c * taps)
    assert rel_err(gx, gx64) <= tolerance(torch.float32, "tf32", k * taps)


@cuda_only
@pytest.mark.parametrize("case", ["r50_3x3_7x7_plane", "c_not_multiple_of_32"])
def test_bitwise_reproducible(case):
    x, w, b, kw = _operands(case)
    with tf32_mode(True):
        y1 = conv2d_ext.conv2d(x, w, b, **kw)
        y2 = conv2d_ext.conv2d(x, w, b, **kw)
    assert torch.equal(y1, y2)


@cuda_only
def test_switched_off_runs_the_nchw_kernels_on_copies():
    x, w, b, kw = _operands("r50_3x3_7x7_plane")
    with tf32_mode(True), option("nhwc_kernels", False):
        assert ops._algorithm("forward", *_args(x, w, kw)) != "implicit_gemm_nhwc"
        y = conv2d_ext.conv2d(x, w, b, **kw)
    assert y.is_contiguous(memory_format=CL)
    y64 = reference(x, w, b, kw["stride"], kw["padding"], kw["dilation"], 1)
    assert rel_err(y, y64) <= tolerance(torch.float32, "tf32", w[0].numel())


@cuda_only
def test_nchw_input_with_channels_last_weight_runs_the_engine():
    """A channels_last weight makes the result channels_last (PyTorch's
    rule), and the engine takes the input converted."""
    x, w, b, kw = _operands("k_odd_pairs")
    x = x.contiguous()
    with tf32_mode(True):
        assert ops._algorithm("forward", *_args(x, w, kw)) == "implicit_gemm_nhwc"
        y = conv2d_ext.conv2d(x, w, b, **kw)
    assert y.is_contiguous(memory_format=CL)
    y64 = reference(x, w, b, kw["stride"], kw["padding"], kw["dilation"], 1)
    assert rel_err(y, y64) <= tolerance(torch.float32, "tf32", w[0].numel())


@cuda_only
def test_ieee_mode_and_groups_stay_on_the_nchw_kernels():
    x, w, b, kw = _operands("r50_3x3_7x7_plane")
    with tf32_mode(False):
        assert ops._algorithm("forward", *_args(x, w, kw)) != "implicit_gemm_nhwc"
    xg = x[:, :64]
    wg = torch.randn(72, 32, 3, 3, device="cuda").to(memory_format=CL)
    with tf32_mode(True):
        args = (xg, wg, [1, 1], [1, 1], [1, 1], 2)
        assert ops._algorithm("forward", *args) != "implicit_gemm_nhwc"


@cuda_only
def test_hopper_keeps_32_channel_layers_on_the_flat_kernel():
    """A seed-like layer (32 -> 64 channels, a plane the flat sm_90 forward
    takes) stays on it, on NCHW copies, where a Hopper build runs."""
    x = torch.randn(2, 32, 64, 64, device="cuda").to(memory_format=CL)
    w = torch.randn(64, 32, 5, 9, device="cuda").to(memory_format=CL)
    with tf32_mode(True):
        fwd = ops._algorithm("forward", x, w, [1, 1], [2, 4], [1, 1], 1)
        dgrad = ops._algorithm("backward_input", x, w, [1, 1], [2, 4], [1, 1], 1)
        y = conv2d_ext.conv2d(x, w, padding=(2, 4))
    want = "implicit_gemm_sm90_flat" if is_hopper_build() else "implicit_gemm_nhwc"
    assert (fwd, dgrad) == (want, want)
    assert y.is_contiguous(memory_format=CL)
    y64 = reference(x, w, None, 1, (2, 4), 1, 1)
    assert rel_err(y, y64) <= tolerance(torch.float32, "tf32", w[0].numel())


@cuda_only
def test_misaligned_view_is_copied_first():
    """16-byte copies need aligned rows: a channels_last view starting one
    float in still gives the right result."""
    x, w, b, kw = _operands("c_not_multiple_of_32")
    n, c, h, wd = x.shape
    base = torch.randn(n * c * h * wd + 1, device="cuda")
    xv = base[1:].view(n, h, wd, c).permute(0, 3, 1, 2)
    xv.copy_(x)
    assert xv.is_contiguous(memory_format=CL) and xv.data_ptr() % 16 != 0
    with tf32_mode(True):
        y = conv2d_ext.conv2d(xv, w, b, **kw)
    y64 = reference(x, w, b, kw["stride"], kw["padding"], kw["dilation"], 1)
    assert rel_err(y, y64) <= tolerance(torch.float32, "tf32", w[0].numel())


# wgrad on the engine.
WGRAD_CASES = sorted(CASES)


@cuda_only
@pytest.mark.parametrize("case", WGRAD_CASES)
def test_wgrad_against_float64(case):
    """Without the Hopper kernels, so that layers of at most 32 channels
    (which on Hopper keep the sm_90 wgrad) run the engine too."""
    x, w, b, kw = _operands(case)
    k, c = w.shape[0], w.shape[1]
    with tf32_mode(True), option("hopper_kernels", False):
        got = ops._algorithm("backward_weight", *_args(x, w, kw))
        assert (got == "implicit_gemm_nhwc") == (k % 4 == 0 and c % 4 == 0), got
        wg = w.clone().requires_grad_()
        y = conv2d_ext.conv2d(x, wg, b, **kw)
        gy = torch.randn_like(y)
        (gw,) = torch.autograd.grad(y, [wg], gy)
        (gw2,) = torch.autograd.grad(conv2d_ext.conv2d(x, wg, b, **kw), [wg], gy)
    assert gw.stride() == w.stride()
    assert torch.equal(gw, gw2), "not bitwise reproducible"
    _, _, gw64, _ = reference(x, w, b, kw["stride"], kw["padding"], kw["dilation"], 1,
                              grad_out=gy)
    pixels = y.shape[0] * y.shape[2] * y.shape[3]
    assert rel_err(gw, gw64) <= tolerance(torch.float32, "tf32", pixels)


# IEEE mode's short wgrad reductions (N*P*Q below 8192) on the engine's FFMA
# wgrad (option nhwc_ieee_wgrad): 128 x 128 tiles with a K split, 128 x 64
# and 64 x 64 tiles partial in M and N, a strided 1x1 layer; sums in runs
# of 8 pixels (slices of one or two K tiles: one_tile_slices,
# partial_64x64, 1x1_s2), of 16 (slices of 5 tiles) and of a whole tile
# (long_slices: 18); more slices than one wave of blocks needs
# (slices_past_a_wave: one wave's three would each sum 33 K tiles).
# Reductions below 256 pixels stay on the direct kernel (test_kernel_report.py).
IEEE_WGRAD = {
    "r50_3x3_7x7": (8, 256, 7, 7, 256, 3, 3, 1, 1, 1),
    "partial_128x64": (3, 72, 13, 11, 136, 3, 3, 1, 1, 1),
    "partial_64x64": (4, 20, 9, 10, 44, 3, 5, 1, (1, 2), 1),
    "1x1_s2": (4, 128, 27, 27, 256, 1, 1, 2, 0, 1),
    "one_tile_slices": (2, 16, 12, 12, 32, 3, 3, 1, 1, 1),
    "long_slices": (40, 64, 14, 14, 64, 3, 3, 1, 1, 1),
    "slices_past_a_wave": (16, 256, 14, 14, 256, 3, 3, 1, 1, 1),
}


@pytest.mark.default_wgrad_routing
@cuda_only
@pytest.mark.parametrize("case", sorted(IEEE_WGRAD))
def test_ieee_short_wgrad_on_ffma(case):
    """The plan's choice with the option on and off; bitwise repeatable;
    against float64 within FP32's tolerance, and no less accurate than
    cuDNN's strict FP32 on the same inputs (the precision contract)."""
    n, c, h, w_, k, r, s, stride, padding, dilation = IEEE_WGRAD[case]
    x = torch.randn(n, c, h, w_, device="cuda").to(memory_format=CL)
    w = torch.randn(k, c, r, s, device="cuda").to(memory_format=CL)
    kw = dict(stride=stride, padding=padding, dilation=dilation)
    with tf32_mode(False):
        with option("nhwc_ieee_wgrad", False):
            assert ops._algorithm("backward_weight", *_args(x, w, kw)) == "direct"
        assert ops._algorithm("backward_weight", *_args(x, w, kw)) == "implicit_gemm_nhwc"
        with option("nhwc_ieee_wgrad", True):
            y = conv2d_ext.conv2d(x, w, None, **kw)
            gy = torch.randn_like(y)
            args = (gy, x, list(w.shape), *_args(x, w, kw)[2:])
            gw = ops.conv2d_backward_weight(*args)
            gw2 = ops.conv2d_backward_weight(*args)
        gw_cudnn = torch.nn.grad.conv2d_weight(x, w.shape, gy, stride, padding, dilation)
    assert gw.stride() == w.stride()
    assert torch.equal(gw, gw2), "not bitwise reproducible"
    gw64 = reference(x, w, None, stride, padding, dilation, 1, grad_out=gy)[2]
    pixels = y.shape[0] * y.shape[2] * y.shape[3]
    assert rel_err(gw, gw64) <= tolerance(torch.float32, "ieee", pixels)
    ours, cudnn = rel_err(gw, gw64), rel_err(gw_cudnn, gw64)
    assert ours <= cudnn, f"relative error {ours:.3g} against cuDNN's {cudnn:.3g}"


# NCHW calls on the engine through channels_last copies (option
# nhwc_copies): the strided forward (a small output plane) and dgrad (its
# phases), float32 in TF32 mode and bfloat16; IEEE mode's short wgrad (the
# FFMA kernel). Which pass goes there is the plan's; each that does must
# give the channels_last call's bits in NCHW.
COPIES = [("3x3_stride2", torch.float32, True), ("3x3_stride2", torch.bfloat16, True),
          ("1x1_stride2", torch.float32, True), ("r50_1x1_14", torch.float32, False)]


@pytest.mark.default_wgrad_routing  # IEEE mode's short wgrads as users get them
@cuda_only
@pytest.mark.parametrize("case, dtype, tf32", COPIES,
                         ids=["3x3_stride2-f32", "3x3_stride2-bf16", "1x1_stride2-f32",
                              "r50_1x1_14-ieee"])
def test_nchw_calls_run_the_engine_on_channels_last_copies(case, dtype, tf32):
    """With the option on, an NCHW call the plan sends to the engine reports
    copies=channels_last, launches the engine's kernels, returns NCHW
    results (grad_weight in the weight's format) and equals the same call on
    channels_last operands bitwise; with it off, no pass goes there."""
    x, w, b, kw = _operands(case)
    x, w, b = x.to(dtype), w.to(dtype), b.to(dtype)
    # A 1x1 weight's channels_last strides also pass as contiguous, and its
    # strides, not contiguity, decide a call's format: NCHW strides outright.
    xn, wn = (t.clone(memory_format=torch.contiguous_format) for t in (x, w))
    major, minor = torch.cuda.get_device_capability()
    passes = ("forward", "backward_input", "backward_weight")

    def run(xx, ww, gy=None):
        xg, wg, bg = (t.detach().clone().requires_grad_() for t in (xx, ww, b))
        y = conv2d_ext.conv2d(xg, wg, bg, **kw)
        gy = torch.randn_like(y) if gy is None else gy
        return (y, *torch.autograd.grad(y, [xg, wg], gy)), gy

    with tf32_mode(tf32):
        with option("nhwc_copies", False):
            reports = [ops._kernel(p, *_args(xn, wn, kw), 10 * major + minor) for p in passes]
            assert not any("copies=" in r for r in reports), reports
        with option("nhwc_copies", True):
            reports = [ops._kernel(p, *_args(xn, wn, kw), 10 * major + minor) for p in passes]
            copies = ["copies=channels_last" in r for r in reports]
            for r, c in zip(reports, copies):
                assert c == r.startswith("implicit_gemm_nhwc"), r
            if major >= 9:
                assert any(copies), reports
            names = cuda_kernel_names(lambda: run(xn, wn))
            assert any("nhwc" in n for n in names) == any(copies), names
            ours, gy = run(xn, wn)
        theirs, _ = run(x, w, gy.contiguous(memory_format=CL))
    for name, got, cl, c in zip(passes, ours, theirs, copies):
        assert got.is_contiguous(), (name, got.stride())
        if c:
            assert torch.equal(got, cl), f"{name}: not the channels_last call's result"
    _, _, gw64, _ = reference(xn, wn, b, kw["stride"], kw["padding"], kw["dilation"], 1,
                              grad_out=gy)
    pixels = gy.shape[0] * gy.shape[2] * gy.shape[3]
    assert rel_err(ours[2], gw64) <= tolerance(dtype, "tf32" if tf32 else "ieee", pixels)


@cuda_only
def test_wgrad_switched_off_runs_the_nchw_kernels_on_copies():
    x, w, b, kw = _operands("wide_128x128")
    with tf32_mode(True), option("nhwc_wgrad", False):
        assert ops._algorithm("backward_weight", *_args(x, w, kw)) != "implicit_gemm_nhwc"
        wg = w.clone().requires_grad_()
        y = conv2d_ext.conv2d(x, wg, b, **kw)
        gy = torch.randn_like(y)
        (gw,) = torch.autograd.grad(y, [wg], gy)
    assert gw.stride() == w.stride()
    _, _, gw64, _ = reference(x, w, b, kw["stride"], kw["padding"], kw["dilation"], 1,
                              grad_out=gy)
    pixels = y.shape[0] * y.shape[2] * y.shape[3]
    assert rel_err(gw, gw64) <= tolerance(torch.float32, "tf32", pixels)


@cuda_only
def test_hopper_keeps_32_channel_wgrad_on_the_sm90_kernel():
    """A seed-like layer (32 -> 64 channels, 5 x 9 taps) keeps the sm_90
    wgrad where a Hopper build runs: the engine would read its operands
    once per tap."""
    # 64 columns: narrower outputs leave the sm_90 wgrad's 64-column K tiles
    # mostly empty, and the plan does not take it there.
    x = torch.randn(2, 32, 24, 64, device="cuda").to(memory_format=CL)
    w = torch.randn(64, 32, 5, 9, device="cuda").to(memory_format=CL)
    with tf32_mode(True):
        got = ops._algorithm("backward_weight", x, w, [1, 1], [2, 4], [1, 1], 1)
        wg = w.clone().requires_grad_()
        y = conv2d_ext.conv2d(x, wg, padding=(2, 4))
        gy = torch.randn_like(y)
        (gw,) = torch.autograd.grad(y, [wg], gy)
    assert got == ("implicit_gemm_sm90" if is_hopper_build() else "implicit_gemm_nhwc")
    assert gw.stride() == w.stride()
    _, _, gw64 = reference(x, w, None, 1, (2, 4), 1, 1, grad_out=gy)
    pixels = y.shape[0] * y.shape[2] * y.shape[3]
    assert rel_err(gw, gw64) <= tolerance(torch.float32, "tf32", pixels)


@cuda_only
@pytest.mark.parametrize("case", ["r50_3x3_7x7_plane", "deep_7x7", "deep_s2"])
def test_split_k_against_float64(case):
    """The wgmma forward with K split over slices where its 128-row tiles
    are few (Hopper; option nhwc_split_k): the forward and dgrad (deep_s2:
    strided, by phases) against float64, bitwise repeatable, and on Hopper
    with the slices' sum launched."""
    x, w, b, kw = _operands(case)
    k, c = w.shape[0], w.shape[1]

    def run():
        xg = x.clone().requires_grad_()
        y = conv2d_ext.conv2d(xg, w, b, **kw)
        (gx,) = torch.autograd.grad(y, [xg], gy)
        return y, gx

    with tf32_mode(True):
        gy = torch.randn_like(conv2d_ext.conv2d(x, w, b, **kw))
        with option("nhwc_split_k", True):
            y, gx = run()
            y2, gx2 = run()
            fwd_kernels = cuda_kernel_names(lambda: conv2d_ext.conv2d(x, w, b, **kw))
            x3 = x.clone().requires_grad_()
            y3 = conv2d_ext.conv2d(x3, w, b, **kw)
            dgrad_kernels = cuda_kernel_names(lambda: torch.autograd.grad(y3, [x3], gy))
    assert torch.equal(y, y2) and torch.equal(gx, gx2), "not bitwise reproducible"
    if is_hopper_build():
        assert any("add_slices_kernel" in k for k in fwd_kernels), fwd_kernels
        assert any("add_slices_kernel" in k for k in dgrad_kernels), dgrad_kernels
    y64, gx64, _, _ = reference(x, w, b, kw["stride"], kw["padding"], kw["dilation"], 1,
                                grad_out=gy)
    taps = w.shape[2] * w.shape[3]
    assert rel_err(y, y64) <= tolerance(torch.float32, "tf32", c * taps)
    assert rel_err(gx, gx64) <= tolerance(torch.float32, "tf32", k * taps)


@cuda_only
@pytest.mark.parametrize("case", ["big_128x128_tiles", "wide_partial"])
def test_wide_tiles_against_float64(case):
    """128 x 256 forward tiles (Hopper; option nhwc_wide_tiles) against
    float64, bitwise repeatable, and on Hopper launched."""
    x, w, b, kw = _operands(case)
    with tf32_mode(True), option("nhwc_wide_tiles", True):
        y = conv2d_ext.conv2d(x, w, b, **kw)
        y2 = conv2d_ext.conv2d(x, w, b, **kw)
        kernels = cuda_kernel_names(lambda: conv2d_ext.conv2d(x, w, b, **kw))
    assert torch.equal(y, y2), "not bitwise reproducible"
    if is_hopper_build():
        assert any("fprop_nhwc_wgmma_kernel<256, float, float>" in k for k in kernels), kernels
    y64 = reference(x, w, b, kw["stride"], kw["padding"], kw["dilation"], 1)
    assert rel_err(y, y64) <= tolerance(torch.float32, "tf32", w[0].numel())


@cuda_only
def test_channels_last_training_step_copies_no_activation():
    """A channels_last training step of engine layers (3x3, 3x3 stride 2,
    1x1: forwards, dgrads unit-stride and by phases, wgrads) copies no
    activation or gradient: the only copies and flips are of weights,
    which here are all smaller than every activation."""
    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.Conv2d(128, 128, 3, 2, 1),
              torch.nn.Conv2d(128, 256, 1)]
    model = conv2d_ext.convert(torch.nn.Sequential(*layers)).cuda().to(memory_format=CL)
    x = torch.randn(8, 64, 32, 32, device="cuda").to(memory_format=CL).requires_grad_()
    gy = torch.randn(8, 256, 16, 16, device="cuda").to(memory_format=CL)
    biggest_weight = max(m.weight.numel() for m in model.modules() if hasattr(m, "weight"))
    smallest_activation = 8 * 128 * 16 * 16
    assert biggest_weight < smallest_activation

    def step():
        model(x).backward(gy)

    from torch.profiler import ProfilerActivity, profile
    with tf32_mode(True):
        step()  # first calls (plans, caches) outside the profile
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            step()
    copying = {"aten::copy_", "aten::clone", "aten::flip", "aten::_to_copy", "aten::contiguous"}
    large = []
    for e in prof.events():
        if e.name not in copying:
            continue
        numel = max((math.prod(s) for s in e.input_shapes if s), default=0)
        if numel > biggest_weight:
            large.append((e.name, e.input_shapes))
    assert not large, large
    assert x.grad.is_contiguous(memory_format=CL)


@cuda_only
@pytest.mark.parametrize("truncate", [False, True], ids=["rounded", "truncated"])
def test_wgmma_forward_rounds_tf32_operands_unless_told(truncate):
    """TF32 mode rounds operands to nearest on the wgmma forward too (the
    tensor cores would truncate them); the option nhwc_tf32_truncate leaves
    them to the tensor cores. A 1x1 layer of 16896 pixels: 128-row tiles on
    an H100, forward (128 x 64) and dgrad (128 x 64) on wgmma. The sums of
    positive products between TF32 values show the rounding's direction."""
    if not is_hopper_build():
        pytest.skip("the wgmma forward runs on Hopper builds only")
    x = between_tf32(1, 48, 132, 128).to(memory_format=CL)
    w = between_tf32(64, 48, 1, 1).to(memory_format=CL)
    gy = between_tf32(1, 64, 132, 128).to(memory_format=CL)

    def bias(outs, refs):
        return [float((o.double().cpu() - r).sum() / r.sum()) for o, r in zip(outs, refs)]

    xr = x.clone().requires_grad_()
    with tf32_mode(True), option("nhwc_tf32_truncate", truncate):
        names = cuda_kernel_names(lambda: conv2d_ext.conv2d(x, w))
        y = conv2d_ext.conv2d(xr, w)
        (gx,) = torch.autograd.grad(y, [xr], gy)
    assert any("fprop_nhwc_wgmma_kernel<64, float, float>" in n for n in names), names
    outs = (y, gx)
    rounded = bias(outs, reference(tf32_round(x), tf32_round(w), None, 1, 0, 1, 1,
                                   grad_out=tf32_round(gy))[:2])
    truncated = bias(outs, reference(tf32_truncate(x), tf32_truncate(w), None, 1, 0, 1, 1,
                                     grad_out=tf32_truncate(gy))[:2])
    for name, r, t in zip(["forward", "dgrad"], rounded, truncated):
        if truncate:
            assert abs(t) < 1e-4 and r < -2e-4, (name, r, t)
        else:
            assert abs(r) < 1e-4 and t > 8e-4, (name, r, t)


@cuda_only
@pytest.mark.parametrize("layout", ["channels_last", "nchw"])
@pytest.mark.parametrize("case", ["3x3_stride2", "stride_2x1", "big_3x3_s2", "deep_s2"])
def test_dgrad_phases_side_by_side(case, layout):
    """Option dgrad_phase_streams: a strided dgrad's phases on streams of the
    pool (the engine's in place, NCHW's dgrad_phases each copied into place;
    every case reaches two or four phases) give
    the bits of one stream, since the phases write disjoint pixels; the
    caller's stream waits for them (read at once, with unwritten pixels
    poisoned), also inside a captured CUDA graph."""
    x, w, _, kw = _operands(case)
    if layout == "nchw":
        x = x.contiguous()
        w = w.clone(memory_format=torch.contiguous_format)
    g = torch.Generator(device="cuda").manual_seed(1)
    geometry = _args(x, w, kw)[2:]
    dgrad = lambda gy: ops.conv2d_backward_input(gy, w, list(x.shape), *geometry)  # noqa: E731
    with tf32_mode(True), option("nhwc_copies", False):
        algo = ops._algorithm("backward_input", *_args(x, w, kw))
        assert algo == ("implicit_gemm_nhwc" if layout == "channels_last" else "dgrad_phases")
        y_shape = conv2d_ext.conv2d(x, w, **kw).shape
        gys = [torch.randn(y_shape, device="cuda", generator=g).contiguous(
            memory_format=CL if layout == "channels_last" else torch.contiguous_format)
            for _ in range(2)]
        with option("dgrad_phase_streams", False):
            expected = [dgrad(gy) for gy in gys]
        with option("dgrad_phase_streams", True), option("poison_outputs", True):
            assert torch.equal(dgrad(gys[0]), expected[0])
            static_gy = gys[0].clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                dgrad(static_gy)  # warm-up outside the capture
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_gx = dgrad(static_gy)
            static_gy.copy_(gys[1])
            graph.replay()
            assert torch.equal(static_gx, expected[1])
    gx64 = reference(x, w, None, kw["stride"], kw["padding"], kw["dilation"], 1, grad_out=gys[1])[1]
    taps = w.shape[2] * w.shape[3]
    assert rel_err(expected[1], gx64) <= tolerance(torch.float32, "tf32", w.shape[0] * taps)


# IEEE mode's forward and dgrad on the engine's wgmma forward in 3xTF32
# (option nhwc_ieee): 128 x 128 and 128 x 64 tiles partial in M, N and K, K
# split over slices (r50_3x3_7x7_plane, deep_7x7), a 1x1 layer, strided
# forwards and their dgrads by phases.
IEEE_ENGINE = ["r50_3x3_7x7_plane", "r50_1x1_14", "partial_128x128", "partial_128x64", "deep_7x7",
               "deep_s2", "big_3x3_s2", "3x3_stride2"]


@cuda_only
@pytest.mark.parametrize("half_parts", [False, True], ids=["tile_parts", "half_parts"])
@pytest.mark.parametrize("case", IEEE_ENGINE)
def test_ieee_forward_and_dgrad_on_tf32x3(case, half_parts):
    """The plan's choice with the option on and off and the kernel it
    reports; bitwise repeatable; against float64 within FP32's tolerance,
    and no less accurate than cuDNN's strict FP32 on the same inputs (the
    precision contract), the forward and dgrad both; partial sums of a K
    tile and of half of one (option nhwc_ieee_half_parts)."""
    if not is_hopper_build():
        pytest.skip("3xTF32 on the engine runs on Hopper's wgmma only")
    x, w, b, kw = _operands(case)
    args = _args(x, w, kw)
    sm = torch.cuda.get_device_capability()
    with tf32_mode(False):
        for name in ("forward", "backward_input"):
            with option("nhwc_ieee", False):
                assert ops._algorithm(name, *args) != "implicit_gemm_nhwc"
            with option("nhwc_ieee", True):
                assert ops._algorithm(name, *args) == "implicit_gemm_nhwc"
                report = ops._kernel(name, *args, 10 * sm[0] + sm[1])
                assert "math=tf32x3" in report and "wgmma=1" in report, report
        with option("nhwc_ieee", True), option("nhwc_ieee_half_parts", half_parts):
            y = conv2d_ext.conv2d(x, w, b, **kw)
            assert torch.equal(y, conv2d_ext.conv2d(x, w, b, **kw)), "not bitwise reproducible"
            gy = torch.randn_like(y)
            dgrad = (gy, w, list(x.shape), *args[2:])
            gx = ops.conv2d_backward_input(*dgrad)
            assert torch.equal(gx, ops.conv2d_backward_input(*dgrad)), "not bitwise reproducible"
        y_cudnn = torch.nn.functional.conv2d(x, w, b, **kw)
        gx_cudnn = torch.nn.grad.conv2d_input(x.shape, w, gy, **kw)
    y64, gx64, _, _ = reference(x, w, b, kw["stride"], kw["padding"], kw["dilation"], 1,
                                grad_out=gy)
    taps = w.shape[2] * w.shape[3]
    for ours, cudnn, ref, k in ((y, y_cudnn, y64, w.shape[1] * taps),
                                (gx, gx_cudnn, gx64, w.shape[0] * taps)):
        assert rel_err(ours, ref) <= tolerance(torch.float32, "ieee", k)
        assert rel_err(ours, ref) <= rel_err(cudnn, ref), (
            f"relative error {rel_err(ours, ref):.3g} against cuDNN's {rel_err(cudnn, ref):.3g}")


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["partial_128x128", "partial_128x64", "deep_7x7", "big_3x3_s2",
                                  "wide_partial"])
def test_pipelined_wgmma_forward_gives_the_same_bits(case, dtype):
    """Option nhwc_wgmma_pipelined: the wgmma forward keeps a K tile's
    wgmmas in flight across the barrier, which changes when they run, not
    what they add: the forward and dgrad (by phases where strided) equal
    the unpipelined kernel's bits, 128 x 128, 128 x 64 and 128 x 256 tiles
    and K slices included."""
    if not is_hopper_build():
        pytest.skip("the wgmma forward runs on Hopper only")
    x, w, b, kw = _operands(case)
    x, w, b = x.to(dtype), w.to(dtype), b.to(dtype)
    results = []
    for pipelined in (False, True):
        with tf32_mode(True), option("nhwc_wgmma_pipelined", pipelined), \
                option("nhwc_wide_tiles", case == "wide_partial"), option("poison_outputs", True):
            assert ops._algorithm("forward", *_args(x, w, kw)) == "implicit_gemm_nhwc"
            y = conv2d_ext.conv2d(x, w, b, **kw)
            gy = torch.randn(y.shape, device="cuda", generator=torch.Generator(device="cuda")
                             .manual_seed(3)).to(dtype).contiguous(memory_format=CL)
            gx = ops.conv2d_backward_input(gy, w, list(x.shape), *_args(x, w, kw)[2:])
            results.append((y, gx))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])
    y64 = reference(x, w, b, kw["stride"], kw["padding"], kw["dilation"], 1)
    taps = w.shape[2] * w.shape[3]
    assert rel_err(results[1][0], y64) <= tolerance(dtype, "tf32", w.shape[1] * taps)
