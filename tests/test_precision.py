"""The op follows PyTorch's convolution precision flag."""
import torch

import conv2d_ext  # noqa: F401
from utils import tf32_mode


def test_follows_allow_tf32():
    with tf32_mode(False):
        assert torch.ops.conv2d_ext._math_mode() == "ieee"
    with tf32_mode(True):
        assert torch.ops.conv2d_ext._math_mode() == "tf32"


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
