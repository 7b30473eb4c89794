"""Property-based fuzzing: random convolutions (every parameter, layouts,
padding strings) against float64 references, forward and both gradients.

CONV2D_EXT_FUZZ_EXAMPLES sets the number of examples (default 60: CI's
budget; raise it on a GPU machine)."""
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import conv2d_ext
from utils import DEVICES, reference, rel_err, tf32_mode, tolerance

EXAMPLES = int(os.environ.get("CONV2D_EXT_FUZZ_EXAMPLES", "60"))


@st.composite
def conv_cases(draw):
    kind = draw(st.sampled_from(["dense", "dense", "grouped", "depthwise"]))
    groups = {"dense": 1, "grouped": draw(st.integers(2, 4)), "depthwise": draw(st.integers(1, 6))}[kind]
    cin_g = 1 if kind == "depthwise" else draw(st.integers(1, 12))
    multiplier = draw(st.integers(1, 2)) if kind == "depthwise" else draw(st.integers(1, 12))
    kernel = (draw(st.integers(1, 11)), draw(st.integers(1, 11)))
    dilation = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = draw(st.one_of(
        st.integers(0, 3),
        st.tuples(st.integers(0, 4), st.integers(0, 4)),
        st.just("valid"),
        st.just("same") if stride == (1, 1) else st.just("valid"),
    ))
    pads = (0, 0) if isinstance(padding, str) else (padding, padding) if isinstance(padding, int) else padding
    extent = [d * (k - 1) + 1 for d, k in zip(dilation, kernel)]
    size = [max(e - 2 * p, 1) + draw(st.integers(0, 9)) for e, p in zip(extent, pads)]
    return dict(
        n=draw(st.integers(1, 3)), cin=groups * cin_g, cout=groups * multiplier, size=size, kernel=kernel,
        stride=stride, padding=padding, dilation=dilation, groups=groups, bias=draw(st.booleans()),
        layout=draw(st.sampled_from(["contiguous", "channels_last", "sliced"])),
        tf32=draw(st.booleans()),
    )


def _layout(t, layout):
    if layout == "channels_last":
        return t.to(memory_format=torch.channels_last)
    if layout == "sliced":
        wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
        view = wide[..., ::2]
        view.copy_(t)
        return view
    return t


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=conv_cases())
def test_fuzz_against_float64(device, case):
    dtype = torch.float32
    x = torch.randn(case["n"], case["cin"], *case["size"], device=device, dtype=dtype)
    w = torch.randn(case["cout"], case["cin"] // case["groups"], *case["kernel"], device=device, dtype=dtype)
    b = torch.randn(case["cout"], device=device, dtype=dtype) if case["bias"] else None
    geometry = (case["stride"], case["padding"], case["dilation"], case["groups"])
    xs = _layout(x, case["layout"]).requires_grad_()
    ws = _layout(w, case["layout"]).requires_grad_()
    bs = None if b is None else b.clone().requires_grad_()
    with tf32_mode(case["tf32"]):
        y = conv2d_ext.conv2d(xs, ws, bs, *geometry)
        gy = torch.randn_like(y)
        grads = torch.autograd.grad(y, [xs, ws] + ([bs] if bs is not None else []), _layout(gy, case["layout"]))
    refs = reference(x, w, b, *geometry, grad_out=gy)
    mags = reference(x, w, b, *geometry, grad_out=gy, absolute=True)
    precision = "tf32" if (case["tf32"] and device == "cuda") else "ieee"
    k_fprop = w[0].numel()
    k_dgrad = case["cout"] // case["groups"] * w[0, 0].numel()
    k_wgrad = y.shape[0] * y.shape[2] * y.shape[3]
    for name, out, ref, mag, length in zip(["forward", "grad_input", "grad_weight", "grad_bias"],
                                          (y, *grads), refs, mags, [k_fprop, k_dgrad, k_wgrad, k_wgrad]):
        err = rel_err(out, ref, mag, length)
        assert err <= tolerance(dtype, precision, length), f"{name}: {err:.3g} for {case}"
