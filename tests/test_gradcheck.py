"""Numerical gradients in float64: first and second order."""
import pytest
import torch

import conv2d_ext
from utils import DEVICES


def _inputs(device):
    opts = dict(device=device, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 4, 7, 8, **opts)
    w = torch.randn(6, 2, 2, 3, **opts)
    b = torch.randn(6, **opts)
    return x, w, b


def _fn(x, w, b):
    return conv2d_ext.conv2d(x, w, b, stride=(1, 2), padding=(1, 0), dilation=(2, 1), groups=2)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device):
    assert torch.autograd.gradcheck(_fn, _inputs(device))


@pytest.mark.parametrize("device", DEVICES)
def test_gradgradcheck(device):
    assert torch.autograd.gradgradcheck(_fn, _inputs(device))
