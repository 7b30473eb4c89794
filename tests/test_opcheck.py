"""torch.library.opcheck on all three ops: schema, fake kernels, autograd
registration and AOT dispatch (static and dynamic shapes)."""
import pytest
import torch

from utils import DEVICES

GEOMETRY = ([2, 1], [1, 2], [1, 2], 2)  # stride, padding, dilation, groups


def _conv2d_args(device, requires_grad, bias):
    x = torch.randn(2, 4, 9, 10, device=device, dtype=torch.float64, requires_grad=requires_grad)
    w = torch.randn(6, 2, 3, 3, device=device, dtype=torch.float64, requires_grad=requires_grad)
    b = torch.randn(6, device=device, dtype=torch.float64, requires_grad=requires_grad) if bias else None
    return (x, w, b, *GEOMETRY)


def _output_shape(device):
    x, w, b, *geometry = _conv2d_args(device, False, False)
    return torch.ops.conv2d_ext.conv2d(x, w, b, *geometry).shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_opcheck_conv2d(device, requires_grad, bias):
    torch.library.opcheck(torch.ops.conv2d_ext.conv2d, _conv2d_args(device, requires_grad, bias))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck_backward_input(device, requires_grad):
    gy = torch.randn(_output_shape(device), device=device, dtype=torch.float64, requires_grad=requires_grad)
    w = torch.randn(6, 2, 3, 3, device=device, dtype=torch.float64, requires_grad=requires_grad)
    torch.library.opcheck(torch.ops.conv2d_ext.conv2d_backward_input, (gy, w, [2, 4, 9, 10], *GEOMETRY))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck_backward_weight(device, requires_grad):
    gy = torch.randn(_output_shape(device), device=device, dtype=torch.float64, requires_grad=requires_grad)
    x = torch.randn(2, 4, 9, 10, device=device, dtype=torch.float64, requires_grad=requires_grad)
    torch.library.opcheck(torch.ops.conv2d_ext.conv2d_backward_weight, (gy, x, [6, 2, 3, 3], *GEOMETRY))
