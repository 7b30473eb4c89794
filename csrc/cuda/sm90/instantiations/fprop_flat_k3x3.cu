// The flat sm_90 forward for 3x3 kernels.
#include "../fprop_flat.cuh"

namespace conv2d_ext {
namespace cuda {

template void launch_flat_kernel<3, 3>(const FlatLaunch&);

}  // namespace cuda
}  // namespace conv2d_ext
