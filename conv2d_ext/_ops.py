"""Fake (meta) kernels for the three ops; their autograd is registered in
C++ (csrc/autograd.cpp), where a call that needs no gradient costs no
Python.

Outputs have the memory format PyTorch's convolution would give them
(result_memory_format in csrc/conv_params.cpp), and the fake kernels
allocate them the same way.
"""
import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false

try:
    from torch._prims_common import suggest_memory_format
except ImportError:  # older torch: the same test of the strides
    from torch._prims_common import are_strides_like_channels_last

    def suggest_memory_format(x):
        if x.layout == torch.strided and x.dim() == 4 and are_strides_like_channels_last(
                x.shape, x.stride()):
            return torch.channels_last
        return torch.contiguous_format

from .functional import _pair


def _out_size(size, kernel, stride, pad, dilation):
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


# With the schema's defaults: the dispatcher leaves out trailing arguments
# that equal them when it calls a Python kernel.
@torch.library.register_fake("conv2d_ext::conv2d")
def _conv2d_fake(input, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    torch._check(input.dim() == 4, lambda: f"Expected 4D (batched) input to conv2d_ext::conv2d, got {input.dim()}D")
    torch._check(weight.dim() == 4, lambda: f"Expected 4-dimensional weight, got {weight.dim()}D")
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    n, c, h, w = input.shape
    out_h = _out_size(h, weight.shape[2], stride[0], padding[0], dilation[0])
    out_w = _out_size(w, weight.shape[3], stride[1], padding[1], dilation[1])
    # An input without channels gives an output without any (PyTorch's meta
    # kernel decides it the same way).
    out_c = 0 if guard_or_false(c == 0) else weight.shape[0]
    return _empty((n, out_c, out_h, out_w), input, weight)


@torch.library.register_fake("conv2d_ext::conv2d_backward_input")
def _dgrad_fake(grad_output, weight, input_size, stride, padding, dilation, groups):
    return _empty(input_size, grad_output, weight)


@torch.library.register_fake("conv2d_ext::conv2d_backward_weight")
def _wgrad_fake(grad_output, input, weight_size, stride, padding, dilation, groups):
    return _empty(weight_size, grad_output, input)


def _empty(size, a, b):
    """A result as the ops allocate it: in result_memory_format(a, b)
    (csrc/conv_params.cpp), channels_last when either operand suggests it,
    but float64 on CUDA."""
    fmt = torch.contiguous_format
    if not (a.device.type == "cuda" and a.dtype == torch.float64) and (
            suggest_memory_format(a) == torch.channels_last
            or suggest_memory_format(b) == torch.channels_last):
        fmt = torch.channels_last
    return torch.empty(size, dtype=a.dtype, device=a.device, memory_format=fmt)
