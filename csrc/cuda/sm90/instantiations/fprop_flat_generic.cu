// The flat sm_90 forward for the generic kernel (sizes read from ConvParams).
#include "../fprop_flat.cuh"

namespace conv2d_ext {
namespace cuda {

template void launch_flat_kernel<0, 0>(const FlatLaunch&);

}  // namespace cuda
}  // namespace conv2d_ext
