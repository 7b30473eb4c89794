"""The op follows PyTorch's convolution precision flag."""
import torch

import conv2d_ext  # noqa: F401


def test_follows_allow_tf32():
    previous = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = False
        assert torch.ops.conv2d_ext._math_mode() == "ieee"
        torch.backends.cudnn.allow_tf32 = True
        assert torch.ops.conv2d_ext._math_mode() == "tf32"
    finally:
        torch.backends.cudnn.allow_tf32 = previous


def test_follows_conv_fp32_precision():
    conv = torch.backends.cudnn.conv
    previous = conv.fp32_precision
    try:
        conv.fp32_precision = "ieee"
        assert torch.ops.conv2d_ext._math_mode() == "ieee"
        conv.fp32_precision = "tf32"
        assert torch.ops.conv2d_ext._math_mode() == "tf32"
    finally:
        conv.fp32_precision = previous
