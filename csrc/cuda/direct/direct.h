// The direct FFMA kernels (Algo::kDirect): every dtype, every shape, every
// GPU; the plan's answer wherever no faster family takes a problem.
#pragma once

#include <ATen/core/Tensor.h>

#include "../../conv_params.h"

namespace conv2d_ext {
namespace cuda {

// y = conv(x, w) + b; b may be undefined.
void launch_fprop_direct(const ConvParams& p, const at::Tensor& x, const at::Tensor& w,
                         const at::Tensor& b, at::Tensor& y);

void launch_dgrad_direct(const ConvParams& p, const at::Tensor& grad_out, const at::Tensor& w,
                         at::Tensor& grad_in);

void launch_wgrad_direct(const ConvParams& p, const at::Tensor& grad_out, const at::Tensor& x,
                         at::Tensor& grad_w);

}  // namespace cuda
}  // namespace conv2d_ext
