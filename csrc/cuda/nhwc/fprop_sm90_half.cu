// The wgmma forward (fprop_sm90.cuh) for __half operands.
#include "fprop_sm90.cuh"

namespace conv2d_ext {
namespace cuda {

using E = __half;
template void launch_fprop_nhwc_wgmma<E>(const ConvParams&, const igemm_nhwc::OutMap&,
                                         const E*, const E*, const E*, E*,
                                         const igemm_nhwc::FpropKernel&);

}  // namespace cuda
}  // namespace conv2d_ext
