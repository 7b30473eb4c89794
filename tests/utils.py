"""Shared helpers: float64 references, error measure and tolerances."""
import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

import conv2d_ext

HAS_CUDA = torch.cuda.is_available()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=cuda_only)]

# Unit roundoff of an operand and of the accumulator.
_UNIT = {
    ("float64", "ieee"): (2.0**-53, 2.0**-53),
    ("float32", "ieee"): (2.0**-24, 2.0**-24),
    ("float32", "tf32"): (2.0**-11, 2.0**-24),
    # 16-bit results: the operands are exact (the reference takes the same
    # 16-bit values), the result rounds once to the 16-bit type.
    ("bfloat16", "tf32"): (2.0**-8, 2.0**-24),
    ("bfloat16", "ieee"): (2.0**-8, 2.0**-24),
    ("float16", "tf32"): (2.0**-11, 2.0**-24),
    ("float16", "ieee"): (2.0**-11, 2.0**-24),
}


def tolerance(dtype, precision, reduction_len):
    """Bound on the relative L2 error of a sum of `reduction_len` products:
    operand rounding (independent of length) plus accumulation error, which
    grows like sqrt(length) for random data. In float64 the reference is no
    more precise than the result, so its own error is allowed for too."""
    name = str(dtype).split(".")[-1]
    u_in, u_acc = _UNIT[(name, precision)]
    factor = 32 if name == "float64" else 8
    return factor * (u_in + u_acc * math.sqrt(max(reduction_len, 1)))


def rel_err(out, ref, magnitude=None, reduction_len=1):
    """||out - ref|| / ||ref|| in float64; NaN anywhere gives NaN (fails).

    With `magnitude` (the same computation on absolute values), the
    denominator is floored at ||magnitude|| / sqrt(reduction_len), the size
    of a random sum of such terms: a result that cancels to near zero (a
    single bias gradient, say) then cannot fail on rounding alone."""
    out = out.detach().to(torch.float64).cpu()
    ref = ref.detach().to(torch.float64).cpu()
    assert out.shape == ref.shape, (out.shape, ref.shape)
    if not torch.isfinite(out).all():
        return float("nan")
    denom = ref.norm().item()
    if magnitude is not None:
        floor = magnitude.detach().to(torch.float64).cpu().norm().item() / math.sqrt(max(reduction_len, 1))
        denom = max(denom, floor)
    diff = (out - ref).norm().item()
    return diff / denom if denom > 0 else diff


def reference(x, w, b, stride, padding, dilation, groups, grad_out=None, absolute=False):
    """F.conv2d in float64 on the CPU; with grad_out, also the gradients of
    input, weight and bias. With absolute=True, the same on the absolute
    values of every operand: the magnitudes rel_err() scales by."""
    if absolute:
        x, w = x.abs(), w.abs()
        b = None if b is None else b.abs()
        grad_out = None if grad_out is None else grad_out.abs()
    x64 = x.detach().double().cpu().requires_grad_(grad_out is not None)
    w64 = w.detach().double().cpu().requires_grad_(grad_out is not None)
    b64 = None if b is None else b.detach().double().cpu().requires_grad_(grad_out is not None)
    y = F.conv2d(x64, w64, b64, stride, padding, dilation, groups)
    if grad_out is None:
        return y.detach()
    inputs = [x64, w64] + ([b64] if b64 is not None else [])
    grads = torch.autograd.grad(y, inputs, grad_out.detach().double().cpu())
    return (y.detach(), *grads)


def reduction_lengths(x, w, y):
    """Reduction length of forward, dgrad and wgrad."""
    cin_g, kh, kw = w.shape[1], w.shape[2], w.shape[3]
    cout_g = w.shape[0] * cin_g // x.shape[1]
    return cin_g * kh * kw, cout_g * kh * kw, y.shape[0] * y.shape[2] * y.shape[3]


def precision_of(dtype, device):
    """The precision mode the op runs in for this dtype and device."""
    if dtype == torch.float32 and device == "cuda" and torch.backends.cudnn.allow_tf32:
        return "tf32"
    return "ieee"


@contextlib.contextmanager
def tf32_mode(enabled):
    """PyTorch's convolution TF32 flag for the duration, through the flags()
    context manager: importing PyTorch's own test utilities (OpInfo tests)
    forbids setting the flags directly."""
    cudnn = torch.backends.cudnn
    with cudnn.flags(enabled=cudnn.enabled, benchmark=cudnn.benchmark,
                     deterministic=cudnn.deterministic, allow_tf32=enabled):
        yield


def is_hopper_build():
    """A Hopper GPU (compute capability 9.0) and a build with its sm_90a code."""
    major, minor = torch.cuda.get_device_capability()
    return (major, minor) == (9, 0) and "9.0" in (conv2d_ext.build_info()["cuda_archs"] or "")


@contextlib.contextmanager
def option(name, value):
    """One of the op's switches (csrc/options.h: `hopper_kernels`,
    `few_channels_dgrad_tc`, ...) set to `value` for the duration."""
    previous = torch.ops.conv2d_ext._set_option(name, value)
    try:
        yield
    finally:
        torch.ops.conv2d_ext._set_option(name, previous)


def hopper_kernels(enabled):
    """The op's Hopper-only kernels (wgmma, tensor-copy engine) on or off for
    the duration: off runs the kernels that other GPUs run."""
    return option("hopper_kernels", enabled)


def pair(v):
    """A stride, padding or dilation as nn.Conv2d takes it (an int or two)
    as a pair."""
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def cuda_kernel_names(fn):
    """The names of the CUDA kernels (and copies) `fn()` launches, as the
    profiler records them."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]


def tf32_round(t):
    """Round to nearest TF32, ties away from zero (finite values)."""
    return ((t.view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)


def tf32_truncate(t):
    """Truncate to TF32, as the tensor cores read float32 operands."""
    return (t.view(torch.int32) & ~0x1FFF).view(torch.float32)


def between_tf32(*shape):
    """Positive random values 3/4 of a TF32 ulp above a TF32 value: rounding
    to nearest goes up, truncation down, by amounts a sum of positive
    products accumulates instead of averaging out."""
    ulps = torch.randint(0, 1024, shape, device="cuda").double()
    exponents = torch.randint(-2, 3, shape, device="cuda").double()
    return ((1 + (ulps + 0.75) / 1024) * 2.0**exponents).float()  # exact in float32
