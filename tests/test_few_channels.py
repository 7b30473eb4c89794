"""Forward, dgrad and wgrad of depthwise and few-channel convolutions (at most
4 input channels per group) against float64 references."""
import pytest
import torch

import conv2d_ext
from utils import (DEVICES, cuda_only, hopper_kernels, is_hopper_build, option, pair,
                   precision_of, reduction_lengths, reference, rel_err, tf32_mode, tolerance)

ops = torch.ops.conv2d_ext

# (N, Cin, H, W, Cout, (KH, KW), stride, padding, dilation, groups, bias), as
# in test_correctness.py. Depthwise (one input channel per group, depth
# multiplier 1 or 2) on the specialised 3x3, 5x5 and 7x7 and on generic
# sizes; then few input channels per group (1 to 4): RGB stems, grouped
# layers with 1 to 70 output channels per group, depthwise with multiplier 3.
# The kernels work in tiles of 32 rows x 64 columns: some images span
# several, partial ones included; odd sizes, widths that are and are not
# multiples of 4, and asymmetric padding exercise the edges.
CASES = [
    # Depthwise.
    (2, 8, 13, 29, 8, (3, 3), 1, 1, 1, 8, True),
    (1, 6, 37, 21, 12, (3, 3), 2, 1, 1, 6, False),  # multiplier 2, stride 2
    (2, 4, 70, 135, 4, (3, 3), 1, 1, 1, 4, True),  # 3 x 3 tiles, partial ones
    (1, 5, 40, 64, 5, (5, 5), 1, (4, 2), (2, 1), 5, False),  # width 64
    (2, 3, 33, 68, 6, (5, 5), 2, (2, 1), 1, 3, True),  # multiplier 2, stride 2
    (1, 4, 35, 70, 4, (7, 7), 1, 3, 1, 4, True),
    (3, 2, 20, 31, 4, (7, 7), 2, (3, 1), 1, 2, False),  # multiplier 2, stride 2
    (2, 4, 7, 9, 8, (3, 5), (2, 1), (1, 2), 1, 4, False),  # generic size, multiplier 2
    (1, 8, 16, 20, 8, (1, 1), 1, 0, 1, 8, True),
    (2, 3, 19, 23, 3, (2, 4), 1, (0, 3), (2, 1), 3, True),
    (1, 4, 12, 40, 8, (1, 7), (1, 2), (0, 3), (1, 2), 4, False),
    (1, 5, 33, 65, 5, (3, 3), (1, 2), (3, 1), 2, 5, True),  # dilation 2
    (1, 1, 11, 14, 2, (3, 3), 1, 1, 1, 1, True),  # one input channel, groups 1
    # Few input channels per group.
    (2, 3, 30, 30, 64, (7, 7), 2, 3, 1, 1, False),  # RGB stem
    (1, 3, 37, 21, 20, (3, 5), 1, (1, 2), 1, 1, True),
    (2, 1, 13, 29, 5, (3, 3), 1, 1, 1, 1, True),
    (1, 2, 70, 135, 3, (5, 5), 2, 2, 1, 1, False),
    (1, 4, 33, 68, 16, (3, 3), (2, 1), 1, 2, 1, True),
    (2, 8, 11, 17, 6, (3, 3), 1, 1, 1, 2, True),  # 4 -> 3 per group
    (1, 6, 13, 29, 9, (3, 5), (2, 1), (1, 2), (1, 2), 3, False),  # 2 -> 3 per group
    (1, 6, 9, 70, 210, (3, 3), 1, 1, 1, 3, True),  # 70 per group: partial 64 and 16 tiles
    (1, 3, 16, 64, 70, (1, 1), 1, 0, 1, 1, True),
    (2, 4, 12, 17, 2, (5, 5), 1, 2, 1, 2, False),  # 2 -> 1 per group
    (2, 4, 15, 22, 12, (3, 3), 2, 1, 1, 4, True),  # depthwise, multiplier 3
    (2, 16, 37, 70, 16, (3, 3), 1, 1, 1, 4, True),  # 4 -> 4 per group (narrow tile)
    (1, 12, 19, 33, 12, (5, 5), 2, 2, 1, 3, False),  # 4 -> 4, stride 2
    (1, 8, 21, 40, 8, (7, 7), 1, 3, 1, 2, True),  # 4 -> 4, 7x7 (no register window)
    # More work items (tile, channel tile, image) than a wave of wide-tile
    # blocks: each block strides over several, across channel tiles (its
    # weights restaged) and images.
    (3, 6, 96, 130, 140, (3, 5), 1, (1, 2), 1, 2, True),
    # Depthwise planes of 56 and 112 rows: tall tiles (14 rows a thread). A
    # tile covering the whole plane runs one wave of blocks striding over
    # more planes than the wave holds, each item's weights and bias staged
    # with its halo; rows of 45 floats stage without the tensor-copy engine.
    (12, 40, 56, 60, 40, (5, 5), 1, 2, 1, 40, True),
    (1, 3, 112, 45, 3, (3, 3), 1, 1, 1, 3, True),
    # Strided dgrad with grad_output rows of a multiple of 4 floats, which
    # Hopper stages with the tensor-copy engine (4 channels a box): 7x7 on
    # two groups of 3 -> 5 (a group's last chunk of 1 channel, the box's
    # other 3 from the next group), depthwise with multiplier 2, and
    # dilation equal to the stride (the window's other case).
    (2, 6, 40, 64, 10, (7, 7), 2, 3, 1, 2, True),
    (1, 4, 30, 64, 8, (3, 3), 2, 1, 1, 4, False),
    (1, 3, 24, 64, 6, (3, 3), 2, 2, 2, 1, True),
    # Whole 64-channel tiles and output rows of a multiple of 4 floats: on
    # Hopper the forward stores through the tensor-copy engine, in boxes of
    # 32 columns x 2 rows clipped at the edges (a partial box, a box wholly
    # past the edge, a last stage of one row), several stages per block
    # (its boxes reused), and two groups at stride 2.
    (8, 3, 61, 72, 128, (3, 5), 1, (1, 2), 1, 1, True),
    (1, 6, 21, 47, 128, (3, 3), 2, 1, 1, 2, False),
    # The tensor-core wgrad's rows ((channel, tap) pairs) in m64 tiles, a
    # block taking up to three: 75 pairs (two tiles), and 196 (four: one
    # block of three and one of one), with a partial last stage of a row
    # (unit stride: at stride 2 the FFMA forward's wide tile of 4 channels
    # of 7x7 taps outgrows its shared memory and the forward runs direct).
    (2, 3, 29, 70, 24, (5, 5), 1, 2, 1, 1, True),
    (1, 4, 23, 45, 12, (7, 7), 1, 3, 1, 1, False),
    # The dgrad of every stride phase at once on tensor cores: a partial last
    # chunk of output channels (20 = 8 + 8 + 4), odd sizes whose phases have
    # different row and column counts, grad_output rows of 23 floats (async
    # copies); and dilation equal to the stride, where no tap reaches the
    # odd phases (their rows of weights are zero).
    (2, 3, 37, 45, 20, (5, 5), 2, 2, 1, 1, False),
    (1, 2, 30, 34, 16, (3, 3), 2, 2, 2, 1, False),
    # A strided dgrad whose two staged chunks would pass the shared-memory
    # bound (dilation 3 at stride 2: a 41-row halo), so it stages one chunk
    # at a time: rows of 32 floats (the tensor-copy engine on Hopper, async
    # copies with the Hopper code off), weights staged from the tensor (the
    # dilation does not divide the stride).
    (1, 4, 29, 75, 6, (7, 7), 2, 3, 3, 2, False),
    # Tall depthwise tiles with two columns a thread (unit stride and
    # dilation, compiled sizes): planes wider than a tile (a partial second
    # one) with odd left padding (the staged columns start at an odd lead:
    # pairs loaded from the column before), and an odd output width (the
    # last pair's second column past the edge, single stores). A generic
    # size takes tall tiles of one column a thread.
    (2, 4, 56, 100, 4, (3, 3), 1, 1, 1, 4, True),
    (1, 2, 112, 68, 2, (5, 4), 1, (2, 1), 1, 2, False),
    (1, 2, 112, 45, 2, (5, 5), 1, (2, 1), 1, 2, True),
    # The strided dgrad's two columns a thread (stride 2, unit dilation): a
    # 7x7 RGB layer with padding 2, whose column phases stage from an even
    # and from an odd lead (grad_output rows of 100 floats: the tensor-copy
    # engine, or 16-byte async copies), over two column tiles of 101-column
    # phases (the second one's last pair half past the edge) and two row
    # tiles of 35-row phases.
    (1, 3, 70, 202, 10, (7, 7), 2, 2, 1, 1, True),
]
CASE_IDS = [f"case{i}" for i in range(len(CASES))]
# A few cases in float64 too: depthwise, multiplier 2, RGB stem, 70 per group.
FLOAT64_CASES = [CASES[i] for i in (0, 1, 13, 20)]

# Larger shapes for the reproducibility test, so that the CUDA wgrad splits
# its reduction over many blocks: depthwise, multiplier 2 with stride 2, and
# an RGB stem.
REPRODUCIBLE = [
    (4, 32, 64, 64, 32, (3, 3), 1, 1, 1, 32, False),
    (4, 16, 64, 64, 32, (5, 5), 2, 2, 1, 16, False),
    (4, 3, 64, 64, 64, (7, 7), 2, 3, 1, 1, False),
]

# Strided dgrads whose phases the gather takes two columns a thread (stride
# 2, unit dilation, a compiled size, 2 to 4 input channels per group): the
# stem, 5x5 of 2 channels, 4 -> 4 channels (its 3 x 3 tap phases keep one
# column: their weights would not fit in registers), 7x7 over two groups
# and of 20 output channels, both lead parities. In TF32 mode some run on
# tensor cores instead.
PAIR_CASES = [13, 16, 25, 30, 37, 43]

PASSES = ("forward", "backward_input", "backward_weight")
FEW_CHANNEL_KERNELS = ("few_channels",)


def _geometry(case):
    _, _, _, _, _, _, stride, padding, dilation, groups, _ = case
    return [list(pair(stride)), list(pair(padding)), list(pair(dilation)), groups]


def _expected_kernel(case, pass_, precision):
    """The suite keeps IEEE-mode wgrad of short reductions on tensor cores
    (conftest.py), so wide tiles' wgrad runs the tensor-core kernel in both
    modes here; the forward does from 32 output channels per group, and
    TF32-mode dgrad where the stride phases fill half an m16 tile."""
    _, cin, _, _, cout, _, _, _, _, groups, _ = case
    if pass_ == "backward_weight" and _wide(case):
        return "few_channels_tc"
    if pass_ == "forward" and cout // groups >= 32:
        return "few_channels_tc"
    if pass_ == "backward_input" and precision == "tf32" and _dgrad_tc(case):
        return "few_channels_tc"
    return "few_channels"


def _wide(case):
    _, _, _, _, cout, _, _, _, _, groups, _ = case
    return cout // groups > 4


def _precisions(x, wt, stride, padding, dilation, groups):
    """The precision each pass is held to, for the operands the op sees. The
    few-channel FFMA kernels must meet the IEEE bound in
    either mode; every other kernel, the op's mode as usual."""
    default = precision_of(x.dtype, x.device.type)
    if x.device.type != "cuda":
        return {p: default for p in PASSES}
    geometry = (pair(stride), pair(padding), pair(dilation), groups)
    return {p: "ieee" if ops._algorithm(p, x, wt, *geometry) in FEW_CHANNEL_KERNELS else default
            for p in PASSES}


def _forward_and_grads(x, wt, b, stride, padding, dilation, groups, gy=None):
    """Output and the autograd gradients of input, weight (and bias)."""
    y = conv2d_ext.conv2d(x, wt, b, stride, padding, dilation, groups)
    gy = torch.randn_like(y) if gy is None else gy
    grads = torch.autograd.grad(y, [x, wt] + ([b] if b is not None else []), gy)
    return (y, *grads), gy


def _check(outs, x, wt, b, gy, stride, padding, dilation, groups, precisions, label):
    """Each result against F.conv2d in float64 (forward, grad_input,
    grad_weight, grad_bias; the bias gradient with wgrad's reduction)."""
    refs = reference(x, wt, b, stride, padding, dilation, groups, grad_out=gy)
    mags = reference(x, wt, b, stride, padding, dilation, groups, grad_out=gy, absolute=True)
    assert len(outs) == len(refs), f"{label}: {len(outs)} results, expected {len(refs)}"
    k_fprop, k_dgrad, k_wgrad = reduction_lengths(x, wt, outs[0])
    names = ["forward", "grad_input", "grad_weight", "grad_bias"]
    lengths = [k_fprop, k_dgrad, k_wgrad, k_wgrad]
    passes = ["forward", "backward_input", "backward_weight", "backward_weight"]
    for name, out, ref, mag, length, pass_ in zip(names, outs, refs, mags, lengths, passes):
        precision = precisions[pass_]
        err = rel_err(out, ref, mag, length)
        tol = tolerance(x.dtype, precision, length)
        assert err <= tol, f"{name}: relative error {err:.3g} > {tol:.3g} for {label} ({precision})"


def _run(case, device, dtype):
    n, cin, h, w, cout, k, stride, padding, dilation, groups, bias = case
    x = torch.randn(n, cin, h, w, device=device, dtype=dtype, requires_grad=True)
    wt = torch.randn(cout, cin // groups, *k, device=device, dtype=dtype, requires_grad=True)
    b = torch.randn(cout, device=device, dtype=dtype, requires_grad=True) if bias else None
    outs, gy = _forward_and_grads(x, wt, b, stride, padding, dilation, groups)
    precisions = _precisions(x, wt, stride, padding, dilation, groups)
    _check(outs, x, wt, b, gy, stride, padding, dilation, groups, precisions, case)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("device", DEVICES)
def test_few_channels_against_float64(case, device, precision):
    """Float32 in both modes; on CUDA the few-channel FFMA kernels are held to
    the IEEE bound in TF32 mode too."""
    _run(case, device, torch.float32)


@cuda_only
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_few_channels_without_copy_engine(case, precision):
    """On Hopper the forward (and dgrad through it) stages rows of a
    multiple of 4 floats with the tensor-copy engine; the async copies that
    other GPUs use are checked here with the Hopper code off."""
    with hopper_kernels(False):
        _run(case, "cuda", torch.float32)


@cuda_only
@pytest.mark.parametrize("case", [CASES[i] for i in PAIR_CASES], ids=[f"case{i}" for i in PAIR_CASES])
def test_strided_dgrad_one_column_a_thread(case, precision):
    """The gather's one-column path on the phases that take two columns a
    thread by default (the switch off), against float64 to the IEEE bound;
    on the stem in IEEE mode both paths give the same bits: they add the
    same products in the same order (channel, kernel column, kernel row)."""
    with option("few_channels_dgrad_pairs", False):
        _run(case, "cuda", torch.float32)
    if case != CASES[13] or precision != "ieee":
        return
    n, cin, h, w, cout, k, stride, padding, dilation, groups, _ = case
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(n, cin, h, w, device="cuda", generator=gen)
    wt = torch.randn(cout, cin // groups, *k, device="cuda", generator=gen)
    y = conv2d_ext.conv2d(x, wt, None, stride, padding, dilation, groups)
    gy = torch.randn(y.shape, device="cuda", generator=gen)
    outs = []
    for pairs in (True, False):
        with option("few_channels_dgrad_pairs", pairs):
            xg = x.clone().requires_grad_(True)
            outs.append(torch.autograd.grad(
                conv2d_ext.conv2d(xg, wt, None, stride, padding, dilation, groups), xg, gy)[0])
    assert torch.equal(outs[0], outs[1]), "two columns a thread and one differ"


def _gather_same_bits_both_ways(switch, gy, wt, x_shape, geometry, ref, k_dgrad):
    """The FFMA gather's dgrad with `switch` on and off: both against the
    float64 `ref` to the IEEE bound (FFMA in both modes), and the same bits."""
    bound = tolerance(torch.float32, "ieee", k_dgrad)
    outs = []
    with option("few_channels_dgrad_tc", False):
        for on in (True, False):
            with option(switch, on):
                gi = ops.conv2d_backward_input(gy, wt, list(x_shape), *geometry)
            err = rel_err(gi, ref, reduction_len=k_dgrad)
            assert err < bound, f"{switch}={on}: relative error {err:.3g} > {bound:.3g}"
            outs.append(gi)
    assert torch.equal(outs[0], outs[1]), f"{switch} on and off give different bits"


@cuda_only
def test_strided_dgrad_block_order(precision):
    """The gather starts its blocks heaviest (phase, tile) first, in groups
    of items (channel group, image) of at most a wave. Here 22 items of 32
    blocks (4 phases of 125 x 125 pixels, 4 x 2 tiles each), 2.7 waves of
    an H100's 132 SMs: groups of 8, 8 and 6 items, which interleave
    channel groups and images. Against float64 in both orders (the switch),
    which give the same bits: a block computes its tile the same whenever
    it starts."""
    n, cin, cout, groups, k = 11, 6, 16, 2, (7, 7)
    geometry = ([2, 2], [3, 3], [1, 1], groups)
    x = torch.randn(n, cin, 250, 250, device="cuda")
    wt = torch.randn(cout, cin // groups, *k, device="cuda")
    gy = torch.randn(n, cout, 125, 125, device="cuda")
    ref = torch.nn.grad.conv2d_input(x.shape, wt.double(), gy.double(), 2, 3, 1, groups)
    with option("few_channels_dgrad_tc", False):
        assert ops._algorithm("backward_input", x, wt, *geometry) == "few_channels"
    _gather_same_bits_both_ways("few_channels_dgrad_order", gy, wt, x.shape, geometry, ref,
                                (cout // groups) * k[0] * k[1])


@cuda_only
@pytest.mark.parametrize("shape", [(1, 3, 70, 202, 10, 7), (2, 3, 224, 224, 64, 7),
                                   (1, 4, 35, 130, 6, 3)],
                         ids=["odd_leads", "stem", "four_channels"])
def test_strided_dgrad_wide_tiles(shape, precision):
    """Phases of 65 to 112 columns whose every phase takes two columns a
    thread run 16 x 112 tiles (4 row groups of 56 pairs; warps straddle row
    groups); the switch off gives 32 x 64 tiles. At stride 2: case 43's
    101-column phases (7x7, odd and even leads, a 3-row last tile), the
    stem's 112 x 112, and 4 input channels (3x3) on 65-column phases.
    Against float64 in both tilings, which give the same bits (each sum
    takes its products in the same order)."""
    n, cin, h, w, cout, k = shape
    pad = k // 2
    x = torch.randn(n, cin, h, w, device="cuda")
    wt = torch.randn(cout, cin, k, k, device="cuda")
    geometry = ([2, 2], [pad, pad], [1, 1], 1)
    ho, wo = (h + 2 * pad - k) // 2 + 1, (w + 2 * pad - k) // 2 + 1
    gy = torch.randn(n, cout, ho, wo, device="cuda")
    ref = torch.nn.grad.conv2d_input(x.shape, wt.double(), gy.double(), 2, pad, 1, 1)
    _gather_same_bits_both_ways("few_channels_dgrad_wide", gy, wt, x.shape, geometry, ref,
                                cout * k * k)


@pytest.mark.parametrize("case", FLOAT64_CASES, ids=[f"f64case{i}" for i in range(len(FLOAT64_CASES))])
@pytest.mark.parametrize("device", DEVICES)
def test_few_channels_float64(case, device):
    _run(case, device, torch.float64)


@cuda_only
def test_few_channels_cases_reach_their_kernels(precision):
    """The cases test what they claim: in float32, every pass of each runs
    the few-channel kernels (at most 4 input channels per group; narrow
    tiles for at most 4 output channels per group, depthwise layers among
    them), in both precision modes; wgrad with more than 4 output channels
    per group and the forward with at least 32, the tensor-core ones."""
    for case in CASES + REPRODUCIBLE:
        n, cin, h, w, cout, k, _, _, _, groups, _ = case
        x = torch.empty(n, cin, h, w, device="cuda")
        wt = torch.empty(cout, cin // groups, *k, device="cuda")
        for pass_ in PASSES:
            expected = _expected_kernel(case, pass_, precision)
            algo = ops._algorithm(pass_, x, wt, *_geometry(case))
            assert algo == expected, f"{case} {pass_}: {algo}, expected {expected} ({precision})"


def _short(case):
    """N*Ho*Wo below the plan's 8192: IEEE-mode wgrad keeps it on FFMA."""
    n, _, h, w, _, (kh, kw), stride, padding, dilation, _, _ = case
    (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(padding), pair(dilation)
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return n * ho * wo < 8192


WIDE_CASES = [c for c in CASES if _wide(c) and _short(c)]


@cuda_only
@pytest.mark.default_wgrad_routing
@pytest.mark.parametrize("case", WIDE_CASES, ids=[f"wide{i}" for i in range(len(WIDE_CASES))])
def test_wide_wgrad_of_short_ieee_reductions_on_ffma(case):
    """Outside the suite's switch, IEEE-mode wgrad of short reductions
    (N*Ho*Wo below 8192) of wide tiles runs the FFMA kernel, more accurate
    there than 3xTF32; TF32 mode keeps the tensor cores."""
    n, cin, h, w, cout, k, _, _, _, groups, _ = case
    x = torch.empty(n, cin, h, w, device="cuda")
    wt = torch.empty(cout, cin // groups, *k, device="cuda")
    with tf32_mode(True):
        assert ops._algorithm("backward_weight", x, wt, *_geometry(case)) == "few_channels_tc"
    with tf32_mode(False):
        assert ops._algorithm("backward_weight", x, wt, *_geometry(case)) == "few_channels"
        _run(case, "cuda", torch.float32)


TC_WGRAD = [i for i, c in enumerate(CASES) if _wide(c)]


@cuda_only
@pytest.mark.parametrize("stage", ["wgmma", "mma_sync"])
@pytest.mark.parametrize("case", [CASES[i] for i in TC_WGRAD], ids=[f"case{i}" for i in TC_WGRAD])
def test_wgrad_3xtf32_stages_on_hopper(case, stage):
    """The tensor-core wgrad of more than 4 output channels per group in IEEE
    mode (3xTF32) on Hopper, with each of its stages: wgmma (the default:
    one to three m64 tiles of rows a block) and mma.sync (as other GPUs run
    it), against float64 to the IEEE bound. TF32 mode runs mma.sync."""
    if not is_hopper_build():
        pytest.skip("the wgmma stage runs on Hopper builds only")
    with tf32_mode(False), option("few_channels_wgrad_sm90", stage == "wgmma"):
        _run(case, "cuda", torch.float32)


@cuda_only
def test_wgrad_wgmma_stage_bitwise_reproducible():
    """The wgmma stage's sums meet in a fixed order: an RGB stem's wgrad in
    IEEE mode, split over many blocks, is the same bits from call to call,
    and not the mma.sync stage's bits (another order of the same sums): the
    switch took effect."""
    if not is_hopper_build():
        pytest.skip("the wgmma stage runs on Hopper builds only")
    # Whole 64-pixel stages: where a stage has 32 pixels (REPRODUCIBLE's
    # stem), the steps whose order differs add zeros.
    case = (2, 3, 256, 256, 64, (7, 7), 2, 3, 1, 1, False)
    n, cin, h, w, cout, k, _, _, _, groups, _ = case
    geometry = _geometry(case)
    x = torch.randn(n, cin, h, w, device="cuda")
    wt = torch.randn(cout, cin // groups, *k, device="cuda")
    with tf32_mode(False):
        gy = torch.randn_like(ops.conv2d(x, wt, None, *geometry))
        with option("few_channels_wgrad_sm90", True):
            first = ops.conv2d_backward_weight(gy, x, list(wt.shape), *geometry)
            again = ops.conv2d_backward_weight(gy, x, list(wt.shape), *geometry)
        with option("few_channels_wgrad_sm90", False):
            mma_sync = ops.conv2d_backward_weight(gy, x, list(wt.shape), *geometry)
    assert torch.isfinite(first).all(), "non-finite grad_weight"
    assert torch.equal(first, again), (f"grad_weight differs between calls, max difference "
                                       f"{(first - again).abs().max().item():.3g}")
    assert not torch.equal(first, mma_sync), "the same bits as the mma.sync stage"


def _dgrad_tc(case):
    """The shapes dgrad_tc_fits (few_channels/config.h) takes: stride phases times
    input channels per group fill 8 to 16 rows, 8 or more output channels
    per group."""
    _, cin, _, _, cout, _, stride, _, _, groups, _ = case
    sh, sw = pair(stride)
    return 8 <= sh * sw * (cin // groups) <= 16 and cout // groups >= 8


TC_DGRAD = [i for i, c in enumerate(CASES) if _dgrad_tc(c)]


def _dgrad_on_tensor_cores(case, x, wt):
    """Under the caller's mode and switches: the dgrad runs the tensor-core
    kernel, matches float64 (the mode's bound) and gives the same bits from
    call to call."""
    geometry = _geometry(case)
    algo = ops._algorithm("backward_input", x, wt, *geometry)
    assert algo == "few_channels_tc", f"{case}: {algo}"
    _run(case, "cuda", torch.float32)
    gy = torch.randn_like(ops.conv2d(x, wt, None, *geometry))
    first = ops.conv2d_backward_input(gy, wt, list(x.shape), *geometry)
    again = ops.conv2d_backward_input(gy, wt, list(x.shape), *geometry)
    assert torch.equal(first, again), f"{case}: grad_input differs between calls"


@cuda_only
@pytest.mark.parametrize("copy_engine", [True, False], ids=["hopper", "async_copies"])
@pytest.mark.parametrize("case", [CASES[i] for i in TC_DGRAD], ids=[f"case{i}" for i in TC_DGRAD])
def test_tf32_dgrad_on_tensor_cores(case, copy_engine):
    """TF32-mode dgrad of every stride phase at once on tensor cores (the
    default where the phases fill half an m16 tile), against float64 to the
    TF32 bound, staged by the tensor-copy engine on Hopper where rows allow
    and by async copies with the Hopper code off; the same bits from call
    to call. With the switch off, and in IEEE mode, the FFMA gather runs."""
    n, cin, h, w, cout, k, _, _, _, groups, _ = case
    geometry = _geometry(case)
    x = torch.randn(n, cin, h, w, device="cuda")
    wt = torch.randn(cout, cin // groups, *k, device="cuda")
    with tf32_mode(False):
        assert ops._algorithm("backward_input", x, wt, *geometry) == "few_channels"
    with tf32_mode(True), option("few_channels_dgrad_tc", False):
        assert ops._algorithm("backward_input", x, wt, *geometry) == "few_channels"
    with tf32_mode(True), option("few_channels_dgrad_tc", True), hopper_kernels(copy_engine):
        _dgrad_on_tensor_cores(case, x, wt)


@cuda_only
@pytest.mark.parametrize("case", REPRODUCIBLE, ids=["depthwise", "multiplier2", "rgb"])
def test_few_channels_bitwise_reproducible(case, precision):
    n, cin, h, w, cout, k, _, _, _, groups, _ = case
    geometry = _geometry(case)
    x = torch.randn(n, cin, h, w, device="cuda")
    wt = torch.randn(cout, cin // groups, *k, device="cuda")
    gy = torch.randn_like(ops.conv2d(x, wt, None, *geometry))

    def run_all():
        return (
            ops.conv2d(x, wt, None, *geometry),
            ops.conv2d_backward_input(gy, wt, list(x.shape), *geometry),
            ops.conv2d_backward_weight(gy, x, list(wt.shape), *geometry),
        )

    first = run_all()
    for _ in range(2):
        for name, a, b in zip(PASSES, first, run_all()):
            assert torch.isfinite(a).all(), f"{case} {name}: non-finite result ({precision})"
            assert torch.equal(a, b), (f"{case} {name}: results differ between calls, max difference "
                                       f"{(a - b).abs().max().item():.3g} ({precision})")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel,dilation", [((4, 4), 1), ((2, 6), (2, 1)), ((3, 4), (1, 3))])
def test_depthwise_same_padding_even_kernel(device, kernel, dilation, precision):
    """padding='same' with an even effective kernel pads one more row or
    column at the bottom or right: asymmetric, as the op sees it."""
    groups = 6
    x = torch.randn(2, groups, 13, 18, device=device, requires_grad=True)
    wt = torch.randn(groups, 1, *kernel, device=device, requires_grad=True)
    b = torch.randn(groups, device=device, requires_grad=True)
    outs, gy = _forward_and_grads(x, wt, b, 1, "same", dilation, groups)
    label = f"'same', kernel {kernel}, dilation {dilation}"
    assert outs[0].shape == x.shape, f"{label}: output shape {tuple(outs[0].shape)}, not {tuple(x.shape)}"
    # The operands the op is called with: the input padded by the odd
    # remainder, then the symmetric part as its padding.
    total = [d * (kk - 1) for d, kk in zip(pair(dilation), kernel)]
    padded = torch.empty(2, groups, 13 + total[0] % 2, 18 + total[1] % 2, device=device)
    precisions = _precisions(padded, wt, 1, [t // 2 for t in total], dilation, groups)
    _check(outs, x, wt, b, gy, 1, "same", dilation, groups, precisions, label)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["channels_last", "sliced"])
def test_depthwise_noncontiguous(device, layout, precision):
    """Depthwise with multiplier 2 on channels_last and strided views: the
    same results as on contiguous tensors, and correct."""
    n, c, h, w, k = 2, 8, 21, 70, (5, 5)
    geometry = (1, 2, 1, c)
    x = torch.randn(n, c, h, w, device=device)
    wt = torch.randn(2 * c, 1, *k, device=device)
    b = torch.randn(2 * c, device=device)
    gy = torch.randn(n, 2 * c, h, w, device=device)
    if layout == "channels_last":
        xs = x.to(memory_format=torch.channels_last)
        ws = wt.to(memory_format=torch.channels_last)
        gys = gy.to(memory_format=torch.channels_last)
    else:
        xs = torch.randn(n, 2 * c, h, 2 * w, device=device)[:, 1::2, :, ::2]
        xs.copy_(x)
        ws = torch.randn(2 * c, 1, k[0], 2 * k[1], device=device)[..., ::2]
        ws.copy_(wt)
        gys = torch.randn(n, 2 * c, h, 2 * w, device=device)[..., 1::2]
        gys.copy_(gy)
    assert not xs.is_contiguous() and not gys.is_contiguous(), layout
    leaves = [t.clone().requires_grad_() for t in (x, wt, b)]
    want, _ = _forward_and_grads(*leaves, *geometry, gy=gy)
    got_leaves = [xs.requires_grad_(), ws.requires_grad_(), b.clone().requires_grad_()]
    got, _ = _forward_and_grads(*got_leaves, *geometry, gy=gys)
    # The op hands contiguous operands to the same kernels: identical
    # output, input and weight gradients (the bias gradient is PyTorch's
    # own sum, whose order follows the layout).
    for name, a, e in zip(["forward", "grad_input", "grad_weight"], got, want):
        assert torch.equal(a, e), (f"{layout} {name}: differs from contiguous by "
                                   f"{(a - e).abs().max().item():.3g}")
    precisions = _precisions(x, wt, *geometry)
    _check(got, x, wt, b, gy, *geometry, precisions, f"depthwise {layout}")


@cuda_only
def test_stride_nine(precision):
    """Stride 9 (81 phases, most reached by no tap): the dgrad stages its
    weights from the weight tensor, not prearranged per phase. The forward's
    and wgrad's halos (282 x 570 floats) are too large for these kernels,
    which the plan must see (an overflow once let the wgrad through)."""
    case = (1, 2, 40, 64, 2, (3, 3), 9, 1, 1, 2, False)
    x = torch.randn(1, 2, 40, 64, device="cuda")
    wt = torch.randn(2, 1, 3, 3, device="cuda")
    geometry = _geometry(case)
    assert ops._algorithm("backward_input", x, wt, *geometry) == "few_channels"
    assert ops._algorithm("backward_weight", x, wt, *geometry) == "direct"
    _run(case, "cuda", torch.float32)


@cuda_only
def test_more_groups_than_grid_blocks(precision):
    """The grid has at most 65535 blocks in y, so with more groups some
    blocks (and the strided dgrad's phase-weight arrangement) loop over
    several: depthwise, stride 2, every pass."""
    groups = 65535 + 3
    _run((1, groups, 6, 8, groups, (3, 3), 2, 1, 1, groups, False), "cuda", torch.float32)


@cuda_only
def test_dgrad_never_reads_the_next_groups_channels(precision):
    """The strided dgrad stages grad_output 4 channels at a time; past a
    group's last channel the staged box holds the next group's. Inf there
    would turn any zero-weight product into NaN in this group's gradient."""
    n, cin, cout, groups = 2, 6, 10, 2
    x = torch.randn(n, cin, 40, 64, device="cuda")
    wt = torch.randn(cout, cin // groups, 7, 7, device="cuda")
    gy = torch.randn(n, cout, 20, 32, device="cuda")
    gy[:, cout // groups:] = float("inf")  # group 1
    gi = ops.conv2d_backward_input(gy, wt, list(x.shape), [2, 2], [3, 3], [1, 1], groups)
    ref = torch.nn.grad.conv2d_input((n, cin // groups, 40, 64), wt[: cout // groups].double(),
                                     gy[:, : cout // groups].double(), 2, 3, 1, 1)
    first = gi[:, : cin // groups]
    assert torch.isfinite(first).all()
    k_dgrad = (cout // groups) * 7 * 7  # at most: the phases see a quarter of the taps
    err = rel_err(first, ref, reduction_len=k_dgrad)
    bound = tolerance(torch.float32, "ieee", k_dgrad)  # FFMA in both modes
    assert err < bound, f"group 0's grad_input relative error {err:.3g} > {bound:.3g}"
