// The few-channel gather dgrad for 5x5 kernels.
#include "../dgrad.cuh"

namespace conv2d_ext {
namespace cuda {
namespace few_channels_dgrad {

template void launch_size<5, 5>(const ConvParams&, const at::Tensor&, const float*, float*,
                                  bool);

}  // namespace few_channels_dgrad
}  // namespace cuda
}  // namespace conv2d_ext
