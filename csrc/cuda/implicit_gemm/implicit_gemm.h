// The mma.sync implicit-GEMM kernels (float32 only, sm_80 and newer; the
// forward also has a wgmma main loop on Hopper). Tiles: config.h.
#pragma once

#include <ATen/core/TensorBase.h>

#include "../../conv_params.h"
#include "../../plan.h"

namespace conv2d_ext {
namespace cuda {

// Forward, which also runs dgrad at unit stride: p = dgrad_as_fprop(layer),
// x = grad_output, w = the layer's weight read in WeightOrder::kDgrad, y =
// grad_input. x, w contiguous float32; bias may be null. `sm90` picks the
// wgmma main loop (Algo::kImplicitGemmSm90), else mma.sync
// (Algo::kImplicitGemm).
void launch_fprop_implicit_gemm(const ConvParams& p, const at::TensorBase& x,
                                const at::TensorBase& w, const float* bias, at::TensorBase& y,
                                MathMode math, bool sm90, WeightOrder order);

// wgrad: grad_output, x contiguous float32; grad_w [Cout][Cin/g][KH][KW]
// (Algo::kImplicitGemm for Pass::kWgrad).
void launch_wgrad_implicit_gemm(const ConvParams& p, const at::TensorBase& grad_out,
                                const at::TensorBase& x, at::TensorBase& grad_w, MathMode math);

}  // namespace cuda
}  // namespace conv2d_ext
