"""torch.library.opcheck on all three ops: schema, fake kernels, autograd
registration and AOT dispatch (static and dynamic shapes), with operands
contiguous and channels_last (the fake kernels must give the real results'
strides), in float64, float32 and both 16-bit types."""
import pytest
import torch

from utils import DEVICES

GEOMETRY = ([2, 1], [1, 2], [1, 2], 2)  # stride, padding, dilation, groups


LAYOUTS = [(torch.float64, "nchw"), (torch.float64, "channels_last"),
           (torch.float32, "channels_last"), (torch.bfloat16, "nchw"),
           (torch.float16, "channels_last")]


def _randn(*size, device, dtype=torch.float64, layout="nchw", requires_grad=False):
    t = torch.randn(*size, device=device, dtype=dtype)
    if layout == "channels_last":
        t = t.to(memory_format=torch.channels_last)
    return t.requires_grad_(requires_grad)


def _conv2d_args(device, requires_grad, bias, dtype=torch.float64, layout="nchw"):
    kw = dict(device=device, dtype=dtype, layout=layout, requires_grad=requires_grad)
    x = _randn(2, 4, 9, 10, **kw)
    w = _randn(6, 2, 3, 3, **kw)
    b = torch.randn(6, device=device, dtype=dtype, requires_grad=requires_grad) if bias else None
    return (x, w, b, *GEOMETRY)


def _output_shape(device):
    x, w, b, *geometry = _conv2d_args(device, False, False)
    return torch.ops.conv2d_ext.conv2d(x, w, b, *geometry).shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype, layout", LAYOUTS)
def test_opcheck_conv2d(device, requires_grad, bias, dtype, layout):
    torch.library.opcheck(torch.ops.conv2d_ext.conv2d,
                          _conv2d_args(device, requires_grad, bias, dtype, layout))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("dtype, layout", LAYOUTS)
def test_opcheck_backward_input(device, requires_grad, dtype, layout):
    kw = dict(device=device, dtype=dtype, layout=layout, requires_grad=requires_grad)
    gy = _randn(*_output_shape(device), **kw)
    w = _randn(6, 2, 3, 3, **kw)
    torch.library.opcheck(torch.ops.conv2d_ext.conv2d_backward_input, (gy, w, [2, 4, 9, 10], *GEOMETRY))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("dtype, layout", LAYOUTS)
def test_opcheck_backward_weight(device, requires_grad, dtype, layout):
    kw = dict(device=device, dtype=dtype, layout=layout, requires_grad=requires_grad)
    gy = _randn(*_output_shape(device), **kw)
    x = _randn(2, 4, 9, 10, **kw)
    torch.library.opcheck(torch.ops.conv2d_ext.conv2d_backward_weight, (gy, x, [6, 2, 3, 3], *GEOMETRY))
