"""Non-contiguous and channels_last tensors, empty batches."""
import pytest
import torch

import conv2d_ext
from utils import DEVICES, precision_of, reference, rel_err, tolerance


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
