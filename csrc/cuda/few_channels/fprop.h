// The few-channel forward's launch of one kernel size, between the host
// code (fprop.cu) and the kernel's instantiations, one file per size
// (instantiations/fprop_*.cu) so that the build compiles them in parallel.
#pragma once

#include <cuda.h>

#include "../../conv_params.h"
#include "../../plan.h"
#include "config.h"

namespace conv2d_ext {
namespace cuda {
namespace few_channels_fprop {

// The forward's operands, as every launch passes them on.
struct FpropArgs {
  const ConvParams& p;
  const CUtensorMap& x_map;
  const float* x;
  const float* w;
  const float* bias;
  float* y;
  WeightOrder order;
  bool vec, tma;
};

// The kernels of (KH, KW) (0, 0: the generic ones) in the variant `v`
// names; defined in fprop.cuh.
template <int KH, int KW>
void launch_size(const FpropArgs& a, const conv2d_ext::few_channels::FpropVariant& v);

}  // namespace few_channels_fprop
}  // namespace cuda
}  // namespace conv2d_ext
