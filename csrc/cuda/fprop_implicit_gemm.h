// Tensor-core implicit-GEMM forward (float32 only, sm_80 and newer), which
// also runs dgrad at unit stride: p = dgrad_as_fprop(layer), x =
// grad_output, w = the layer's weight read in WeightOrder::kDgrad, y =
// grad_input.
#pragma once

#include <ATen/core/Tensor.h>

#include "../conv_params.h"
#include "../plan.h"

namespace conv2d_ext {
namespace cuda {

// x, w contiguous float32; bias may be null. Chosen by choose_plan():
// wgmma (Algo::kImplicitGemmSm90) is the Hopper main loop.
void launch_fprop_implicit_gemm(const ConvParams& p, const at::Tensor& x,
                                const at::Tensor& w, const float* bias,
                                at::Tensor& y, MathMode math, bool wgmma,
                                WeightOrder order);

// Hopper forward with pixels as wgmma's N (Algo::kImplicitGemmSm90Flat: unit
// stride, TF32 or 3xTF32 by `math`; csrc/cuda/fprop_sm90_flat.cu).
void launch_fprop_sm90_flat(const ConvParams& p, const at::Tensor& x, const at::Tensor& w,
                            const float* bias, at::Tensor& y, MathMode math,
                            WeightOrder order);

}  // namespace cuda
}  // namespace conv2d_ext
