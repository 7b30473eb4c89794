// What every backend's op does around its kernels, written once: validate
// the arguments, guard the device, allocate the output in PyTorch's memory
// format (result_memory_format), handle empty problems, hand contiguous
// NCHW operands to the backend's launcher.
//
// float16 and bfloat16 operands run natively where the backend's nhwc(p,
// dtype) says so for their dtype (the channels_last engine: its forward
// and dgrad on Hopper, its wgrad on sm_80+); elsewhere they run the
// float32 kernels on float32
// copies (in their memory formats), the result rounded once to the 16-bit
// type. That is what a 16-bit convolution computes: products of 16-bit
// values are exact in float32, and in TF32 too (11 significant bits, as
// float16 has; bfloat16 has 8), and the sums accumulate in float32. It is
// correct in every kernel family at once; native 16-bit kernels, reading
// half the bytes at twice the tensor-core rate, are to replace the copies.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

#include <vector>

#include "conv_params.h"

namespace conv2d_ext {

// The channels_last kernels: nhwc(params, dtype, channels_last) says
// whether they run the call. For a channels_last result they read the
// operands as given (in that format); for an NCHW one, channels_last
// copies of them, and the result is copied back (nhwc_on_copies).
//
// A result of `sizes` in `format`, which run(out) writes in `written`
// (contiguous NCHW or channels_last): in place where the two agree, else
// copied. Not run when empty.
template <typename Run>
at::Tensor result_written_in(c10::IntArrayRef sizes, const at::TensorOptions& opts,
                             at::MemoryFormat format, at::MemoryFormat written, Run&& run) {
  if (format == written) {
    at::Tensor out = empty_output(sizes, opts, written);
    if (out.numel() > 0) run(out);
    return out;
  }
  // Allocated in the format itself, so that its strides are those of the
  // fake tensor (conv2d_ext/_ops.py) even where two formats' strides both
  // fit the sizes (one channel, 1 x 1 planes).
  at::Tensor result = at::empty(sizes, opts.memory_format(format));
  if (result.numel() == 0) return result;
  at::Tensor out = empty_output(sizes, opts, written);
  run(out);
  result.copy_(out);
  return result;
}

// launch(params, x, w, bias_or_undefined, y, nhwc). Where nhwc(params,
// dtype, channels_last result) says a channels_last kernel takes the call
// with operands of that dtype, x, w and y are channels_last (nhwc true);
// otherwise contiguous NCHW, float32 for 16-bit operands. `copies` false:
// an NCHW result never runs on channels_last copies (16-bit calls' float32
// copies: the plan weighed copies for the 16-bit call, and declined).
template <typename Nhwc, typename Launch>
at::Tensor fprop_entry(const at::Tensor& input, const at::Tensor& weight,
                       const c10::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                       Nhwc&& nhwc, Launch&& launch, bool copies = true) {
  const ConvParams p = make_fprop_params(input, weight, bias, stride, padding,
                                         dilation, groups);
  const bool has_bias = bias.has_value() && bias->defined();
  const c10::DeviceGuard guard(input.device());
  const at::MemoryFormat format = result_memory_format(input, weight);
  constexpr auto kCl = at::MemoryFormat::ChannelsLast, kNchw = at::MemoryFormat::Contiguous;
  const bool cl = (format == kCl || copies) && nhwc(p, input.scalar_type(), format == kCl);
  if (is_16bit(input.scalar_type()) && !cl) {
    const c10::optional<at::Tensor> bias32 =
        has_bias ? c10::optional<at::Tensor>(bias->to(at::kFloat)) : c10::nullopt;
    return fprop_entry(input.to(at::kFloat), weight.to(at::kFloat), bias32, stride, padding,
                       dilation, groups, nhwc, launch, /*copies=*/false)
        .to(input.scalar_type());
  }
  const at::Tensor b = has_bias ? bias->contiguous() : at::Tensor();
  const std::vector<int64_t> sizes{p.batch, p.out_channels, p.out_h, p.out_w};
  if (cl) {
    return result_written_in(sizes, input.options(), format, kCl, [&](at::Tensor& y) {
      launch(p, input.contiguous(kCl), weight.contiguous(kCl), b, y, true);
    });
  }
  return result_written_in(sizes, input.options(), format, kNchw, [&](at::Tensor& y) {
    launch(p, input.contiguous(), weight.contiguous(), b, y, false);
  });
}

// The same for a backend without channels_last kernels:
// launch(params, x, w, bias_or_undefined, y).
template <typename Launch>
at::Tensor fprop_entry(const at::Tensor& input, const at::Tensor& weight,
                       const c10::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                       Launch&& launch) {
  return fprop_entry(
      input, weight, bias, stride, padding, dilation, groups,
      [](const ConvParams&, at::ScalarType, bool) { return false; },
      [&](const ConvParams& p, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
          at::Tensor& y, bool) { launch(p, x, w, b, y); });
}

// launch(params, grad_output, w, grad_input, nhwc): as fprop_entry's, with
// grad_output and grad_input channels_last where nhwc (w as given).
template <typename Nhwc, typename Launch>
at::Tensor dgrad_entry(const at::Tensor& grad_output, const at::Tensor& weight,
                       c10::IntArrayRef input_size, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                       Nhwc&& nhwc, Launch&& launch, bool copies = true) {
  const ConvParams p = make_dgrad_params(grad_output, weight, input_size,
                                         stride, padding, dilation, groups);
  const c10::DeviceGuard guard(grad_output.device());
  const at::MemoryFormat format = result_memory_format(grad_output, weight);
  constexpr auto kCl = at::MemoryFormat::ChannelsLast, kNchw = at::MemoryFormat::Contiguous;
  const bool cl =
      (format == kCl || copies) && nhwc(p, grad_output.scalar_type(), format == kCl);
  if (is_16bit(grad_output.scalar_type()) && !cl) {
    return dgrad_entry(grad_output.to(at::kFloat), weight.to(at::kFloat), input_size, stride,
                       padding, dilation, groups, nhwc, launch, /*copies=*/false)
        .to(grad_output.scalar_type());
  }
  if (cl) {
    return result_written_in(input_size, grad_output.options(), format, kCl,
                             [&](at::Tensor& grad_in) {
      launch(p, grad_output.contiguous(kCl), weight, grad_in, true);
    });
  }
  return result_written_in(input_size, grad_output.options(), format, kNchw,
                           [&](at::Tensor& grad_in) {
    launch(p, grad_output.contiguous(), weight.contiguous(), grad_in, false);
  });
}

// launch(params, grad_output, w, grad_input), NCHW only.
template <typename Launch>
at::Tensor dgrad_entry(const at::Tensor& grad_output, const at::Tensor& weight,
                       c10::IntArrayRef input_size, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                       Launch&& launch) {
  return dgrad_entry(
      grad_output, weight, input_size, stride, padding, dilation, groups,
      [](const ConvParams&, at::ScalarType, bool) { return false; },
      [&](const ConvParams& p, const at::Tensor& go, const at::Tensor& w, at::Tensor& gi,
          bool) { launch(p, go, w, gi); });
}

// launch(params, grad_output, x, grad_weight, nhwc): as fprop_entry's,
// with all three channels_last where nhwc.
template <typename Nhwc, typename Launch>
at::Tensor wgrad_entry(const at::Tensor& grad_output, const at::Tensor& input,
                       c10::IntArrayRef weight_size, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                       Nhwc&& nhwc, Launch&& launch, bool copies = true) {
  const ConvParams p = make_wgrad_params(grad_output, input, weight_size,
                                         stride, padding, dilation, groups);
  const c10::DeviceGuard guard(grad_output.device());
  // The weight's own format is the autograd node's to match (autograd.cpp).
  const at::MemoryFormat format = result_memory_format(grad_output, input);
  constexpr auto kCl = at::MemoryFormat::ChannelsLast, kNchw = at::MemoryFormat::Contiguous;
  const bool cl = p.gemm_m() > 0 && (format == kCl || copies) &&
                  nhwc(p, grad_output.scalar_type(), format == kCl);
  if (is_16bit(grad_output.scalar_type()) && !cl) {
    return wgrad_entry(grad_output.to(at::kFloat), input.to(at::kFloat), weight_size, stride,
                       padding, dilation, groups, nhwc, launch, /*copies=*/false)
        .to(grad_output.scalar_type());
  }
  if (cl) {
    return result_written_in(weight_size, grad_output.options(), format, kCl,
                             [&](at::Tensor& grad_w) {
      launch(p, grad_output.contiguous(kCl), input.contiguous(kCl), grad_w, true);
    });
  }
  return result_written_in(weight_size, grad_output.options(), format, kNchw,
                           [&](at::Tensor& grad_w) {
    if (p.gemm_m() == 0) {
      grad_w.zero_();  // empty batch: nothing summed
    } else {
      launch(p, grad_output.contiguous(), input.contiguous(), grad_w, false);
    }
  });
}

// launch(params, grad_output, x, grad_weight), NCHW only.
template <typename Launch>
at::Tensor wgrad_entry(const at::Tensor& grad_output, const at::Tensor& input,
                       c10::IntArrayRef weight_size, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                       Launch&& launch) {
  return wgrad_entry(
      grad_output, input, weight_size, stride, padding, dilation, groups,
      [](const ConvParams&, at::ScalarType, bool) { return false; },
      [&](const ConvParams& p, const at::Tensor& go, const at::Tensor& x, at::Tensor& gw,
          bool) { launch(p, go, x, gw); });
}

}  // namespace conv2d_ext
