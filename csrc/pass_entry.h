// What every backend's op does around its kernels, written once: validate
// the arguments, guard the device, allocate the output, handle empty
// problems, hand contiguous NCHW operands to the backend's launcher.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

#include "conv_params.h"

namespace conv2d_ext {

// launch(params, x, w, bias_or_undefined, y)
template <typename Launch>
at::Tensor fprop_entry(const at::Tensor& input, const at::Tensor& weight,
                       const c10::optional<at::Tensor>& bias,
                       c10::IntArrayRef stride, c10::IntArrayRef padding,
                       c10::IntArrayRef dilation, int64_t groups,
                       Launch&& launch) {
  const ConvParams p = make_fprop_params(input, weight, bias, stride, padding,
                                         dilation, groups);
  const c10::DeviceGuard guard(input.device());
  at::Tensor y = empty_output({p.batch, p.out_channels, p.out_h, p.out_w},
                              input.options());
  if (y.numel() == 0) return y;
  const bool has_bias = bias.has_value() && bias->defined();
  launch(p, input.contiguous(), weight.contiguous(),
         has_bias ? bias->contiguous() : at::Tensor(), y);
  return y;
}

// launch(params, grad_output, w, grad_input)
template <typename Launch>
at::Tensor dgrad_entry(const at::Tensor& grad_output, const at::Tensor& weight,
                       c10::IntArrayRef input_size, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation,
                       int64_t groups, Launch&& launch) {
  const ConvParams p = make_dgrad_params(grad_output, weight, input_size,
                                         stride, padding, dilation, groups);
  const c10::DeviceGuard guard(grad_output.device());
  at::Tensor grad_in = empty_output(input_size, grad_output.options());
  if (grad_in.numel() == 0) return grad_in;
  launch(p, grad_output.contiguous(), weight.contiguous(), grad_in);
  return grad_in;
}

// launch(params, grad_output, x, grad_weight)
template <typename Launch>
at::Tensor wgrad_entry(const at::Tensor& grad_output, const at::Tensor& input,
                       c10::IntArrayRef weight_size, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation,
                       int64_t groups, Launch&& launch) {
  const ConvParams p = make_wgrad_params(grad_output, input, weight_size,
                                         stride, padding, dilation, groups);
  const c10::DeviceGuard guard(grad_output.device());
  at::Tensor grad_w = empty_output(weight_size, grad_output.options());
  if (grad_w.numel() == 0) return grad_w;
  if (p.gemm_m() == 0) return grad_w.zero_();  // empty batch: nothing summed
  launch(p, grad_output.contiguous(), input.contiguous(), grad_w);
  return grad_w;
}

}  // namespace conv2d_ext
