"""NaN and Inf propagate as in float64 F.conv2d: with a few input elements
set to +Inf, -Inf and NaN (or a few weights set to NaN), the output and both
gradients have exactly the reference's NaN, +Inf and -Inf elements, and the
finite elements stay within the suite's tolerances. One exception, bounded:
grad_input of NaN weights may have more NaN in those weights' channels."""
import math

import pytest
import torch

import conv2d_ext
from utils import (DEVICES, pair, precision_of, reduction_lengths, reference, rel_err,
                   tf32_mode, tolerance)

INF, NAN = math.inf, math.nan

# (N, Cin, H, W, Cout, (KH, KW), stride, padding, dilation). The "tc" cases
# have 8+ input and 64 output channels: the tensor-core forward on a GPU.
CASES = {
    "5x9": (2, 3, 12, 22, 4, (5, 9), 1, 0, 1),
    "5x9_pad": (2, 3, 12, 22, 4, (5, 9), 1, (2, 4), 1),
    "5x9_tc_pad": (1, 8, 12, 40, 64, (5, 9), 1, (2, 4), 1),
    "3x3_tc": (2, 8, 10, 36, 64, (3, 3), 1, 0, 1),
    "3x3_tc_pad": (2, 8, 10, 36, 64, (3, 3), 1, 1, 1),
    "3x3_tc_strided": (1, 12, 11, 37, 64, (3, 3), (2, 1), 0, (1, 2)),
    "3x3_tc_strided_pad": (1, 12, 11, 37, 64, (3, 3), (2, 1), 1, (1, 2)),
    # Wide enough for the sm_90 wgrad: K tiles past the right edge, whose
    # positions read real input columns (an Inf there must not meet their
    # zero grad_output); grad_output rows of 56 (TMA) and 58 (copied) floats.
    "5x9_tc_wide": (1, 8, 9, 64, 64, (5, 9), 1, 0, 1),
    "3x3_tc_wide": (2, 8, 10, 60, 64, (3, 3), 1, 0, 1),
    # The sm_90 flat forward's 3xTF32 split walks a chunk's box in full
    # rounds (5x9_tc_pad: only those), then a tail; a partial chunk (12
    # channels) takes its masked path. test_split_cases_cover_the_split.
    "5x9_tc_tail": (1, 8, 6, 128, 64, (5, 9), 1, (2, 4), 1),
    "3x3_tc_masked": (1, 12, 6, 120, 64, (3, 3), 1, 1, 1),
}
# NaN weights only without padding: whether a NaN weight meets the zeros of
# the padding (NaN) or skips them (finite) differs between implementations,
# PyTorch's own included. dgrad meets such zeros even without padding where
# it runs as a forward pass over grad_output padded by dilation*(K-1): see
# _assert_nan_weight_grad_input.
WEIGHT_CASES = [name for name, case in CASES.items() if case[7] == 0]


def _inputs(case, device, dtype, kind):
    n, cin, h, w, cout, k, stride, padding, dilation = case
    x = torch.randn(n, cin, h, w, dtype=dtype)
    wt = torch.randn(cout, cin, *k, dtype=dtype)
    b = torch.randn(cout, dtype=dtype)
    # Output channel 0 has positive weights, so that an output reached by one
    # Inf has its sign, and one reached by +Inf and -Inf is NaN.
    wt[0] = wt[0].abs()
    if kind == "input":
        x[0, 0, 0, 0] = -INF  # corner
        x[0, 0, h // 2, w // 2] = INF
        x[0, cin - 1, h // 2, w // 2 + 1] = -INF  # overlaps the +Inf's outputs
        x[-1, 0, 1, w - 1] = INF  # right border
        x[-1, cin // 2, h - 1, w - 2] = NAN  # bottom border
    else:
        wt[1, 0, 0, k[1] - 1] = NAN
        wt[-1, cin - 1, k[0] // 2, k[1] // 2] = NAN
    return [t.to(device).requires_grad_() for t in (x, wt, b)] + [stride, padding, dilation]


def _assert_matches(name, out, ref, mag, dtype, precision, length):
    """Same NaN, +Inf and -Inf elements as the float64 reference (cast to
    dtype); finite elements within the suite's tolerance, elementwise
    (scaled by the largest finite magnitude) and in relative L2."""
    out = out.detach().cpu()
    expected = ref.to(dtype)
    finite = torch.isfinite(expected)
    tol = tolerance(dtype, precision, length)
    scale = mag[finite].max().item() if finite.any() else 0.0
    torch.testing.assert_close(out, expected, rtol=tol, atol=tol * scale, equal_nan=True,
                               msg=lambda m: f"{name} ({precision}): {m}")
    if finite.any():
        err = rel_err(out[finite], ref[finite], mag[finite], length)
        assert err <= tol, f"{name}: relative error of the finite elements {err:.3g} > {tol:.3g} ({precision})"


def _assert_nan_weight_grad_input(out, ref, mag, dtype, precision, length, nan_channels):
    """grad_input with NaN weights: NaN wherever the reference is, NaN
    beyond that only in the input channels of the NaN weights (dgrad as a
    padded forward multiplies them by the zeros around grad_output), and
    the reference elsewhere."""
    out = out.detach().cpu()
    expected = ref.to(dtype)
    assert out.isnan()[expected.isnan()].all(), "grad_input: a reference NaN is not NaN"
    extra = out.isnan() & ~expected.isnan()
    others = [c for c in range(out.shape[1]) if c not in nan_channels]
    assert not extra[:, others].any(), "grad_input: NaN in a channel without a NaN weight"
    assert not out.isinf().any() and not expected.isinf().any()
    both = ~out.isnan() & ~expected.isnan()
    assert both[:, others].all()
    tol = tolerance(dtype, precision, length)
    err = rel_err(out[both], ref[both], mag[both], length)
    assert err <= tol, f"grad_input: relative error of the finite elements {err:.3g} > {tol:.3g}"


def _check(case, device, dtype, kind):
    x, w, b, stride, padding, dilation = _inputs(case, device, dtype, kind)
    y = conv2d_ext.conv2d(x, w, b, stride, padding, dilation)
    gy = torch.randn_like(y)  # finite
    grads = torch.autograd.grad(y, [x, w, b], gy)
    refs = reference(x, w, b, stride, padding, dilation, 1, grad_out=gy)
    mags = reference(x, w, b, stride, padding, dilation, 1, grad_out=gy, absolute=True)
    # The case exercises what it claims. grad_input depends on the weights
    # only, grad_weight on the input only.
    if kind == "input":
        assert refs[0].isnan().any() and refs[0].isposinf().any() and refs[0].isneginf().any()
        assert refs[1].isfinite().all() and not refs[2].isfinite().all()
    else:
        assert refs[0].isnan().any() and refs[1].isnan().any() and refs[2].isfinite().all()
    precision = precision_of(dtype, device)
    k_fprop, k_dgrad, k_wgrad = reduction_lengths(x, w, y)
    names = ["forward", "grad_input", "grad_weight", "grad_bias"]
    lengths = [k_fprop, k_dgrad, k_wgrad, k_wgrad]
    for name, out, ref, mag, length in zip(names, (y, *grads), refs, mags, lengths):
        if kind == "weight" and name == "grad_input":
            nan_channels = w.isnan().any(dim=(0, 2, 3)).nonzero().flatten().tolist()
            _assert_nan_weight_grad_input(out, ref, mag, dtype, precision, length, nan_channels)
        else:
            _assert_matches(name, out, ref, mag, dtype, precision, length)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_nonfinite_input(name, device, precision):
    _check(CASES[name], device, torch.float32, "input")


@pytest.mark.parametrize("name", WEIGHT_CASES)
@pytest.mark.parametrize("device", DEVICES)
def test_nan_weight(name, device, precision):
    _check(CASES[name], device, torch.float32, "weight")


@pytest.mark.parametrize("kind", ["input", "weight"])
@pytest.mark.parametrize("device", DEVICES)
def test_float64(device, kind):
    _check(CASES["3x3_tc_strided"], device, torch.float64, kind)


@pytest.mark.parametrize("device", DEVICES)
def test_nonfinite_grad_output_strided(device, precision):
    """Inf in grad_output reaches grad_input only through taps that read it.
    A 1x1 layer at stride 2 with padding 1: odd input rows read grad_output
    row (ih + 1) / 2, so row 0 (the padding's) reaches nothing; dgrad's
    phase of odd rows starts at grad_output row 1 and must not multiply row
    0 by a zero weight (0 * Inf = NaN)."""
    x = torch.randn(1, 8, 10, 12, device=device, requires_grad=True)
    w = torch.randn(8, 8, 1, 1, device=device, requires_grad=True)
    b = torch.randn(8, device=device, requires_grad=True)
    y = conv2d_ext.conv2d(x, w, b, 2, 1, 1)
    gy = torch.randn_like(y)
    gy[0, 0, 0, :] = INF  # reaches nothing
    gy[0, 3, 2, 1] = -INF  # reaches input row 3, column 1
    (gx,) = torch.autograd.grad(y, [x], gy)
    refs = reference(x, w, b, 2, 1, 1, 1, grad_out=gy)
    mags = reference(x, w, b, 2, 1, 1, 1, grad_out=gy, absolute=True)
    assert refs[1].isinf().any() and refs[1][:, :, 1].isfinite().all()
    _, k_dgrad, _ = reduction_lengths(x, w, y)
    _assert_matches("grad_input", gx, refs[1], mags[1], torch.float32,
                    precision_of(torch.float32, device), k_dgrad)


def _split_rounds(name):
    """{full rounds, tail pixels} of the IEEE forward's flat layout."""
    n, cin, h, w, cout, k, stride, padding, dilation = CASES[name]
    x, wt = torch.empty(n, cin, h, w), torch.empty(cout, cin, *k)
    with tf32_mode(False):
        return torch.ops.conv2d_ext._flat_tf32x3_rounds(
            "forward", x, wt, pair(stride), pair(padding), pair(dilation), 1)


def test_split_cases_cover_the_split():
    """The cases reach every path of the flat kernel's 3xTF32 split with
    non-finite input (a host decision: checked without a GPU too): a box of
    full rounds only, one of full rounds and a tail, a partial chunk."""
    assert _split_rounds("5x9_tc_pad")[0] >= 1 and _split_rounds("5x9_tc_pad")[1] == 0
    full, tail = _split_rounds("5x9_tc_tail")
    assert full >= 1 and tail > 0
    assert _split_rounds("3x3_tc_masked")[0] >= 1 and CASES["3x3_tc_masked"][1] % 8 != 0
