// The Hopper-only kernels (sm_90a code: wgmma and the tensor-copy engine),
// float32, unit stride. Tiles: config.h.
#pragma once

#include <ATen/core/Tensor.h>

#include "../../conv_params.h"
#include "../../plan.h"

namespace conv2d_ext {
namespace cuda {

// Forward with pixels as wgmma's N (Algo::kImplicitGemmSm90Flat), which
// also runs dgrad at unit stride as implicit_gemm.h's forward does. TF32 or
// 3xTF32 by `math`; bias may be null.
void launch_fprop_sm90_flat(const ConvParams& p, const at::Tensor& x, const at::Tensor& w,
                            const float* bias, at::Tensor& y, MathMode math,
                            WeightOrder order);

// wgrad (Algo::kImplicitGemmSm90 for Pass::kWgrad).
void launch_wgrad_sm90(const ConvParams& p, const at::Tensor& grad_out, const at::Tensor& x,
                       at::Tensor& grad_w, MathMode math);

}  // namespace cuda
}  // namespace conv2d_ext
