"""float16 and bfloat16: all three passes against float64 on the same
16-bit values, results in the input's dtype and PyTorch's memory formats,
no less accurate than PyTorch's own convolution in that dtype; the
channels_last engine reading 16-bit operands natively (Hopper), and on
float32 copies with its switch off; mixed dtypes refused with PyTorch's
message; float16 overflow; autocast (CPU and CUDA) against aten's autocast
on the same model, eager and compiled; GradScaler."""
import pytest
import torch
import torch.nn.functional as F

import conv2d_ext
from utils import (DEVICES, cuda_kernel_names, cuda_only, is_hopper_build, option,
                   reduction_lengths, reference, rel_err, tf32_mode, tolerance)

CL = torch.channels_last
DTYPES = [torch.bfloat16, torch.float16]

# (N, C, H, W, K, (R, S), stride, padding, dilation, groups): a plain 3x3,
# a seed-like 5x9 over 32 channels (tensor-core kernels on a GPU), an RGB
# stem (few channels), depthwise, grouped with stride and dilation, 1x1.
CASES = {
    "3x3": (2, 16, 12, 13, 24, (3, 3), 1, 1, 1, 1),
    "seed_5x9": (1, 32, 16, 36, 64, (5, 9), 1, (2, 4), 1, 1),
    "rgb_stem": (2, 3, 20, 22, 16, (7, 7), 2, 3, 1, 1),
    "depthwise": (2, 16, 14, 15, 16, (3, 3), 1, 1, 1, 16),
    "grouped_strided": (1, 12, 17, 13, 18, (3, 3), (2, 1), (1, 2), (2, 1), 3),
    "1x1": (3, 40, 9, 7, 32, (1, 1), 1, 0, 1, 1),
}

# channels_last layers whose passes the engine reads natively in 16 bits
# (forward and dgrad on Hopper's wgmma, wgrad on mma.sync where the float32
# engine's wgrad runs): 128-row tiles partial across images, N tiles and
# 64-channel K tiles (C short of one, and two tiles and a tail); K split
# over slices (few tiles, long K), with its dgrad's 64 x 64 problem on
# 128-row tiles; strided, dilated dgrad by phases, whose forward over 32
# input channels (half a K tile) runs on float32 copies; a layer of few
# channels that stays on the copies.
NATIVE = {
    "partial_tiles": (3, 40, 11, 13, 40, (3, 3), 1, 1, 1, 1),
    "deep_1x1": (2, 136, 7, 7, 72, (1, 1), 1, 0, 1, 1),
    "split_k": (1, 512, 7, 7, 64, (3, 3), 1, 1, 1, 1),
    "strided_dilated": (2, 32, 19, 17, 48, (3, 3), 2, 2, 2, 1),
    "few_channels": (2, 16, 10, 12, 24, (3, 3), 1, 1, 1, 1),
    # The wgrad's 128 x 128 and 128 x 64 tiles (at least 128 output
    # channels; input channels from 128, and fewer).
    "wgrad_128x128": (2, 160, 14, 14, 160, (3, 3), 1, 1, 1, 1),
    "wgrad_128x64": (2, 64, 12, 12, 136, (1, 1), 1, 0, 1, 1),
}
# The forward and dgrad that run natively (else both).
NATIVE_PASSES = {"strided_dilated": ["backward_input"], "few_channels": []}


def _operands(case, dtype, device, layout, seed=0):
    n, c, h, w, k, ks, stride, padding, dilation, groups = {**CASES, **NATIVE}[case]
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(n, c, h, w, device=device, generator=g).to(dtype)
    wt = (torch.randn(k, c // groups, *ks, device=device, generator=g)
          / (c // groups * ks[0] * ks[1]) ** 0.5).to(dtype)
    b = torch.randn(k, device=device, generator=g).to(dtype)
    if layout == "channels_last":
        x, wt = x.to(memory_format=CL), wt.to(memory_format=CL)
    return x, wt, b, dict(stride=stride, padding=padding, dilation=dilation, groups=groups)


def _passes(conv, x, w, b, kw, gy=None):
    xg, wg, bg = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y = conv(xg, wg, bg, **kw)
    gy = torch.randn_like(y) if gy is None else gy
    return (y, *torch.autograd.grad(y, [xg, wg, bg], gy)), gy


def _torch_conv_in(dtype, device):
    """Whether PyTorch's own convolution runs in `dtype` on `device`."""
    try:
        F.conv2d(torch.ones(1, 1, 3, 3, dtype=dtype, device=device),
                 torch.ones(1, 1, 1, 1, dtype=dtype, device=device))
        return True
    except RuntimeError:
        return False


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("tf32", [True, False], ids=["tf32_flag", "ieee_flag"])
def test_passes_against_float64(device, dtype, layout, case, tf32):
    x, w, b, kw = _operands(case, dtype, device, layout)
    with tf32_mode(tf32):
        ours, gy = _passes(conv2d_ext.conv2d, x, w, b, kw)
        theirs = None
        if _torch_conv_in(dtype, device):
            theirs, _ = _passes(F.conv2d, x, w, b, kw, gy)
    _assert_against_float64(x, w, b, kw, gy, ours, theirs)


def _assert_against_float64(x, w, b, kw, gy, ours, theirs):
    """ours (and PyTorch's results, theirs, unless None): output and the
    three gradients in x's dtype, against float64 on the same values."""
    dtype = x.dtype
    refs = reference(x, w, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"],
                     grad_out=gy)
    mags = reference(x, w, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"],
                     grad_out=gy, absolute=True)
    fwd, dgrad, wgrad = reduction_lengths(x, w, ours[0])
    lengths = [fwd, dgrad, wgrad, wgrad]  # the bias gradient sums as wgrad does
    for i, name in enumerate(["output", "grad_input", "grad_weight", "grad_bias"]):
        got = ours[i]
        assert got.dtype == dtype, name
        err = rel_err(got, refs[i], mags[i], lengths[i])
        assert err <= tolerance(dtype, "tf32", lengths[i]), (name, err)
        if theirs is not None:
            assert got.stride() == theirs[i].stride(), (name, got.stride(), theirs[i].stride())
            torch_err = rel_err(theirs[i], refs[i], mags[i], lengths[i])
            # Both round a float32 sum once; a margin for the last bit.
            assert err <= 1.1 * torch_err + 2.0**-20, (name, err, torch_err)


def _pair(v):
    return [v, v] if isinstance(v, int) else list(v)


@cuda_only
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_16_bit_wide_tiles_against_float64(dtype):
    """The 16-bit wgmma forward on 128 x 256 tiles (Hopper; option
    nhwc_wide_tiles): launched, bitwise repeatable, against float64 and no
    less accurate than PyTorch's convolution."""
    g = torch.Generator(device="cuda").manual_seed(3)
    c, k = 64, 256  # 144 tiles of 128 x 256: enough for every SM
    x = torch.randn(2, c, 96, 96, device="cuda", generator=g).to(dtype).to(memory_format=CL)
    w = (torch.randn(k, c, 3, 3, device="cuda", generator=g) / (9 * c) ** 0.5).to(dtype)
    w = w.to(memory_format=CL)
    b = torch.randn(k, device="cuda", generator=g).to(dtype)
    with option("nhwc_wide_tiles", True):
        y = conv2d_ext.conv2d(x, w, b, padding=1)
        again = conv2d_ext.conv2d(x, w, b, padding=1)
        names = cuda_kernel_names(lambda: conv2d_ext.conv2d(x, w, b, padding=1))
    assert torch.equal(y, again), "not bitwise repeatable"
    if is_hopper_build():
        ctype = "__nv_bfloat16" if dtype == torch.bfloat16 else "__half"
        assert any(f"wgmma_kernel<256, {ctype}" in n for n in names), names
    ref = reference(x, w, b, 1, 1, 1, 1)
    mag = reference(x, w, b, 1, 1, 1, 1, absolute=True)
    err = rel_err(y, ref, mag, 9 * c)
    torch_err = rel_err(F.conv2d(x, w, b, padding=1), ref, mag, 9 * c)
    assert err <= tolerance(dtype, "tf32", 9 * c), err
    assert err <= 1.1 * torch_err + 2.0**-20, (err, torch_err)


@cuda_only
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", sorted(NATIVE))
@pytest.mark.parametrize("native", [True, False], ids=["native", "switch_off"])
def test_engine_reads_16_bit_operands_natively(dtype, case, native):
    """channels_last 16-bit operands on the engine: the forward and dgrad
    (Hopper) read them as they are (the plan's report, the 16-bit kernel
    launched) over more than 32 input channels (of the pass's GEMM), wgrad
    where the float32 engine's wgrad runs, in either precision flag's mode;
    with the switch nhwc_16bit off, float32 copies. Both bitwise
    repeatable, against float64 and no less accurate than PyTorch's
    convolution."""
    x, w, b, kw = _operands(case, dtype, "cuda", "channels_last")
    args = (x, w, _pair(kw["stride"]), _pair(kw["padding"]), _pair(kw["dilation"]), 1)
    major, minor = torch.cuda.get_device_capability()
    # The forward and dgrad need Hopper's wgmma; the wgrad (mma.sync) runs
    # natively wherever the float32 engine's wgrad runs.
    with tf32_mode(True):
        float_args = (x.float(), w.float(), *args[2:])
        float_wgrad = torch.ops.conv2d_ext._algorithm("backward_weight", *float_args)
    native_passes = (NATIVE_PASSES.get(case, ["forward", "backward_input"])
                     if is_hopper_build() else [])
    if float_wgrad == "implicit_gemm_nhwc":
        native_passes = native_passes + ["backward_weight"]
    expect_native = native
    ctype = "__nv_bfloat16" if dtype == torch.bfloat16 else "__half"
    for tf32 in (True, False):
        with tf32_mode(tf32), option("nhwc_16bit", native):
            for which in ("forward", "backward_input", "backward_weight"):
                report = torch.ops.conv2d_ext._kernel(which, *args, 10 * major + minor)
                runs_native = expect_native and which in native_passes
                assert ("operands=float32" not in report) == runs_native, (which, report)
                if runs_native:
                    assert report.startswith("implicit_gemm_nhwc"), report
                    assert f"math={'bf16' if dtype == torch.bfloat16 else 'fp16'}" in report
            names = cuda_kernel_names(lambda: conv2d_ext.conv2d(x, w, b, **kw))
            assert any("wgmma_kernel<" in n and ctype in n for n in names) == \
                (expect_native and "forward" in native_passes), names
            wg = w.detach().requires_grad_()
            y = conv2d_ext.conv2d(x, wg, b, **kw)
            names = cuda_kernel_names(lambda: torch.autograd.grad(y, [wg], torch.ones_like(y)))
            assert any("wgrad_nhwc_kernel<" in n and ctype in n for n in names) == \
                (expect_native and "backward_weight" in native_passes), names
            ours, gy = _passes(conv2d_ext.conv2d, x, w, b, kw)
            again, _ = _passes(conv2d_ext.conv2d, x, w, b, kw, gy)
            theirs, _ = _passes(F.conv2d, x, w, b, kw, gy)
        for name, a, b2 in zip(["output", "grad_input", "grad_weight", "grad_bias"], ours, again):
            assert torch.equal(a, b2), f"{name} not bitwise repeatable"
        _assert_against_float64(x, w, b, kw, gy, ours, theirs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.float32, None),
                                    (torch.float16, torch.bfloat16, None),
                                    (torch.bfloat16, torch.bfloat16, torch.float16)],
                         ids=["bf16_f32", "f16_bf16", "bias_f16"])
def test_mixed_dtypes_are_refused(device, dtypes):
    xd, wd, bd = dtypes
    x = torch.randn(1, 3, 8, 8, device=device, dtype=xd)
    w = torch.randn(2, 3, 3, 3, device=device, dtype=wd)
    b = torch.randn(2, device=device, dtype=bd) if bd else None
    second = "bias" if bd else "weight"
    name = {torch.bfloat16: "BFloat16", torch.float16: "Half", torch.float32: "Float"}
    message = (f"Input type ({name[xd]}) and {second} type ({name[bd or wd]}) "
               "should be the same")
    with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        conv2d_ext.conv2d(x, w, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_float16_overflow_gives_inf_where_the_exact_sum_overflows(device, layout):
    """Sums that leave float16's range become inf, as the rounding of the
    exact result does; the rest stay finite and right (channels_last: the
    engine's native forward on Hopper)."""
    x = torch.ones(1, 40, 6, 6, device=device, dtype=torch.float16)
    x[..., :3, :] = 30000.0  # top rows: 40 channels x up to 9 taps x 30000 > 65504
    w = torch.ones(8, 40, 3, 3, device=device, dtype=torch.float16)
    if layout == "channels_last":
        x, w = x.to(memory_format=CL), w.to(memory_format=CL)
        if device == "cuda" and is_hopper_build():
            major, minor = torch.cuda.get_device_capability()
            report = torch.ops.conv2d_ext._kernel("forward", x, w, [1, 1], [1, 1], [1, 1], 1,
                                                  10 * major + minor)
            assert "math=fp16" in report, report
    y = conv2d_ext.conv2d(x, w, padding=1)
    exact = F.conv2d(x.double().cpu(), w.double().cpu(), padding=1).to(torch.float16)
    # The bottom rows read only ones: finite sums of up to 360.
    assert torch.isinf(exact).any() and (exact[torch.isfinite(exact)] > 100).any()
    assert torch.equal(torch.isinf(y.cpu()), torch.isinf(exact))
    finite = torch.isfinite(exact)
    assert torch.equal(y.cpu()[finite], exact[finite])


def _model(device, factory):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 32, 3, stride=2, padding=1))
    model = model.to(device)
    return factory(model) if factory else model


@pytest.mark.parametrize("device, dtype", [("cpu", torch.bfloat16),
                                           pytest.param("cuda", torch.bfloat16,
                                                        marks=cuda_only),
                                           pytest.param("cuda", torch.float16,
                                                        marks=cuda_only)])
def test_autocast_matches_aten(device, dtype):
    """Under torch.autocast a converted model computes what the original
    computes: outputs in the autocast dtype, float32 parameter gradients,
    values within the dtype's rounding of each other."""
    original = _model(device, None)
    converted = conv2d_ext.convert(_model(device, None))
    x = torch.randn(4, 3, 16, 16, device=device)
    results = []
    for model in (original, converted):
        with torch.autocast(device, dtype=dtype):
            y = model(x)
        loss = y.float().square().mean()
        grads = torch.autograd.grad(loss, list(model.parameters()))
        results.append((y, grads))
    (y_ref, g_ref), (y, g) = results
    assert y.dtype == y_ref.dtype == dtype
    assert y.stride() == y_ref.stride()
    bound = tolerance(dtype, "tf32", 16 * 9)
    assert rel_err(y, y_ref) <= 2 * bound
    for a, b in zip(g, g_ref):
        assert a.dtype == b.dtype == torch.float32
        assert rel_err(a, b) <= 4 * bound


def test_autocast_under_compile_matches_eager():
    """The autocast kernel traces: torch.compile (fullgraph, dynamic) of a
    converted layer under CPU autocast gives eager's bfloat16 result."""
    torch._dynamo.reset()
    conv = conv2d_ext.Conv2d(4, 8, 3, padding=1)

    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return conv(x)

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    x = torch.randn(2, 4, 9, 11)
    y_eager, y_compiled = f(x), compiled(x)
    assert y_eager.dtype == y_compiled.dtype == torch.bfloat16
    assert rel_err(y_compiled, y_eager) <= tolerance(torch.bfloat16, "tf32", 36)


@cuda_only
def test_grad_scaler_float16_training_matches_the_original():
    """Ten float16 autocast steps with GradScaler: the converted model's
    losses track the original's."""
    losses = []
    for convert in (False, True):
        model = _model("cuda", conv2d_ext.convert if convert else None)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        scaler = torch.amp.GradScaler("cuda")
        torch.manual_seed(1)
        run = []
        for _ in range(10):
            x = torch.randn(8, 3, 16, 16, device="cuda")
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x).float().square().mean()
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            run.append(loss.item())
        losses.append(run)
    for a, b in zip(*losses):
        assert abs(a - b) <= 1e-2 * abs(b) + 1e-4, losses


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_modules_cast_to_16_bit(device, dtype):
    """A model cast with .to(dtype) and then converted runs, as the original."""
    original = _model(device, lambda m: m.to(dtype))
    converted = conv2d_ext.convert(_model(device, lambda m: m.to(dtype)))
    x = torch.randn(2, 3, 16, 16, device=device).to(dtype)
    if not _torch_conv_in(dtype, device):
        pytest.skip(f"PyTorch has no {dtype} convolution on {device}")
    y, y_ref = converted(x), original(x)
    assert y.dtype == dtype
    assert rel_err(y, y_ref) <= 2 * tolerance(dtype, "tf32", 16 * 9)
