"""Tensors of more than 2^31 elements, in all three passes.

The full-batch result of each pass is checked against the op itself run on
one-image slices, which stay below 2^31 elements (and are checked against
float64 by the rest of the suite): forward and grad_input slice by slice,
grad_weight against the sum of the slices' weight gradients. The last output
rows of the last image, whose elements lie beyond 2^31 in the flat tensor,
are also checked against float64 F.conv2d directly.

GPU only, and only with enough free GPU memory (about 20-25 GiB for the
largest case); skipped with the reason otherwise. A small case runs the same
checks everywhere, so that the checking code itself is tested in CI."""
import gc
import math

import pytest
import torch
import torch.nn.functional as F

import conv2d_ext  # noqa: F401
from utils import DEVICES, cuda_only, precision_of, reduction_lengths, rel_err, tolerance

ops = torch.ops.conv2d_ext
BIG = 2**31

# (N, Cin, H, W, Cout, (KH, KW), padding, dilation), stride 1. Few channels
# and large planes (each below 2^31 elements, as the op requires).
HUGE_CASES = {
    # input (and grad_input) > 2^31 elements, output below: direct kernels
    "input_big_3x3": (2, 8, 8192, 18432, 4, (3, 3), (1, 1), (1, 1)),
    # output (and grad_output) > 2^31 elements, input below: direct kernels,
    # the specialised 5x9 kernel with dilation, four images
    "output_big_5x9": (4, 4, 4096, 18432, 8, (5, 9), (2, 8), (1, 2)),
    # both > 2^31 elements, 8 -> 8 channels: the tensor-core forward
    "both_big_tensor_core": (2, 8, 8192, 18432, 8, (3, 3), (1, 1), (1, 1)),
}
SMALL_CASE = (3, 4, 21, 30, 5, (5, 9), (2, 8), (1, 2))
TAIL_ROWS = 4


def _out_hw(case):
    _, _, h, w, _, (kh, kw), (ph, pw), (dh, dw) = case
    return h + 2 * ph - dh * (kh - 1), w + 2 * pw - dw * (kw - 1)


def _numels(case):
    n, cin, h, w, cout = case[:5]
    ho, wo = _out_hw(case)
    return n * cin * h * w, n * cout * ho * wo


def _bytes_needed(case):
    """Peak GPU memory of _check_against_slices: forward (x, y, one y
    slice), wgrad (x, grad_output), then dgrad without x (grad_output,
    grad_input, one grad_input slice); plus chunked float64 temporaries and
    a margin."""
    n = case[0]
    x, y = _numels(case)
    peak = max(x + y + y // n, x + y, y + x + x // n)
    return 4 * peak + (3 << 30)


def _require_free_memory(nbytes):
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    if free < nbytes:
        pytest.skip(f"needs {nbytes / 2**30:.1f} GiB of free GPU memory, "
                    f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB")


def _rel_diff(a, b, chunk=1 << 26):
    """||a - b|| / ||b|| in float64 without full-size temporaries (chunks
    of the flattened tensors); NaN or Inf anywhere gives NaN (fails)."""
    a, b = a.reshape(-1), b.reshape(-1)
    assert a.shape == b.shape
    num = torch.zeros((), dtype=torch.float64, device=a.device)
    den = torch.zeros((), dtype=torch.float64, device=a.device)
    for start in range(0, a.numel(), chunk):
        pa = a[start:start + chunk].double()
        pb = b[start:start + chunk].double()
        num += (pa - pb).square().sum()
        den += pb.square().sum()
    num, den = num.item(), den.item()
    if not (math.isfinite(num) and math.isfinite(den)):
        return math.nan
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def _tail_reference(x, w, b, padding, dilation, rows, absolute=False):
    """float64 F.conv2d of the last `rows` output rows of the last image
    (stride 1), from the input rows they read only."""
    (ph, pw), dh = padding, dilation[0]
    h, kh = x.shape[2], w.shape[2]
    first = h + 2 * ph - dh * (kh - 1) - rows  # first output row = first padded input row
    lo = first - ph
    xc = x[-1:, :, max(lo, 0):].double().cpu()
    wc, bc = w.double().cpu(), b.double().cpu()
    if absolute:
        xc, wc, bc = xc.abs(), wc.abs(), bc.abs()
    xc = F.pad(xc, (0, 0, max(0, -lo), ph))
    return F.conv2d(xc, wc, bc, 1, (0, pw), dilation)


def _check_against_slices(case, device):
    n, cin, h, w, cout, k, padding, dilation = case
    geometry = ([1, 1], list(padding), list(dilation), 1)
    x = torch.randn(n, cin, h, w, device=device)
    wt = torch.randn(cout, cin, *k, device=device)
    b = torch.randn(cout, device=device)
    precision = precision_of(torch.float32, device)

    # Forward: every image against the op on that image alone, and the last
    # rows of the last image against float64.
    y = ops.conv2d(x, wt, b, *geometry)
    k_fprop, k_dgrad, k_wgrad = reduction_lengths(x, wt, y)
    tol = tolerance(torch.float32, precision, k_fprop)
    for i in range(n):
        err = _rel_diff(y[i:i + 1], ops.conv2d(x[i:i + 1], wt, b, *geometry))
        assert err <= tol, f"forward, image {i}: relative difference {err:.3g} from the slice > {tol:.3g}"
    rows = min(TAIL_ROWS, y.shape[2])
    tail = y[-1:, :, -rows:]
    ref = _tail_reference(x, wt, b, padding, dilation, rows)
    mag = _tail_reference(x, wt, b, padding, dilation, rows, absolute=True)
    err = rel_err(tail, ref, mag, k_fprop)
    assert err <= tol, f"forward, last {rows} rows: relative error {err:.3g} > {tol:.3g} against float64"
    y_shape = y.shape
    del y, tail

    # grad_weight: the sum over images, against the sum of the slices'.
    gy = torch.randn(y_shape, device=device)
    gw = ops.conv2d_backward_weight(gy, x, list(wt.shape), *geometry)
    gw_sum = sum(ops.conv2d_backward_weight(gy[i:i + 1], x[i:i + 1], list(wt.shape), *geometry).double()
                 for i in range(n))
    tol = tolerance(torch.float32, precision, k_wgrad)
    err = rel_err(gw, gw_sum)
    assert err <= tol, f"grad_weight: relative difference {err:.3g} from the sum over slices > {tol:.3g}"
    x_shape = list(x.shape)
    del x, gw

    # grad_input: every image against the op on that image alone.
    gx = ops.conv2d_backward_input(gy, wt, x_shape, *geometry)
    tol = tolerance(torch.float32, precision, k_dgrad)
    for i in range(n):
        err = _rel_diff(gx[i:i + 1], ops.conv2d_backward_input(gy[i:i + 1], wt, [1] + x_shape[1:], *geometry))
        assert err <= tol, f"grad_input, image {i}: relative difference {err:.3g} from the slice > {tol:.3g}"


@cuda_only
@pytest.mark.parametrize("name", list(HUGE_CASES))
def test_more_than_2_31_elements(name):
    case = HUGE_CASES[name]
    n, cin, h, w, cout = case[:5]
    x_numel, y_numel = _numels(case)
    assert max(x_numel, y_numel) > BIG, "the case must exceed 2^31 elements"
    assert max(x_numel, y_numel) // n < BIG and h * w < BIG, "slices must stay below 2^31 elements"
    _require_free_memory(_bytes_needed(case))
    try:
        _check_against_slices(case, "cuda")
    finally:
        gc.collect()
        torch.cuda.empty_cache()


@pytest.mark.parametrize("device", DEVICES)
def test_slice_checks_on_a_small_case(device):
    _check_against_slices(SMALL_CASE, device)
