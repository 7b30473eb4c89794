// Tensor-core implicit-GEMM wgrad (float32 only, sm_80 and newer).
#pragma once

#include <ATen/core/Tensor.h>

#include "../conv_params.h"
#include "../plan.h"

namespace conv2d_ext {
namespace cuda {

// grad_output, x contiguous float32; grad_w [Cout][Cin/g][KH][KW]. Chosen
// by choose_plan() (Algo::kImplicitGemm for Pass::kWgrad).
void launch_wgrad_implicit_gemm(const ConvParams& p, const at::Tensor& grad_out,
                                const at::Tensor& x, at::Tensor& grad_w, MathMode math);

// The same on Hopper's wgmma (wgrad_sm90.cu; Algo::kImplicitGemmSm90 for
// Pass::kWgrad): unit stride, sm_90a code.
void launch_wgrad_sm90(const ConvParams& p, const at::Tensor& grad_out, const at::Tensor& x,
                       at::Tensor& grad_w, MathMode math);

}  // namespace cuda
}  // namespace conv2d_ext
