"""Non-contiguous and channels_last tensors, the results' memory formats,
empty batches."""
import pytest
import torch

import torch.nn.functional as F

import conv2d_ext
from utils import DEVICES, precision_of, reference, rel_err, tolerance

CL = torch.channels_last


def _grads(x, w, b, gy, **kw):
    y = conv2d_ext.conv2d(x, w, b, **kw)
    return (y, *torch.autograd.grad(y, [x, w, b], gy))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["channels_last", "sliced", "transposed"])
def test_layouts_match_contiguous(device, layout):
    kw = dict(stride=(1, 2), padding=(2, 1), dilation=(1, 2), groups=2)
    x = torch.randn(2, 4, 13, 11, device=device)
    w = torch.randn(6, 2, 3, 5, device=device)
    b = torch.randn(6, device=device)
    gy = torch.randn_like(conv2d_ext.conv2d(x, w, b, **kw))
    ref = _grads(*(t.clone().requires_grad_() for t in (x, w, b)), gy, **kw)
    if layout == "channels_last":
        xs = x.to(memory_format=torch.channels_last)
        ws = w.to(memory_format=torch.channels_last)
        gys = gy.to(memory_format=torch.channels_last)
        assert not xs.is_contiguous()
    elif layout == "sliced":
        xs = torch.randn(2, 8, 13, 22, device=device)[:, ::2, :, ::2]
        xs.copy_(x)
        ws = torch.randn(6, 4, 3, 5, device=device)[:, 1::2]
        ws.copy_(w)
        gys = torch.randn(*gy.shape[:3], 2 * gy.shape[3], device=device)[..., ::2]
        gys.copy_(gy)
    else:
        xs = x.transpose(2, 3).contiguous().transpose(2, 3)
        ws = w.transpose(0, 1).contiguous().transpose(0, 1)
        gys = gy.transpose(1, 3).contiguous().transpose(1, 3)
    assert not xs.is_contiguous() and not ws.is_contiguous() and not gys.is_contiguous()
    out = _grads(xs.requires_grad_(), ws.requires_grad_(), b.clone().requires_grad_(), gys, **kw)
    for got, want in zip(out[:3], ref[:3]):
        # Same kernels on the same values: the results are identical.
        assert torch.equal(got, want)
    # The bias gradient is PyTorch's own sum, whose order follows the layout.
    assert rel_err(out[3], ref[3]) <= tolerance(torch.float32, "ieee", gy[:, 0].numel())
    # ... and correct.
    y64 = reference(x, w, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"])
    assert rel_err(out[0], y64) <= tolerance(torch.float32, precision_of(torch.float32, device), 30)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device):
    x = torch.randn(0, 3, 8, 8, device=device, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, device=device, requires_grad=True)
    b = torch.randn(4, device=device, requires_grad=True)
    y = conv2d_ext.conv2d(x, w, b, padding=1)
    assert y.shape == (0, 4, 8, 8)
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert torch.equal(w.grad, torch.zeros_like(w))
    assert torch.equal(b.grad, torch.zeros_like(b))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("x_format", ["nchw", "channels_last"])
@pytest.mark.parametrize("w_format", ["nchw", "channels_last"])
@pytest.mark.parametrize("kernel", [3, 1])
def test_result_formats_match_pytorchs(device, dtype, x_format, w_format, kernel):
    """The output and grad_input have the strides PyTorch's convolution gives
    them on the same device (channels_last when the input or the weight is,
    but float64 on CUDA); grad_weight has the weight's own strides, as DDP's
    gradient buckets need, 1 x 1 kernels (whose channels_last and
    contiguous strides both fit) included."""
    x = torch.randn(2, 4, 9, 7, device=device, dtype=dtype)
    w = torch.randn(6, 4, kernel, kernel, device=device, dtype=dtype)
    if x_format == "channels_last":
        x = x.to(memory_format=CL)
    if w_format == "channels_last":
        w = w.to(memory_format=CL)
    x.requires_grad_()
    w.requires_grad_()
    y = conv2d_ext.conv2d(x, w, padding=kernel // 2)
    y_ref = F.conv2d(x, w, padding=kernel // 2)
    assert y.stride() == y_ref.stride()
    gy = torch.randn_like(y_ref)
    gx, gw = torch.autograd.grad(y, [x, w], gy)
    gx_ref, _ = torch.autograd.grad(y_ref, [x, w], gy)
    assert gx.stride() == gx_ref.stride()
    assert gw.stride() == w.stride()
    # And the values, whatever the layouts.
    y64, gx64, gw64 = reference(x, w, None, 1, kernel // 2, 1, 1, grad_out=gy)
    fwd, dgrad, wgrad = 4 * kernel * kernel, 6 * kernel * kernel, 2 * 9 * 7
    assert rel_err(y, y64) <= tolerance(dtype, precision_of(dtype, device), fwd)
    assert rel_err(gx, gx64) <= tolerance(dtype, precision_of(dtype, device), dgrad)
    assert rel_err(gw, gw64) <= tolerance(dtype, precision_of(dtype, device), wgrad)


@pytest.mark.parametrize("device", DEVICES)
def test_grad_of_a_channels_last_grad_output_keeps_the_forwards_format(device):
    """A gradient arriving in another format than the output's does not
    change grad_input's: PyTorch's follows the input and weight."""
    x = torch.randn(2, 4, 9, 7, device=device, requires_grad=True)
    w = torch.randn(6, 4, 3, 3, device=device, requires_grad=True)
    y = conv2d_ext.conv2d(x, w, padding=1)
    gy = torch.randn_like(y).to(memory_format=CL)
    gx, gw = torch.autograd.grad(y, [x, w], gy)
    assert gx.is_contiguous() and gw.is_contiguous()
