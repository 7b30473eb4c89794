// Autocast for the forward op, as aten's convolutions have it: under
// torch.autocast the operands are cast to the autocast dtype (float16 or
// bfloat16; float64 left alone), which is what the original nn.Conv2d
// computes in that region (its ops are on autocast's lower-precision
// list). The gradient ops need none: autograd calls them with the dtypes
// the forward saw.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include <optional>

namespace conv2d_ext {
namespace {

using c10::SymInt;
using c10::SymIntArrayRef;
using FpropSig = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            SymIntArrayRef, SymIntArrayRef, SymIntArrayRef, SymInt);

template <c10::DeviceType kDevice>
at::Tensor conv2d_autocast(const at::Tensor& input, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, SymIntArrayRef stride,
                           SymIntArrayRef padding, SymIntArrayRef dilation, SymInt groups) {
  static const auto fprop = c10::Dispatcher::singleton()
                                .findSchemaOrThrow("conv2d_ext::conv2d", "")
                                .typed<FpropSig>();
  c10::impl::ExcludeDispatchKeyGuard no_autocast(
      at::autocast::get_autocast_dispatch_key_from_device_type(kDevice));
  const at::ScalarType to = at::autocast::get_lower_precision_fp_from_device_type(kDevice);
  return fprop.call(at::autocast::cached_cast(to, input, kDevice),
                    at::autocast::cached_cast(to, weight, kDevice),
                    at::autocast::cached_cast(to, bias, kDevice), stride, padding, dilation,
                    std::move(groups));
}

}  // namespace
}  // namespace conv2d_ext

TORCH_LIBRARY_IMPL(conv2d_ext, AutocastCUDA, m) {
  m.impl("conv2d", &conv2d_ext::conv2d_autocast<c10::DeviceType::CUDA>);
}

TORCH_LIBRARY_IMPL(conv2d_ext, AutocastCPU, m) {
  m.impl("conv2d", &conv2d_ext::conv2d_autocast<c10::DeviceType::CPU>);
}
