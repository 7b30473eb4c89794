// The forward's kernel choice and launch, shared by the forward op and by
// strided dgrad, whose phases are forwards over grad_output.
#pragma once

#include <ATen/core/Tensor.h>

#include "../conv_params.h"

namespace conv2d_ext {
namespace cuda {

// y = conv(x, w) + b (b may be undefined) on the kernel the plan picks for
// `p`; x, w, b contiguous, y contiguous and allocated; with `nhwc`, x, w
// and y channels_last instead, for the channels_last engine (which the
// plan must then pick).
void launch_fprop(const ConvParams& p, const at::Tensor& x, const at::Tensor& w,
                  const at::Tensor& b, at::Tensor& y, bool nhwc = false);

}  // namespace cuda
}  // namespace conv2d_ext
