"""Bad input gives a clear error, with PyTorch's wording where it has one."""
import re

import pytest
import torch

import conv2d_ext
from utils import cuda_only

conv = conv2d_ext.conv2d


def x_(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, device=device).to(dtype)


def raises(pattern):
    return pytest.raises(RuntimeError, match=re.escape(pattern))


def test_input_rank():
    with raises("Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of size: [3, 8]"):
        conv(x_(3, 8), x_(2, 3, 1, 1))
    with raises("Expected 3D (unbatched) or 4D (batched) input"):
        conv(x_(1, 1, 3, 8, 8), x_(2, 3, 1, 1))
    with raises("Expected 4D (batched) input to conv2d_ext::conv2d"):
        torch.ops.conv2d_ext.conv2d(x_(3, 8, 8), x_(2, 3, 1, 1), None, [1, 1], [0, 0], [1, 1], 1)


def test_weight_rank():
    with raises("Expected 4-dimensional weight for 4-dimensional input [1, 3, 8, 8], but got 3-dimensional weight"):
        conv(x_(1, 3, 8, 8), x_(2, 3, 3))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.complex64, torch.bool,
                                   torch.float8_e4m3fn])
def test_unsupported_dtype(dtype):
    x = torch.ones(1, 3, 8, 8, dtype=dtype)
    w = torch.ones(2, 3, 3, 3, dtype=dtype)
    with raises("conv2d_ext::conv2d not implemented for"):
        conv(x, w)


def test_dtype_mismatch_weight():
    with raises("Input type (Float) and weight type (Double) should be the same"):
        conv(x_(1, 3, 8, 8), x_(2, 3, 3, 3, dtype=torch.float64))


def test_dtype_mismatch_bias():
    with raises("Input type (Float) and bias type (Double) should be the same"):
        conv(x_(1, 3, 8, 8), x_(2, 3, 3, 3), x_(2, dtype=torch.float64))


@cuda_only
def test_device_mismatch():
    with raises("found at least two devices, cuda:0 and cpu"):
        conv(x_(1, 3, 8, 8, device="cuda"), x_(2, 3, 3, 3))
    with raises("found at least two devices, cpu and cuda:0"):
        conv(x_(1, 3, 8, 8), x_(2, 3, 3, 3), x_(2, device="cuda"))


def test_channels_mismatch():
    with raises("Given groups=1, weight of size [2, 4, 3, 3], expected input[1, 3, 8, 8] to have 4 channels, "
                "but got 3 channels instead"):
        conv(x_(1, 3, 8, 8), x_(2, 4, 3, 3))


@pytest.mark.parametrize("batch", [2, 0])
def test_fewer_out_channels_than_groups(batch):
    # Checked before the channels: [0, 4, 3, 3] fits no input either.
    for weight, groups in (((0, 3, 3, 3), 1), ((0, 4, 3, 3), 1), ((1, 3, 3, 3), 2)):
        message = (f"Given groups={groups}, expected weight to be at least {groups} at dimension 0, "
                   f"but got weight of size {list(weight)} instead")
        x, w = x_(batch, 3 * groups, 8, 8), x_(*weight)
        for fn in (torch.nn.functional.conv2d, conv, torch.ops.conv2d_ext.conv2d):
            with raises(message):
                fn(x, w, None, [1, 1], [0, 0], [1, 1], groups)


def test_backward_ops_fewer_out_channels_than_groups():
    # As aten::convolution_backward, whose message this compares with.
    gy, x, w = x_(2, 0, 6, 6), x_(2, 3, 8, 8), x_(0, 3, 3, 3)
    geometry = ([1, 1], [0, 0], [1, 1], 1)
    message = "Given groups=1, expected weight to be at least 1 at dimension 0, but got weight of size [0, 3, 3, 3]"
    with raises(message):
        torch.ops.aten.convolution_backward(gy, x, w, None, *geometry[:3], False, [0, 0], 1, [True, True, False])
    with raises(message):
        torch.ops.conv2d_ext.conv2d_backward_input(gy, w, list(x.shape), *geometry)
    with raises(message):
        torch.ops.conv2d_ext.conv2d_backward_weight(gy, x, list(w.shape), *geometry)


def test_groups_not_dividing_out_channels():
    with raises("Given groups=2, expected weight to be divisible by 2 at dimension 0"):
        conv(x_(1, 4, 8, 8), x_(3, 2, 3, 3), groups=2)


def test_groups_not_dividing_in_channels():
    with raises("Given groups=2, weight of size [4, 2, 3, 3], expected input[1, 5, 8, 8] to have 4 channels"):
        conv(x_(1, 5, 8, 8), x_(4, 2, 3, 3), groups=2)


def test_bias_shape():
    with raises("expected bias to be 1-dimensional with 2 elements, but got bias of size [3] instead"):
        conv(x_(1, 3, 8, 8), x_(2, 3, 3, 3), x_(3))
    with raises("expected bias to be 1-dimensional with 2 elements, but got bias of size [1, 2] instead"):
        conv(x_(1, 3, 8, 8), x_(2, 3, 3, 3), x_(1, 2))


def test_kernel_larger_than_padded_input():
    with raises("Calculated padded input size per channel: (4 x 4). Kernel size: (5 x 5). "
                "Kernel size can't be greater than actual input size"):
        conv(x_(1, 3, 4, 4), x_(2, 3, 5, 5))
    with raises("Kernel size: (5 x 7)"):  # the dilated extent counts
        conv(x_(1, 3, 6, 6), x_(2, 3, 3, 3), dilation=(2, 3))


@pytest.mark.parametrize("stride", [0, -1, (1, 0)])
def test_non_positive_stride(stride):
    with raises("non-positive stride is not supported"):
        conv(x_(1, 3, 8, 8), x_(2, 3, 3, 3), stride=stride)


@pytest.mark.parametrize("dilation", [0, (1, -2)])
def test_non_positive_dilation(dilation):
    with raises("dilation should be greater than zero"):
        conv(x_(1, 3, 8, 8), x_(2, 3, 3, 3), dilation=dilation)


@pytest.mark.parametrize("groups", [0, -3])
def test_non_positive_groups(groups):
    with raises("non-positive groups is not supported"):
        conv(x_(1, 3, 8, 8), x_(2, 3, 3, 3), groups=groups)


def test_negative_padding():
    with raises("negative padding is not supported"):
        conv(x_(1, 3, 8, 8), x_(2, 3, 3, 3), padding=(-1, 0))


def test_same_padding_with_stride():
    with raises("padding='same' is not supported for strided convolutions"):
        conv(x_(1, 3, 8, 8), x_(2, 3, 3, 3), stride=2, padding="same")


def test_bad_padding_string():
    with raises("Invalid padding string: 'full'"):
        conv(x_(1, 3, 8, 8), x_(2, 3, 3, 3), padding="full")


def test_empty_spatial_input():
    with raises("Expected input's non-batch dimensions to have positive length"):
        conv(x_(1, 3, 0, 8), x_(2, 3, 1, 1))


def test_backward_ops_check_shapes():
    gy = x_(1, 2, 6, 6)
    with raises("grad_output of size [1, 2, 6, 6] does not match the output size [1, 2, 7, 7]"):
        torch.ops.conv2d_ext.conv2d_backward_input(gy, x_(2, 3, 3, 3), [1, 3, 9, 9], [1, 1], [0, 0], [1, 1], 1)
    with raises("grad_output of size [1, 2, 6, 6] does not match"):
        torch.ops.conv2d_ext.conv2d_backward_weight(gy, x_(1, 3, 9, 9), [2, 3, 3, 3], [1, 1], [0, 0], [1, 1], 1)
    with raises("grad_output type (Float) and weight type (Double) should be the same"):
        torch.ops.conv2d_ext.conv2d_backward_input(gy, x_(2, 3, 3, 3, dtype=torch.float64), [1, 3, 8, 8],
                                                   [1, 1], [0, 0], [1, 1], 1)


# The kernels' 32-bit limits (kMaxIndex32 = 2^31 - 2^16 in conv_params.h):
# tensors may be of any size, but not one plane, padded extent, channel count
# or weight. Empty batches and expanded weights keep these tests free.
LIMIT = 2**31 - 2**16


def _expanded(*shape):
    return torch.zeros(1).expand(*shape)


def test_plane_beyond_32_bit_indexing():
    with raises(f"conv2d_ext: one channel plane of {LIMIT} or more elements is not supported "
                "(input 1048576x2048, output 1048576x2048)"):
        conv(torch.empty(0, 1, 2**20, 2**11), x_(1, 1, 1, 1))


def test_padded_extent_beyond_32_bit_indexing():
    with raises(f"conv2d_ext: a padded input extent of {LIMIT} or more is not supported (padded input 1x2147483649)"):
        conv(x_(1, 1, 1, 1), x_(1, 1, 1, 1), padding=(0, 2**30))


def test_channels_beyond_32_bit_indexing():
    with raises(f"conv2d_ext: a batch or channel count of {LIMIT} or more is not supported"):
        conv(torch.empty(0, LIMIT, 1, 1), _expanded(1, LIMIT, 1, 1))


def test_weight_beyond_32_bit_indexing():
    with raises(f"conv2d_ext: a weight of {LIMIT} or more elements is not supported (weight[32768, 65536, 1, 1])"):
        conv(torch.empty(0, 2**16, 1, 1), _expanded(2**15, 2**16, 1, 1))
