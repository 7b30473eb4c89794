"""Every pass is bitwise reproducible, and runs unchanged under
torch.use_deterministic_algorithms(True)."""
import pytest
import torch

import conv2d_ext  # noqa: F401
from utils import DEVICES, cuda_only

ops = torch.ops.conv2d_ext
# Large enough for the CUDA wgrad to split its reduction over many blocks.
GEOMETRY = ([1, 1], [1, 2], [1, 1], 1)


def _run_all(x, w, gy):
    return (
        ops.conv2d(x, w, None, *GEOMETRY),
        ops.conv2d_backward_input(gy, w, list(x.shape), *GEOMETRY),
        ops.conv2d_backward_weight(gy, x, list(w.shape), *GEOMETRY),
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_bitwise_reproducible(device, dtype, precision):
    n, hw = (8, 64) if device == "cuda" else (2, 12)
    x = torch.randn(n, 16, hw, hw, device=device, dtype=dtype)
    w = torch.randn(32, 16, 3, 5, device=device, dtype=dtype)
    gy = torch.randn(n, 32, hw, hw, device=device, dtype=dtype)
    first = _run_all(x, w, gy)
    for _ in range(2):
        for a, b in zip(first, _run_all(x, w, gy)):
            assert torch.equal(a, b)


@cuda_only
def test_long_k_segments_bitwise_reproducible(precision):
    """The flat 3xTF32 kernel over a long K (IEEE mode) adds each segment's
    sums to the output where it lies: still bitwise the same from run to
    run. A forward over K = 48 * 45 with bias, and a dgrad over 64 * 45."""
    x = torch.randn(4, 48, 40, 96, device="cuda")
    w = torch.randn(64, 48, 5, 9, device="cuda")
    b = torch.randn(64, device="cuda")
    geometry = ([1, 1], [2, 4], [1, 1], 1)
    gy = torch.randn(4, 64, 40, 96, device="cuda")
    first = (ops.conv2d(x, w, b, *geometry), ops.conv2d_backward_input(gy, w, list(x.shape), *geometry))
    for _ in range(2):
        again = (ops.conv2d(x, w, b, *geometry), ops.conv2d_backward_input(gy, w, list(x.shape), *geometry))
        for a, c in zip(first, again):
            assert torch.equal(a, c)


@pytest.mark.parametrize("device", DEVICES)
def test_under_deterministic_algorithms(device):
    x = torch.randn(2, 8, 10, 10, device=device, requires_grad=True)
    conv = conv2d_ext.Conv2d(8, 16, 3, padding=1, device=device)
    expected = torch.autograd.grad(conv(x).square().sum(), [x, conv.weight, conv.bias])
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        got = torch.autograd.grad(conv(x).square().sum(), [x, conv.weight, conv.bias])
    finally:
        torch.use_deterministic_algorithms(previous)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
