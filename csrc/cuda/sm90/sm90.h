// The Hopper-only kernels (sm_90a code: wgmma and the tensor-copy engine),
// float32, unit stride. Tiles: config.h.
#pragma once

#include <ATen/core/TensorBase.h>

#include "../../conv_params.h"
#include "../../plan.h"

namespace conv2d_ext {
namespace cuda {

// Forward with pixels as wgmma's N (Algo::kImplicitGemmSm90Flat), which
// also runs dgrad at unit stride as implicit_gemm.h's forward does. TF32 or
// 3xTF32 by `math`; bias may be null.
void launch_fprop_sm90_flat(const ConvParams& p, const at::TensorBase& x, const at::TensorBase& w,
                            const float* bias, at::TensorBase& y, MathMode math, WeightOrder order);

// wgrad (Algo::kImplicitGemmSm90 for Pass::kWgrad).
void launch_wgrad_sm90(const ConvParams& p, const at::TensorBase& grad_out, const at::TensorBase& x,
                       at::TensorBase& grad_w, MathMode math);

}  // namespace cuda
}  // namespace conv2d_ext
