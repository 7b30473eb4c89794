// The flat sm_90 forward's launch of one kernel size, between the host
// code (fprop_flat.cu) and the kernel's instantiations, one file per size
// (instantiations/fprop_flat_*.cu) so that the build compiles them in
// parallel.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "../../conv_params.h"
#include "config.h"

namespace conv2d_ext {
namespace cuda {

// What a launch needs once the host code has chosen the layout, copied the
// weights into tiles and made the input's tensor map.
struct FlatLaunch {
  CUtensorMap x_map;
  ConvParams p;
  igemm_fprop_sm90_flat::Layout L;
  igemm_fprop_sm90_flat::Variant v;
  const float* w_tiles;
  const float* bias;
  float* y;
  unsigned grid;  // persistent blocks
  cudaStream_t stream;
};

// The kernel of (KH, KW) (0, 0: the generic one) in the variant and row
// shifts `a` names; defined in fprop_flat.cuh.
template <int KH, int KW>
void launch_flat_kernel(const FlatLaunch& a);

}  // namespace cuda
}  // namespace conv2d_ext
