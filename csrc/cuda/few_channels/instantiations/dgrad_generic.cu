// The few-channel gather dgrad for every other kernel size (and the specialised sizes whose halo is wider than the fixed pitch).
#include "../dgrad.cuh"

namespace conv2d_ext {
namespace cuda {
namespace few_channels_dgrad {

template void launch_size<0, 0>(const ConvParams&, const at::Tensor&, const float*, float*,
                                  bool);

}  // namespace few_channels_dgrad
}  // namespace cuda
}  // namespace conv2d_ext
