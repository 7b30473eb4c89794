// The channels_last implicit-GEMM engine (float32, sm_80 and newer, TF32
// mode): operands and results in NHWC, the GEMM over the whole batch.
// Tiles: config.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "../../conv_params.h"

namespace conv2d_ext {
namespace cuda {

// y = conv(x, w) + bias: x and y channels_last, w as [N][R][S][C]
// contiguous (a channels_last weight's memory), bias null or [N]. Also
// dgrad at unit stride: p = dgrad_as_fprop(layer), x = grad_output, w =
// the layer's weight flipped and transposed (nhwc_dgrad_weight).
void launch_fprop_nhwc(const ConvParams& p, const at::Tensor& x, const at::Tensor& w_nrsc,
                       const float* bias, at::Tensor& y);

// grad_w of a channels_last layer: grad_out, x and grad_w channels_last
// (grad_w's memory [K][R][S][C]); split over the pixels where tiles are
// few, reduced in a fixed order.
void launch_wgrad_nhwc(const ConvParams& p, const at::Tensor& grad_out, const at::Tensor& x,
                       at::Tensor& grad_w);

// `t` itself where its data starts 16-byte aligned (the engine's 16-byte
// copies need it), else a copy in `format`.
inline at::Tensor aligned_16(const at::Tensor& t, at::MemoryFormat format) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 ? t : t.clone(format);
}

// The layer's weight [K][C][R][S] as the forward weight of its unit-stride
// dgrad: [C][R][S][K], taps flipped.
at::Tensor nhwc_dgrad_weight(const at::Tensor& w);

}  // namespace cuda
}  // namespace conv2d_ext
