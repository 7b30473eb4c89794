// The direct FFMA kernels (Algo::kDirect): every dtype, every shape, every
// GPU; the plan's answer wherever no faster family takes a problem.
#pragma once

#include <ATen/core/TensorBase.h>

#include "../../conv_params.h"

namespace conv2d_ext {
namespace cuda {

// y = conv(x, w) + b; b may be undefined.
void launch_fprop_direct(const ConvParams& p, const at::TensorBase& x, const at::TensorBase& w,
                         const at::TensorBase& b, at::TensorBase& y);

void launch_dgrad_direct(const ConvParams& p, const at::TensorBase& grad_out,
                         const at::TensorBase& w, at::TensorBase& grad_in);

void launch_wgrad_direct(const ConvParams& p, const at::TensorBase& grad_out,
                         const at::TensorBase& x, at::TensorBase& grad_w);

}  // namespace cuda
}  // namespace conv2d_ext
