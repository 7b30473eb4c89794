// The few-channel gather dgrad for every other kernel size (and specialised sizes whose halo passes the fixed pitch), 2 input channels per group.
#include "../dgrad.cuh"

namespace conv2d_ext {
namespace cuda {
namespace few_channels_dgrad {

template void launch<0, 0, 2>(const ConvParams&, const at::TensorBase&, const float*, float*, bool);

}  // namespace few_channels_dgrad
}  // namespace cuda
}  // namespace conv2d_ext
