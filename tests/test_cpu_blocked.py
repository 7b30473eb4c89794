"""The CPU's float32 kernels: the register-blocked ones (csrc/cpu/blocked.cpp:
the forward, dgrad through it at unit stride and by stride phases, wgrad,
and the depthwise forward) and the few-pixel ones (csrc/cpu/few_pixels.cpp,
all three passes), on each instruction set
this CPU has (AVX-512, AVX2, baseline; options cpu_avx512 and cpu_avx2
switch the wider ones off): against float64, shapes with partial pixel,
channel and entry blocks, strides, dilations, asymmetric and large
padding, groups, batch 1, channels_last and 16-bit inputs; results
independent of the thread count (bitwise); the plan's answer."""
import contextlib

import pytest
import torch

import conv2d_ext
from utils import option, reference, rel_err, tolerance

ops = torch.ops.conv2d_ext

# (N, C, H, W, K, (R, S), stride, padding, dilation, groups, bias)
CASES = {
    "3x3": (2, 16, 13, 17, 40, (3, 3), 1, 1, 1, 1, True),
    "stem_7x7_s2": (1, 3, 45, 38, 64, (7, 7), 2, 3, 1, 1, True),
    "5x9_dilated": (1, 8, 30, 41, 33, (5, 9), 1, (2, 4), (2, 3), 1, False),
    "1x1_wide_k": (3, 70, 9, 7, 100, (1, 1), 1, 0, 1, 1, True),
    "strided_asym": (2, 6, 23, 19, 24, (3, 5), (2, 3), (1, 2), 1, 1, True),
    "grouped": (2, 24, 11, 14, 48, (3, 3), 1, 1, 1, 2, True),
    # Each group's output channels whole channel blocks (AVX-512's 32,
    # AVX2's 16): channels_last wgrad reads grad_output as it is.
    "grouped_whole_blocks": (2, 40, 9, 13, 64, (3, 3), 1, 1, 1, 2, True),
    # 8 output channels a group: blocks of one vector of channels (NCHW with
    # AVX-512, half empty; AVX2, whole; channels_last with AVX-512 runs
    # cpu_grouped); 12 a group: channels_last wgrad's per-group widening
    # into one-vector blocks.
    "grouped_8_a_group": (2, 32, 10, 15, 32, (3, 3), 1, 1, 1, 4, True),
    "grouped_12_a_group": (2, 24, 9, 11, 24, (3, 3), 1, 1, 1, 2, True),
    "pad_past_reach": (1, 4, 6, 5, 16, (2, 2), 1, 3, 1, 1, False),
    # One output pixel a row, over more images than the few-pixel kernels take.
    "one_pixel_out": (70, 9, 5, 5, 20, (5, 5), 1, 0, 1, 1, True),
    # Strided dgrad: a 4x4 kernel at stride 3 leaves phases with one and two
    # taps; a 1x1 kernel at stride 2 leaves three of four phases unreached.
    "strided_asym_12": (2, 12, 23, 19, 24, (3, 5), (2, 3), (1, 2), 1, 1, True),
    "grouped_strided": (2, 16, 33, 31, 32, (4, 4), 3, (2, 1), 1, 2, False),
    "1x1_stride_2": (2, 24, 15, 16, 40, (1, 1), 2, 0, 1, 1, True),
}

ISAS = {"avx512": dict(cpu_avx512=True, cpu_avx2=True),
        "avx2": dict(cpu_avx512=False, cpu_avx2=True),
        "baseline": dict(cpu_avx512=False, cpu_avx2=False)}


@contextlib.contextmanager
def isa(name):
    with contextlib.ExitStack() as stack:
        for switch, value in ISAS[name].items():
            stack.enter_context(option(switch, value))
        yield


def _operands(case, seed=0, dtype=torch.float32):
    n, c, h, w, k, ks, stride, padding, dilation, groups, bias = CASES[case]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g).to(dtype)
    wt = torch.randn(k, c // groups, *ks, generator=g).to(dtype)
    b = torch.randn(k, generator=g).to(dtype) if bias else None
    return x, wt, b, dict(stride=stride, padding=padding, dilation=dilation, groups=groups)


def _args(x, w, kw):
    pair = lambda v: [v, v] if isinstance(v, int) else list(v)  # noqa: E731
    return (x, w, pair(kw["stride"]), pair(kw["padding"]), pair(kw["dilation"]), kw["groups"])


@pytest.mark.parametrize("isa_name", sorted(ISAS))
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_forward_against_float64(isa_name, case, layout):
    x, w, b, kw = _operands(case)
    if layout == "channels_last":
        x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    with isa(isa_name):
        report = ops._kernel("forward", *_args(x, w, kw), 0)
        y = conv2d_ext.conv2d(x, w, b, **kw)
    isa_here = report.split("isa=")[-1].split()[0]
    # channels_last grouped layers of a few channels a group run several
    # groups a vector (test_grouped_against_float64).
    grouped = layout == "channels_last" and _grouped_fits(x, w, kw, isa_here)
    assert report.startswith("cpu_grouped" if grouped else "cpu_blocked"), report
    # channels_last runs on the channels_last operands, any groups.
    assert ("layout=nhwc" in report) == (layout == "channels_last"), report
    if layout == "channels_last":
        assert y.is_contiguous(memory_format=torch.channels_last)
    assert isa_here in ("avx512", "avx2", "default")
    if isa_name != "avx512":
        assert isa_here != "avx512", report
    if isa_name == "baseline":
        assert isa_here == "default", report
    y64 = reference(x, w, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"])
    assert rel_err(y, y64) <= tolerance(torch.float32, "ieee", w[0].numel())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_16_bit_runs_the_blocked_kernel(dtype):
    x, w, b, kw = _operands("3x3", dtype=dtype)
    assert ops._algorithm("forward", *_args(x, w, kw)) == "cpu_blocked"
    y = conv2d_ext.conv2d(x, w, b, **kw)
    assert y.dtype == dtype
    y64 = reference(x, w, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"])
    assert rel_err(y, y64) <= tolerance(dtype, "ieee", w[0].numel())


@pytest.mark.parametrize("case", ["3x3", "stem_7x7_s2", "grouped"])
@pytest.mark.parametrize("pass_", ["forward", "backward_weight"])
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_same_bits_for_one_and_all_threads(case, pass_, layout):
    x, w, b, kw = _operands(case)
    if layout == "channels_last":
        x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)

    def run():
        wg = w.clone().requires_grad_()
        y = conv2d_ext.conv2d(x, wg, b, **kw)
        return y if pass_ == "forward" else torch.autograd.grad(y, [wg], torch.ones_like(y))[0]

    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, max(2, before)):
            torch.set_num_threads(threads)
            results.append(run())
    finally:
        torch.set_num_threads(before)
    assert torch.equal(*results)


def test_strided_depthwise_dgrad_and_float64_keep_the_direct_loop():
    """Depthwise layers at column stride 2 run their own kernels (dgrad over
    NCHW operands too); a dgrad strided in rows alone over NCHW operands
    keeps the direct loop (faster than its phases); float64 keeps the
    accurate loop."""
    x = torch.randn(2, 32, 12, 12)
    w = torch.randn(32, 1, 3, 3)
    assert ops._algorithm("forward", x, w, [1, 2], [1, 1], [1, 1], 32) == "cpu_depthwise"
    assert ops._algorithm("backward_weight", x, w, [1, 2], [1, 1], [1, 1], 32) == "cpu_depthwise"
    assert ops._algorithm("backward_input", x, w, [1, 2], [1, 1], [1, 1], 32) == "cpu_depthwise"
    assert ops._algorithm("backward_input", x, w, [2, 1], [1, 1], [1, 1], 32) == "direct"
    w2 = torch.randn(8, 32, 3, 3)
    assert ops._algorithm("forward", x.double(), w2.double(), [1, 1], [1, 1], [1, 1], 1) == "direct"


@pytest.mark.parametrize("isa_name", sorted(ISAS))
@pytest.mark.parametrize("case", ["strided_asym_12", "grouped_strided", "1x1_stride_2"])
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_strided_dgrad_by_phases_against_float64(isa_name, case, layout):
    """dgrad at stride > 1: one blocked forward per stride phase, each over
    its sub-kernel (phases no tap reaches are zeros); channels_last phases
    on the channels_last operands."""
    x, w, b, kw = _operands(case)
    if layout == "channels_last":
        x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    with isa(isa_name):
        report = ops._kernel("backward_input", *_args(x, w, kw), 0)
        xg = x.clone().requires_grad_()
        y = conv2d_ext.conv2d(xg, w, b, **kw)
        gy = torch.randn_like(y)
        (gx,) = torch.autograd.grad(y, [xg], gy)
    strides = [kw["stride"]] * 2 if isinstance(kw["stride"], int) else kw["stride"]
    assert report.startswith("cpu_blocked") and f"phases={strides[0] * strides[1]}" in report
    assert ("layout=nhwc" in report) == (layout == "channels_last"), report
    if layout == "channels_last":
        assert gx.is_contiguous(memory_format=torch.channels_last)
    _, gx64, _, _ = reference(x, w, b if b is not None else torch.zeros(w.shape[0]),
                              kw["stride"], kw["padding"], kw["dilation"], kw["groups"],
                              grad_out=gy)
    k_per_group = w.shape[0] // kw["groups"]
    assert rel_err(gx, gx64) <= tolerance(torch.float32, "ieee",
                                          k_per_group * w.shape[2] * w.shape[3])


@pytest.mark.parametrize("isa_name", sorted(ISAS))
@pytest.mark.parametrize("case", ["3x3", "5x9_dilated", "1x1_wide_k", "grouped", "one_pixel_out"])
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_unit_stride_dgrad_against_float64(isa_name, case, layout):
    """dgrad at unit stride runs the blocked forward on the transposed,
    flipped weight (on the channels_last operands)."""
    x, w, b, kw = _operands(case)
    if layout == "channels_last":
        x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    with isa(isa_name):
        report = ops._kernel("backward_input", *_args(x, w, kw), 0)
        xg = x.clone().requires_grad_()
        y = conv2d_ext.conv2d(xg, w, b, **kw)
        gy = torch.randn_like(y)
        (gx,) = torch.autograd.grad(y, [xg], gy)
    assert report.split()[0] == "cpu_blocked", report
    assert ("layout=nhwc" in report) == (layout == "channels_last"), report
    if layout == "channels_last":
        assert gx.is_contiguous(memory_format=torch.channels_last)
    _, gx64, _, _ = reference(x, w, b if b is not None else torch.zeros(w.shape[0]),
                              kw["stride"], kw["padding"], kw["dilation"], kw["groups"],
                              grad_out=gy)
    k_per_group = w.shape[0] // kw["groups"]
    assert rel_err(gx, gx64) <= tolerance(torch.float32, "ieee",
                                          k_per_group * w.shape[2] * w.shape[3])


@pytest.mark.parametrize("isa_name", sorted(ISAS))
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_wgrad_against_float64(isa_name, case, layout):
    """wgrad on the blocked kernel: output channels x (channel, tap) entries
    summed over every pixel of the batch; channels_last operands and
    grad_w ((tap, channel) entries), any groups."""
    x, w, b, kw = _operands(case)
    if layout == "channels_last":
        x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    with isa(isa_name):
        report = ops._kernel("backward_weight", *_args(x, w, kw), 0)
        wg = w.clone().requires_grad_()
        y = conv2d_ext.conv2d(x, wg, b, **kw)
        gy = torch.randn_like(y)
        (gw,) = torch.autograd.grad(y, [wg], gy)
    isa_here = report.split("isa=")[-1].split()[0]
    grouped = layout == "channels_last" and _grouped_fits(x, w, kw, isa_here, "backward_weight")
    assert report.split()[0] == ("cpu_grouped" if grouped else "cpu_blocked"), report
    assert ("layout=nhwc" in report) == (layout == "channels_last"), report
    if layout == "channels_last":
        assert gw.is_contiguous(memory_format=torch.channels_last)
    _, _, gw64 = reference(x, w, None, kw["stride"], kw["padding"], kw["dilation"],
                           kw["groups"], grad_out=gy)
    pixels = y.shape[0] * y.shape[2] * y.shape[3]
    assert rel_err(gw, gw64) <= tolerance(torch.float32, "ieee", pixels)



# (N, C, H, W, depth multiplier, (R, S), stride, padding, dilation, bias)
DEPTHWISE = {
    "3x3": (2, 16, 14, 15, 1, (3, 3), 1, 1, 1, True),
    "5x5_wide_row": (1, 8, 9, 77, 1, (5, 5), 1, 2, 1, False),
    "multiplier_2_strided_rows": (2, 6, 13, 21, 2, (3, 3), (2, 1), 1, 1, True),
    "7x7_dilated": (1, 4, 20, 18, 1, (7, 7), 1, (6, 3), (2, 1), True),
    # 40 channels: vectors of 16 or 8 channels and a tail (channels_last).
    "40_channels_strided_rows": (2, 40, 11, 9, 1, (3, 3), (2, 1), 1, 1, True),
    # Column strides 2 and 3: rows split into phase rows.
    "3x3_stride_2": (2, 12, 17, 35, 1, (3, 3), 2, 1, 1, True),
    "5x5_stride_3_dilated": (1, 8, 19, 40, 2, (5, 5), (1, 3), 2, (1, 2), False),
    # An even dilation at column stride 2: all of a row's taps in one phase,
    # more than 8 of them (two kernel rows, so an overrun would corrupt the
    # next row's taps).
    "2x11_stride_2_dilated": (2, 6, 9, 47, 1, (2, 11), (1, 2), 1, (1, 2), False),
    # Over 256 KiB of operands: channels_last wgrad sums chunks of rows.
    "3x3_two_chunks": (1, 48, 40, 37, 1, (3, 3), 1, 1, 1, False),
    # Padding of the kernel's whole reach: every run of a row at an edge.
    "3x3_pad_2": (2, 16, 6, 5, 1, (3, 3), 1, 2, 1, True),
    # Odd output rows: channels_last forwards by pairs of rows end on a
    # single row (5 and 7 columns: pairs with AVX-512, single rows else).
    "5x5_odd_rows": (1, 32, 13, 20, 1, (5, 5), 1, 2, 1, True),
    "7x7_odd_rows_batch_2": (2, 24, 11, 12, 1, (7, 7), 1, 3, 1, False),
    # One and two input columns: every run of pixels cut short and reaching
    # past both ends of the row.
    "3x3_one_column": (1, 16, 100, 1, 1, (3, 3), 1, 1, 1, True),
    "7x7_two_columns": (1, 20, 40, 2, 1, (7, 7), 1, 3, 1, False),
    # Operands past 1 MiB: channels_last forwards by single rows, wgrad
    # prefetching (each chunk's later channel passes the next chunk).
    "3x3_past_l2": (1, 32, 96, 90, 1, (3, 3), 1, 1, 1, True),
    "5x5_past_l2": (1, 48, 70, 70, 1, (5, 5), 1, 2, 1, False),
    # Stride 2 over channels_last operands: wgrad's runs at column stride 2
    # (from memory, prefetching), dgrad by column phase; 7 columns odd rows.
    "3x3_stride_2_past_l2": (1, 32, 91, 94, 1, (3, 3), 2, 1, 1, True),
    "7x7_stride_2_odd": (2, 20, 23, 25, 1, (7, 7), 2, 3, 1, False),
    "5x5_stride_2_1_dilated_rows": (1, 17, 19, 22, 1, (5, 5), (2, 2), (4, 2), (2, 1), True),
    # Column stride 3 with dilated columns; a 1x1 at stride 2 (grad_input
    # pixels no tap reaches); padding past the kernel's reach at unit stride.
    "3x3_stride_3_dilated_m1": (1, 16, 19, 40, 1, (3, 3), (1, 3), 2, (1, 2), False),
    "1x1_stride_2": (2, 16, 24, 26, 1, (1, 1), 2, 0, 1, False),
    "3x3_pad_3": (1, 16, 9, 10, 1, (3, 3), 1, 3, 1, True),
    # Column stride 2 with dilated columns (NCHW: the column-stride-2 dgrad).
    "3x3_stride_2_dilated_columns": (1, 8, 14, 23, 1, (3, 3), (1, 2), (1, 2), (1, 2), True),
}


def _depthwise(case, seed=6, layout="nchw"):
    """Operands of a DEPTHWISE case, x in the given layout."""
    n, c, h, w_, mult, ks, stride, padding, dilation, bias = DEPTHWISE[case]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w_, generator=g)
    w = torch.randn(c * mult, 1, *ks, generator=g)
    b = torch.randn(c * mult, generator=g) if bias else None
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    return x, w, b, dict(stride=stride, padding=padding, dilation=dilation, groups=c)


@pytest.mark.parametrize("isa_name", sorted(ISAS))
@pytest.mark.parametrize("case", sorted(DEPTHWISE))
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_depthwise_against_float64(isa_name, case, layout):
    """NCHW, and channels_last on its own kernel (channels in vectors, taps
    in the padding skipped) where one output channel per input channel and
    at least a vector of them (else on NCHW copies)."""
    n, c, h, w_, mult, ks, stride, padding, dilation, bias = DEPTHWISE[case]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, c, h, w_, generator=g)
    w = torch.randn(c * mult, 1, *ks, generator=g)
    b = torch.randn(c * mult, generator=g) if bias else None
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=c)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    with isa(isa_name):
        assert ops._algorithm("forward", *_args(x, w, kw)) == "cpu_depthwise"
        report = ops._kernel("forward", *_args(x, w, kw), 0)
        y = conv2d_ext.conv2d(x, w, b, **kw)
    assert ("layout=nhwc" in report) == (
        layout == "channels_last" and _depthwise_nhwc(report, c, mult)), report
    if layout == "channels_last":
        assert y.is_contiguous(memory_format=torch.channels_last)
    y64 = reference(x, w, b, stride, padding, dilation, c)
    assert rel_err(y, y64) <= tolerance(torch.float32, "ieee", w[0].numel())


# Few output pixels over the batch (<= 64): (N, C, H, W, K, (R, S), stride,
# padding, dilation, groups, bias). Reductions J = C/groups * R * S with and
# without a tail past the kernels' column chunks, K not a multiple of 4.
FEW_PIXELS = {
    "1x1_plane": (1, 256, 1, 1, 70, (1, 1), 1, 0, 1, 1, True),
    "3x3_plane_3x3": (1, 40, 3, 3, 37, (3, 3), 1, 1, 1, 1, True),
    "strided_dilated_grouped": (2, 12, 7, 6, 18, (3, 2), (2, 3), (1, 0), (2, 1), 3, True),
    "pad_past_reach": (1, 5, 2, 2, 9, (2, 2), 1, 2, 1, 1, False),
    "depthwise": (2, 8, 4, 4, 16, (3, 3), 1, 1, 1, 8, True),
    "batch_3_7x7_s2": (3, 33, 7, 7, 20, (3, 3), 2, 1, 1, 1, True),
    # 49 pixels and a short reduction: the forward with pixels in vectors.
    "pointwise_7x7": (1, 64, 7, 7, 24, (1, 1), 1, 0, 1, 1, True),
}


def _from(table, case, seed):
    """Operands of a (N, C, H, W, K, (R, S), stride, padding, dilation,
    groups, bias) table's case."""
    n, c, h, w, k, ks, stride, padding, dilation, groups, bias = table[case]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g)
    wt = torch.randn(k, c // groups, *ks, generator=g)
    b = torch.randn(k, generator=g) if bias else None
    return x, wt, b, dict(stride=stride, padding=padding, dilation=dilation, groups=groups)


def _few(case):
    return _from(FEW_PIXELS, case, 2)


def _assert_passes_against_float64(x, w, b, kw, y, gx, gw, gy):
    y64, gx64, gw64, _ = reference(x, w, b if b is not None else torch.zeros(w.shape[0]),
                                   kw["stride"], kw["padding"], kw["dilation"], kw["groups"],
                                   grad_out=gy)
    k_per_group = w.shape[0] // kw["groups"]
    assert rel_err(y, y64) <= tolerance(torch.float32, "ieee", w[0].numel())
    assert rel_err(gx, gx64) <= tolerance(torch.float32, "ieee",
                                          k_per_group * w.shape[2] * w.shape[3])
    pixels = y.shape[0] * y.shape[2] * y.shape[3]
    assert rel_err(gw, gw64) <= tolerance(torch.float32, "ieee", pixels)


def _all_passes(x, w, b, kw, gy=None):
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = conv2d_ext.conv2d(xg, wg, b, **kw)
    gy = torch.randn_like(y) if gy is None else gy
    gx, gw = torch.autograd.grad(y, [xg, wg], gy)
    return y, gx, gw, gy


@pytest.mark.parametrize("isa_name", sorted(ISAS))
@pytest.mark.parametrize("case", sorted(FEW_PIXELS))
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_few_pixels_against_float64(isa_name, case, layout):
    """The few-pixel kernels' three passes; channels_last operands run as
    they are (`layout=nhwc`, the weight and grad_weight in their own
    layout), with PyTorch's result strides."""
    x, w, b, kw = _few(case)
    if layout == "channels_last":
        x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    with isa(isa_name):
        for pass_ in ("forward", "backward_input", "backward_weight"):
            assert ops._algorithm(pass_, *_args(x, w, kw)) == "cpu_few_pixels", pass_
            report = ops._kernel(pass_, *_args(x, w, kw), 0)
            # (A 1x1 input plane is NCHW and channels_last at once.)
            if x.shape[2] * x.shape[3] > 1:
                assert ("layout=nhwc" in report) == (layout == "channels_last"), report
        y, gx, gw, gy = _all_passes(x, w, b, kw)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    yr = torch.nn.functional.conv2d(xr, wr, b, **kw)
    grads = torch.autograd.grad(yr, [xr, wr], gy)
    for got, theirs in zip((y, gx, gw), (yr, *grads)):
        assert got.stride() == theirs.stride(), (got.stride(), theirs.stride())
    _assert_passes_against_float64(x, w, b, kw, y, gx, gw, gy)


def test_few_pixels_bound():
    """64 output pixels over the batch take the few-pixel kernels, 65 the
    blocked ones."""
    w = torch.randn(32, 16, 1, 1)
    assert ops._algorithm("forward", torch.randn(4, 16, 4, 4), w, [1, 1], [0, 0], [1, 1],
                          1) == "cpu_few_pixels"
    assert ops._algorithm("forward", torch.randn(1, 16, 5, 13), w, [1, 1], [0, 0], [1, 1],
                          1) == "cpu_blocked"


VECTOR_FLOATS = {"avx512": 16, "avx2": 8, "default": 4}


def _depthwise_nhwc(report, channels, mult):
    """Whether a channels_last depthwise forward (or unit-stride dgrad) runs
    on the channels_last operands: one output channel per input channel, at
    least one vector of them on the instruction set the report names."""
    return mult == 1 and channels >= VECTOR_FLOATS[report.split("isa=")[1].split()[0]]


def _depthwise_nhwc_wgrad(report, channels, ks, stride, dilation, mult):
    """The same for wgrad, which also needs column stride 1 or 2, unit
    column dilation and 3, 5 or 7 columns of taps."""
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
    return (_depthwise_nhwc(report, channels, mult) and pair(stride)[1] in (1, 2)
            and pair(dilation)[1] == 1 and ks[1] in (3, 5, 7))


@pytest.mark.parametrize("isa_name", sorted(ISAS))
@pytest.mark.parametrize("case", sorted(DEPTHWISE))
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_depthwise_backward_against_float64(isa_name, case, layout):
    """wgrad on the narrow kernel; dgrad with one output channel per group
    as the depthwise forward on the flipped weight where it is one forward,
    at column stride 2 on its own kernel, else over NCHW operands the
    direct loop (strided depthwise dgrad by phases ran slower than it).
    channels_last: dgrad as the channels_last depthwise forward, or
    dgrad_depthwise_nhwc where strided; wgrad on its own kernel where
    _depthwise_nhwc_wgrad holds (column stride 1 or 2); else on NCHW
    copies."""
    n, c, h, w_, mult, ks, stride, padding, dilation, bias = DEPTHWISE[case]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, c, h, w_, generator=g)
    w = torch.randn(c * mult, 1, *ks, generator=g)
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=c)
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
    # dgrad is one forward (conv_params.cpp's dgrad_is_fprop): unit stride,
    # padding within the kernel's reach.
    as_fprop = all(st == 1 and pd <= dl * (k - 1)
                   for st, pd, dl, k in zip(pair(stride), pair(padding), pair(dilation), ks))
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    cl = layout == "channels_last"
    with isa(isa_name):
        assert ops._algorithm("backward_weight", *_args(x, w, kw)) == "cpu_depthwise"
        report = ops._kernel("backward_weight", *_args(x, w, kw), 0)
        assert ("layout=nhwc" in report) == (
            cl and _depthwise_nhwc_wgrad(report, c, ks, stride, dilation, mult)), report
        nhwc_dgrad = cl and _depthwise_nhwc(report, c, mult)
        # The depthwise forward as dgrad (on NCHW copies where channels_last
        # can't run), or over NCHW operands the column-stride-2 kernel; else
        # the direct loop.
        depthwise_dgrad = nhwc_dgrad or (
            mult == 1 and (as_fprop or (not cl and pair(stride)[1] == 2)))
        assert ops._algorithm("backward_input", *_args(x, w, kw)) == (
            "cpu_depthwise" if depthwise_dgrad else "direct")
        report = ops._kernel("backward_input", *_args(x, w, kw), 0)
        assert ("layout=nhwc" in report) == nhwc_dgrad, report
        y, gx, gw, gy = _all_passes(x, w, None, kw)
    if cl:
        assert gx.is_contiguous(memory_format=torch.channels_last)
    _, gx64, gw64, _ = reference(x, w, torch.zeros(w.shape[0]), stride, padding, dilation, c,
                                 grad_out=gy)
    assert rel_err(gx, gx64) <= tolerance(torch.float32, "ieee", mult * w.shape[2] * w.shape[3])
    pixels = y.shape[0] * y.shape[2] * y.shape[3]
    assert rel_err(gw, gw64) <= tolerance(torch.float32, "ieee", pixels)


@pytest.mark.parametrize("isa_name", sorted(ISAS))
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_depthwise_wgrad_row_tail_ignores_unread_infinities(isa_name, layout):
    """A row's last, partial vector (NCHW) or run of pixels (channels_last,
    40 channels: full vectors and a tail) must not multiply input pixels
    that no tap reads there by the zeros past grad_output's row: an infinite
    input pixel read only by some taps leaves the others finite, as in
    float64."""
    c = 4 if layout == "nchw" else 40
    x = torch.randn(1, c, 9, 21)
    x[:, :, :, -1] = float("inf")  # read by the last column of taps only
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    w = torch.randn(c, 1, 3, 3)
    kw = dict(stride=1, padding=0, dilation=1, groups=c)
    with isa(isa_name):
        assert ops._algorithm("backward_weight", *_args(x, w, kw)) == "cpu_depthwise"
        _, _, gw, gy = _all_passes(x, w, None, kw)
    _, _, gw64, _ = reference(x, w, torch.zeros(c), 1, 0, 1, c, grad_out=gy)
    assert torch.equal(torch.isfinite(gw), torch.isfinite(gw64))
    assert torch.isfinite(gw[:, :, :, :2]).all() and not torch.isfinite(gw[:, :, :, 2]).any()


# Few output channels per group at unit column stride: the narrow kernels
# (forward; dgrad as forwards, by phases where strided; wgrad), where the
# blocked ones' channel block would be filled to less than a quarter.
# (N, C, H, W, K, (R, S), stride, padding, dilation, groups, bias)
NARROW = {
    "rgb_stem_7x7_s2": (1, 3, 29, 26, 16, (7, 7), 2, 3, 1, 1, True),
    "grouped_4": (2, 16, 11, 13, 16, (3, 3), 1, 1, 1, 4, True),
    "grouped_dilated_asym": (1, 12, 14, 19, 6, (3, 5), (2, 1), (1, 2), (2, 1), 3, True),
    "three_outputs_wide_row": (1, 5, 6, 83, 3, (1, 3), 1, (0, 1), 1, 1, False),
}
BLOCK_CHANNELS = {"avx512": 32, "avx2": 16, "default": 8}


def _narrow(case):
    return _from(NARROW, case, 4)


@pytest.mark.parametrize("isa_name", sorted(ISAS))
@pytest.mark.parametrize("case", sorted(NARROW))
def test_narrow_kernels_against_float64(isa_name, case):
    x, w, b, kw = _narrow(case)
    groups = kw["groups"]
    with isa(isa_name):
        # A pass's kernel: narrow where its output channels per group fill
        # less than a quarter of this instruction set's channel block.
        for pass_, outputs in (("forward", w.shape[0] // groups),
                               ("backward_input", x.shape[1] // groups),
                               ("backward_weight", w.shape[0] // groups)):
            report = ops._kernel(pass_, *_args(x, w, kw), 0)
            block = BLOCK_CHANNELS[report.split("isa=")[1].split()[0]]
            expected = "cpu_blocked" if 4 * outputs >= block else "cpu_narrow"
            assert report.split()[0] == expected, (pass_, report)
        y, gx, gw, gy = _all_passes(x, w, b, kw)
    _assert_passes_against_float64(x, w, b, kw, y, gx, gw, gy)


# channels_last grouped layers of 2, 4 or 8 channels a group in and out:
# the packed-group kernels (forward; dgrad as forwards, by phases where
# strided; wgrad with 1, 3, 5 or 7 columns of taps, in as many passes as
# the registers need), several groups a vector, where a group is at most
# half a vector and the layer at least one.
# (N, C, H, W, K, (R, S), stride, padding, dilation, groups, bias)
GROUPED = {
    "q8_3x3": (2, 32, 10, 15, 32, (3, 3), 1, 1, 1, 4, True),
    # 20 channels: the last block of channels overlaps the one before it.
    "q4_overlapping_last_block": (1, 20, 9, 31, 20, (3, 3), 1, 1, 1, 5, True),
    "q2_5x5_dilated": (1, 18, 12, 13, 18, (5, 5), 1, (4, 2), (2, 1), 9, False),
    "q4_stride_2": (2, 16, 15, 14, 16, (3, 3), 2, 1, 1, 4, True),
    "q8_stride_3_2_asym": (1, 24, 17, 20, 24, (3, 4), (3, 2), (1, 2), 1, 3, True),
    # Padding past the kernel's reach: runs whose every tap is outside.
    "q4_pad_past_reach": (1, 16, 4, 5, 16, (3, 3), 1, 3, 1, 4, True),
    # Pointwise and 7-column kernels: wgrad's other row widths.
    "q8_1x1": (2, 32, 9, 10, 32, (1, 1), 1, 0, 1, 4, False),
    "q4_1x1": (1, 16, 10, 11, 16, (1, 1), 1, 0, 1, 4, True),
    "q2_1x7_column_stride_2": (1, 16, 8, 30, 16, (1, 7), (1, 2), (0, 3), 1, 8, True),
    # Dilated columns; a 1x1 at stride 2 (dgrad phases no tap reaches); wgrad
    # over several chunks of rows, the last partial.
    "q4_3x3_column_dilated": (1, 16, 9, 17, 16, (3, 3), 1, (1, 2), (1, 2), 4, True),
    "q4_1x1_stride_2": (2, 16, 12, 13, 16, (1, 1), 2, 0, 1, 4, True),
    "q4_several_chunks": (2, 32, 40, 40, 32, (3, 3), 1, 1, 1, 8, False),
}
def _grouped_fits(x, w, kw, isa_here, pass_="forward"):
    q, vl, s = w.shape[1], VECTOR_FLOATS[isa_here], w.shape[3]
    fits = (kw["groups"] > 1 and w.shape[0] // kw["groups"] == q and q in (2, 4, 8)
            and 2 * q <= vl and x.shape[1] >= vl)
    if pass_ == "backward_weight":
        fits = fits and s in (1, 3, 5, 7)
    return fits


@pytest.mark.parametrize("isa_name", sorted(ISAS))
@pytest.mark.parametrize("case", sorted(GROUPED))
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_grouped_against_float64(isa_name, case, layout):
    """cpu_grouped runs channels_last operands where a group fits half this
    instruction set's vector (wgrad: 1, 3, 5 or 7 columns of taps; the
    others, and NCHW operands, keep the blocked and narrow kernels); every
    pass against float64, results channels_last."""
    x, w, b, kw = _from(GROUPED, case, 7)
    if layout == "channels_last":
        x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    with isa(isa_name):
        reports = {p: ops._kernel(p, *_args(x, w, kw), 0)
                   for p in ("forward", "backward_input", "backward_weight")}
        isa_here = next(r.split("isa=")[1].split()[0] for r in reports.values() if "isa=" in r)
        for pass_, report in reports.items():
            grouped = layout == "channels_last" and _grouped_fits(x, w, kw, isa_here, pass_)
            assert (report.split()[0] == "cpu_grouped") == grouped, (pass_, report)
            if grouped:
                assert "layout=nhwc" in report, report
        y, gx, gw, gy = _all_passes(x, w, b, kw)
    if layout == "channels_last":
        assert y.is_contiguous(memory_format=torch.channels_last)
        assert gx.is_contiguous(memory_format=torch.channels_last)
    _assert_passes_against_float64(x, w, b, kw, y, gx, gw, gy)


@pytest.mark.parametrize("case", ["q4_stride_2", "q4_several_chunks"])
def test_grouped_same_bits_for_one_and_all_threads(case):
    x, w, b, kw = _from(GROUPED, case, 8)
    x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    assert ops._algorithm("forward", *_args(x, w, kw)) == "cpu_grouped"
    gy = torch.randn(conv2d_ext.conv2d(x, w, b, **kw).shape).to(memory_format=torch.channels_last)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, max(2, before)):
            torch.set_num_threads(threads)
            results.append(_all_passes(x, w, b, kw, gy)[:3])
    finally:
        torch.set_num_threads(before)
    for one, many in zip(*results):
        assert torch.equal(one, many)


def _few_channels_last(case):
    x, w, b, kw = _few(case)
    return x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last), b, kw


@pytest.mark.parametrize("operands", [lambda: _few("3x3_plane_3x3"),
                                      lambda: _few("strided_dilated_grouped"),
                                      lambda: _few_channels_last("strided_dilated_grouped"),
                                      lambda: _narrow("grouped_4"),
                                      lambda: _depthwise("3x3_two_chunks"),
                                      lambda: _depthwise("3x3_two_chunks", layout="channels_last"),
                                      lambda: _depthwise("40_channels_strided_rows",
                                                         layout="channels_last")],
                         ids=["few_pixels_3x3_plane", "few_pixels_strided",
                              "few_pixels_strided_channels_last", "narrow_grouped_4",
                              "depthwise_two_chunks", "depthwise_two_chunks_channels_last",
                              "depthwise_40_channels_channels_last"])
def test_few_pixels_narrow_and_depthwise_same_bits_for_one_and_all_threads(operands):
    x, w, b, kw = operands()
    gy = torch.randn(conv2d_ext.conv2d(x, w, b, **kw).shape)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, max(2, before)):
            torch.set_num_threads(threads)
            results.append(_all_passes(x, w, b, kw, gy)[:3])
    finally:
        torch.set_num_threads(before)
    for one, many in zip(*results):
        assert torch.equal(one, many)


@pytest.mark.parametrize("isa_name", sorted(ISAS))
def test_narrow_wgrad_at_column_stride_2(isa_name):
    """wgrad of a grouped layer (4 output channels a group) at stride 2: the
    narrow wgrad over phase rows, or the blocked one where this instruction
    set's channel block takes 4 channels."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 16, 13, 15, generator=g)
    w = torch.randn(16, 4, 3, 3, generator=g)
    kw = dict(stride=2, padding=1, dilation=1, groups=4)
    with isa(isa_name):
        report = ops._kernel("backward_weight", *_args(x, w, kw), 0)
        y, gx, gw, gy = _all_passes(x, w, None, kw)
    block = BLOCK_CHANNELS[report.split("isa=")[1].split()[0]]
    assert report.split()[0] == ("cpu_blocked" if 4 * 4 >= block else "cpu_narrow"), report
    _, _, gw64, _ = reference(x, w, torch.zeros(16), 2, 1, 1, 4, grad_out=gy)
    pixels = y.shape[0] * y.shape[2] * y.shape[3]
    assert rel_err(gw, gw64) <= tolerance(torch.float32, "ieee", pixels)


# The accuracy target on the CPU: each pass's error against float64
# no worse than PyTorch's own CPU convolution on the same inputs, on layers
# whose long reductions run in each CPU family (sums in short runs, each
# added to a total: one float32 chain over the reduction lost up to 4.9x
# PyTorch's accuracy). (N, C, H, W, K, (R, S), stride, padding, groups,
# channels_last) and the algorithm each pass runs (AVX-512 or AVX2).
ACCURACY = {
    "1x1_256": ((1, 256, 14, 14, 128, (1, 1), 1, 0, 1, False),
                ("cpu_blocked", "cpu_blocked", "cpu_blocked")),
    "1x1_256_cl": ((1, 256, 14, 14, 128, (1, 1), 1, 0, 1, True),
                   ("cpu_blocked", "cpu_blocked", "cpu_blocked")),
    "3x3_64": ((1, 64, 14, 14, 64, (3, 3), 1, 1, 1, False),
               ("cpu_blocked", "cpu_blocked", "cpu_blocked")),
    # 7x7 planes of 512 channels: the few-pixel kernels, wgrad over pixels.
    "few_pixels_cl": ((1, 512, 7, 7, 256, (1, 1), 1, 0, 1, True),
                      ("cpu_few_pixels", "cpu_few_pixels", "cpu_few_pixels")),
    "depthwise_5x5_cl": ((1, 256, 14, 14, 256, (5, 5), 1, 2, 256, True),
                         ("cpu_depthwise", "cpu_depthwise", "cpu_depthwise")),
    "grouped_8_cl": ((1, 256, 14, 14, 256, (3, 3), 1, 1, 32, True),
                     (None, None, "cpu_grouped")),
    "grouped_4": ((1, 128, 14, 14, 128, (3, 3), 1, 1, 32, False),
                  (None, None, "cpu_narrow")),
}


@pytest.mark.parametrize("name", ACCURACY)
def test_as_accurate_as_pytorch(name):
    """Every pass's relative error against float64 within 1.1x PyTorch's
    CPU convolution's on the same inputs (the margin: the ratio moves a few
    percent between random inputs)."""
    (n, c, h, w, k, ks, stride, pad, groups, cl), algos = ACCURACY[name]
    fmt = torch.channels_last if cl else torch.contiguous_format
    x = torch.randn(n, c, h, w).to(memory_format=fmt)
    wt = torch.randn(k, c // groups, *ks).to(memory_format=fmt)
    b = torch.randn(k)
    with torch.no_grad():
        gy = torch.randn_like(torch.nn.functional.conv2d(x, wt, b, stride, pad, 1, groups))
    geometry = [[stride] * 2, [pad] * 2, [1, 1], groups]
    if torch.backends.cpu.get_cpu_capability() in ("AVX512", "AVX2"):
        for pass_, algo in zip(("forward", "backward_input", "backward_weight"), algos):
            if algo is not None:
                assert ops._algorithm(pass_, x, wt, *geometry) == algo, pass_
    refs = reference(x, wt, b, stride, pad, 1, groups, grad_out=gy)

    def errors(conv):
        xr, wr = x.clone().requires_grad_(), wt.clone().requires_grad_()
        y = conv(xr, wr, b, stride, pad, 1, groups)
        outs = (y, *torch.autograd.grad(y, [xr, wr], gy))
        return [rel_err(o, r) for o, r in zip(outs, refs[:3])]

    ours = errors(conv2d_ext.conv2d)
    theirs = errors(torch.nn.functional.conv2d)
    for pass_, e, t in zip(("forward", "grad_input", "grad_weight"), ours, theirs):
        assert e <= 1.1 * t, f"{name} {pass_}: relative error {e:.3g} against PyTorch's {t:.3g}"
