// Every kernel-size specialisation of the CUDA passes, in one list.
//
// A specialised instantiation knows (KH, KW) at compile time, so its tap
// loops unroll and its register tiles are sized exactly; every other size
// runs the generic instantiation (0, 0), which reads them from ConvParams.
#pragma once

#include <cstdint>
#include <type_traits>

#define CONV2D_EXT_FOR_EACH_KERNEL_SIZE(X) \
  X(1, 1)                                  \
  X(3, 3)                                  \
  X(5, 9)                                  \
  X(7, 7)

// The direct kernels for few input channels per group (depthwise layers,
// RGB stems) are specialised for the common depthwise and RGB sizes instead.
#define CONV2D_EXT_FOR_EACH_FEW_CHANNELS_KERNEL_SIZE(X) \
  X(3, 3)                                                \
  X(3, 5)                                                \
  X(5, 5)                                                \
  X(7, 7)

namespace conv2d_ext {
namespace cuda {

template <int V>
using Int = std::integral_constant<int, V>;

// Calls fn(Int<H>{}, Int<W>{}) and returns when the size matches; the one
// comparison both dispatchers below expand over their lists.
#define CONV2D_EXT_TRY_SIZE(H, W)           \
  if (kernel_h == (H) && kernel_w == (W)) { \
    fn(Int<H>{}, Int<W>{});                 \
    return;                                 \
  }

// Calls fn(Int<KH>{}, Int<KW>{}) with the matching specialisation, or with
// Int<0>{} twice for the generic kernel. float64 always takes the generic
// path: it exists for gradcheck, not for speed, and this halves build time.
template <typename Fn>
void dispatch_kernel_size(int64_t kernel_h, int64_t kernel_w,
                          bool specialise, Fn&& fn) {
  if (specialise) {
    CONV2D_EXT_FOR_EACH_KERNEL_SIZE(CONV2D_EXT_TRY_SIZE)
  }
  fn(Int<0>{}, Int<0>{});
}

// Whether (kernel_h, kernel_w) is on the few-channel list.
inline bool few_channels_kernel_size(int64_t kernel_h, int64_t kernel_w) {
#define CONV2D_EXT_IS_SIZE(H, W) \
  if (kernel_h == (H) && kernel_w == (W)) return true;
  CONV2D_EXT_FOR_EACH_FEW_CHANNELS_KERNEL_SIZE(CONV2D_EXT_IS_SIZE)
#undef CONV2D_EXT_IS_SIZE
  return false;
}

// The same over the few-channel list (float32 only).
template <typename Fn>
void dispatch_few_channels_kernel_size(int64_t kernel_h, int64_t kernel_w, Fn&& fn) {
  CONV2D_EXT_FOR_EACH_FEW_CHANNELS_KERNEL_SIZE(CONV2D_EXT_TRY_SIZE)
  fn(Int<0>{}, Int<0>{});
}

#undef CONV2D_EXT_TRY_SIZE

}  // namespace cuda
}  // namespace conv2d_ext
