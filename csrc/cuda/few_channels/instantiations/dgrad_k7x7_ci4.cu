// The few-channel gather dgrad for 7x7 kernels, 4 input channels per group.
#include "../dgrad.cuh"

namespace conv2d_ext {
namespace cuda {
namespace few_channels_dgrad {

template void launch<7, 7, 4>(const ConvParams&, const at::TensorBase&, const float*, float*, bool);

}  // namespace few_channels_dgrad
}  // namespace cuda
}  // namespace conv2d_ext
