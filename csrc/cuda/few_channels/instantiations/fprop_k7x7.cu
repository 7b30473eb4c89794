// The few-channel forward for 7x7 kernels.
#include "../fprop.cuh"

namespace conv2d_ext {
namespace cuda {
namespace few_channels_fprop {

template void launch_size<7, 7>(const FpropArgs&, const conv2d_ext::few_channels::FpropVariant&);

}  // namespace few_channels_fprop
}  // namespace cuda
}  // namespace conv2d_ext
