"""Fake (meta) kernels and autograd for the three ops.

Outputs are contiguous NCHW on every backend, so the fake kernels return
contiguous tensors too. Each op's backward is written with the ops
themselves, which makes every pass differentiable again (double backward):
for the bilinear maps fprop(x, w), dgrad(gy, w) and wgrad(gy, x) the
adjoint of each argument is one of the other two passes.
"""
import torch

_ops = torch.ops.conv2d_ext


def _out_size(size, kernel, stride, pad, dilation):
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


@torch.library.register_fake("conv2d_ext::conv2d")
def _conv2d_fake(input, weight, bias, stride, padding, dilation, groups):
    torch._check(input.dim() == 4, lambda: f"Expected 4D (batched) input to conv2d_ext::conv2d, got {input.dim()}D")
    torch._check(weight.dim() == 4, lambda: f"Expected 4-dimensional weight, got {weight.dim()}D")
    n, _, h, w = input.shape
    out_h = _out_size(h, weight.shape[2], stride[0], padding[0], dilation[0])
    out_w = _out_size(w, weight.shape[3], stride[1], padding[1], dilation[1])
    return input.new_empty((n, weight.shape[0], out_h, out_w))


@torch.library.register_fake("conv2d_ext::conv2d_backward_input")
def _dgrad_fake(grad_output, weight, input_size, stride, padding, dilation, groups):
    return grad_output.new_empty(input_size)


@torch.library.register_fake("conv2d_ext::conv2d_backward_weight")
def _wgrad_fake(grad_output, input, weight_size, stride, padding, dilation, groups):
    return grad_output.new_empty(weight_size)


def _save_geometry(ctx, stride, padding, dilation, groups):
    ctx.geometry = (stride, padding, dilation, groups)


# fprop(x, w) + b
def _conv2d_setup(ctx, inputs, output):
    input, weight, bias, *geometry = inputs
    ctx.save_for_backward(input, weight)
    ctx.has_bias = bias is not None
    _save_geometry(ctx, *geometry)


def _conv2d_backward(ctx, grad):
    input, weight = ctx.saved_tensors
    grad_input = grad_weight = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_input = _ops.conv2d_backward_input(grad, weight, input.shape, *ctx.geometry)
    if ctx.needs_input_grad[1]:
        grad_weight = _ops.conv2d_backward_weight(grad, input, weight.shape, *ctx.geometry)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_bias = grad.sum((0, 2, 3))
    return grad_input, grad_weight, grad_bias, None, None, None, None


# dgrad(gy, w): <g, dgrad(gy, w)> = <fprop(g, w), gy>
def _dgrad_setup(ctx, inputs, output):
    grad_output, weight, input_size, *geometry = inputs
    ctx.save_for_backward(grad_output, weight)
    _save_geometry(ctx, *geometry)


def _dgrad_backward(ctx, grad):
    grad_output, weight = ctx.saved_tensors
    d_grad_output = d_weight = None
    if ctx.needs_input_grad[0]:
        d_grad_output = _ops.conv2d(grad, weight, None, *ctx.geometry)
    if ctx.needs_input_grad[1]:
        d_weight = _ops.conv2d_backward_weight(grad_output, grad, weight.shape, *ctx.geometry)
    return d_grad_output, d_weight, None, None, None, None, None


# wgrad(gy, x): <g, wgrad(gy, x)> = <fprop(x, g), gy>
def _wgrad_setup(ctx, inputs, output):
    grad_output, input, weight_size, *geometry = inputs
    ctx.save_for_backward(grad_output, input)
    _save_geometry(ctx, *geometry)


def _wgrad_backward(ctx, grad):
    grad_output, input = ctx.saved_tensors
    d_grad_output = d_input = None
    if ctx.needs_input_grad[0]:
        d_grad_output = _ops.conv2d(input, grad, None, *ctx.geometry)
    if ctx.needs_input_grad[1]:
        d_input = _ops.conv2d_backward_input(grad_output, grad, input.shape, *ctx.geometry)
    return d_grad_output, d_input, None, None, None, None, None


torch.library.register_autograd("conv2d_ext::conv2d", _conv2d_backward, setup_context=_conv2d_setup)
torch.library.register_autograd(
    "conv2d_ext::conv2d_backward_input", _dgrad_backward, setup_context=_dgrad_setup
)
torch.library.register_autograd(
    "conv2d_ext::conv2d_backward_weight", _wgrad_backward, setup_context=_wgrad_setup
)
