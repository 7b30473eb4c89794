// The few-input-channel family (Algo::kFewChannels, and
// Algo::kFewChannelsTensorCore for its tensor-core kernels): at most 4
// input channels per group (depthwise layers, RGB stems), float32, sm_80
// and newer (they stage tiles with cp.async). Tiles and fits(): config.h.
#pragma once

#include <ATen/core/TensorBase.h>

#include "../../conv_params.h"
#include "../../plan.h"

namespace conv2d_ext {
namespace cuda {

// Forward, or dgrad at unit stride as a forward (p = dgrad_as_fprop(layer),
// x = grad_output, w = the layer's weight read in WeightOrder::kDgrad).
// bias may be null.
void launch_fprop_few_channels(const ConvParams& p, const at::TensorBase& x,
                               const at::TensorBase& w, const float* bias, at::TensorBase& y,
                               WeightOrder order);

// dgrad at any stride: each block gathers one stride phase of grad_input.
void launch_dgrad_few_channels(const ConvParams& p, const at::TensorBase& grad_out,
                               const at::TensorBase& w, at::TensorBase& grad_in);

// wgrad, reduced over split slices of the output pixels in a fixed order.
void launch_wgrad_few_channels(const ConvParams& p, const at::TensorBase& grad_out,
                               const at::TensorBase& x, at::TensorBase& grad_w);

// Forward of wide tiles (at least few_channels::kFpropTcMinCo output
// channels per group) on TF32 tensor cores: TF32, or 3xTF32 in IEEE mode
// (Algo::kFewChannelsTensorCore). bias may be null.
void launch_fprop_few_channels_tc(const ConvParams& p, const at::TensorBase& x,
                                  const at::TensorBase& w, const float* bias, at::TensorBase& y,
                                  MathMode math);

// dgrad of every stride phase at once on TF32 tensor cores, TF32 mode
// only, where the phases and input channels fill half an m16 tile or more
// (RGB stems at stride 2; few_channels::dgrad_tc_fits;
// Algo::kFewChannelsTensorCore).
void launch_dgrad_few_channels_tc(const ConvParams& p, const at::TensorBase& grad_out,
                                  const at::TensorBase& w, at::TensorBase& grad_in);

// wgrad of wide tiles (more than 4 output channels per group) on TF32
// tensor cores: TF32, or 3xTF32 in IEEE mode (Algo::kFewChannelsTensorCore).
void launch_wgrad_few_channels_tc(const ConvParams& p, const at::TensorBase& grad_out,
                                  const at::TensorBase& x, at::TensorBase& grad_w, MathMode math);

}  // namespace cuda
}  // namespace conv2d_ext
