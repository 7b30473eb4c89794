// Launchers of the kernel families a build left out (setup.py's
// CONV2D_EXT_FAMILIES, a switch for fast iteration on one family). Each
// raises, naming its family: a call whose plan picks such a kernel fails
// with that message instead of the module failing to load on an undefined
// symbol. setup.py writes the CONV2D_EXT_WITHOUT_<FAMILY> macros into
// families_built.h (none for a full build) and says so with
// CONV2D_EXT_FAMILIES_HEADER; other builds (CMake's) are full ones, whatever
// header an earlier setup.py build left.
#include <c10/util/Exception.h>

#ifdef CONV2D_EXT_FAMILIES_HEADER
#include "families_built.h"
#endif

#include "direct/direct.h"
#include "few_channels/few_channels.h"
#include "implicit_gemm/implicit_gemm.h"
#include "nhwc/nhwc.h"
#include "sm90/sm90.h"

namespace conv2d_ext {
namespace cuda {
namespace {

[[maybe_unused]] [[noreturn]] void not_built(const char* family) {
  TORCH_CHECK(false, "conv2d_ext: this build left out the '", family,
              "' kernels (CONV2D_EXT_FAMILIES) and the plan chose one of them; rebuild with "
              "every family (CONV2D_EXT_FAMILIES unset)");
}

}  // namespace

#ifdef CONV2D_EXT_WITHOUT_DIRECT
void launch_fprop_direct(const ConvParams&, const at::TensorBase&, const at::TensorBase&,
                         const at::TensorBase&, at::TensorBase&) {
  not_built("direct");
}
void launch_dgrad_direct(const ConvParams&, const at::TensorBase&, const at::TensorBase&,
                         at::TensorBase&) {
  not_built("direct");
}
void launch_wgrad_direct(const ConvParams&, const at::TensorBase&, const at::TensorBase&,
                         at::TensorBase&) {
  not_built("direct");
}
#endif

#ifdef CONV2D_EXT_WITHOUT_FEW_CHANNELS
void launch_fprop_few_channels(const ConvParams&, const at::TensorBase&, const at::TensorBase&,
                               const float*, at::TensorBase&, WeightOrder) {
  not_built("few_channels");
}
void launch_dgrad_few_channels(const ConvParams&, const at::TensorBase&, const at::TensorBase&,
                               at::TensorBase&) {
  not_built("few_channels");
}
void launch_wgrad_few_channels(const ConvParams&, const at::TensorBase&, const at::TensorBase&,
                               at::TensorBase&) {
  not_built("few_channels");
}
void launch_fprop_few_channels_tc(const ConvParams&, const at::TensorBase&, const at::TensorBase&,
                                  const float*, at::TensorBase&, MathMode) {
  not_built("few_channels");
}
void launch_dgrad_few_channels_tc(const ConvParams&, const at::TensorBase&, const at::TensorBase&,
                                  at::TensorBase&) {
  not_built("few_channels");
}
void launch_wgrad_few_channels_tc(const ConvParams&, const at::TensorBase&, const at::TensorBase&,
                                  at::TensorBase&, MathMode) {
  not_built("few_channels");
}
#endif

#ifdef CONV2D_EXT_WITHOUT_IMPLICIT_GEMM
void launch_fprop_implicit_gemm(const ConvParams&, const at::TensorBase&, const at::TensorBase&,
                                const float*, at::TensorBase&, MathMode, bool, WeightOrder) {
  not_built("implicit_gemm");
}
void launch_wgrad_implicit_gemm(const ConvParams&, const at::TensorBase&, const at::TensorBase&,
                                at::TensorBase&, MathMode) {
  not_built("implicit_gemm");
}
#endif

#ifdef CONV2D_EXT_WITHOUT_NHWC
void launch_fprop_nhwc(const ConvParams&, const at::TensorBase&, const at::TensorBase&,
                       const at::TensorBase&, at::TensorBase&) {
  not_built("nhwc");
}
void launch_fprop_nhwc(const ConvParams&, const igemm_nhwc::OutMap&, const at::TensorBase&,
                       const at::TensorBase&, const at::TensorBase&, at::TensorBase&) {
  not_built("nhwc");
}
void launch_dgrad_nhwc_phases(const ConvParams&, const at::TensorBase&, const at::TensorBase&,
                              at::TensorBase&) {
  not_built("nhwc");
}
void launch_wgrad_nhwc(const ConvParams&, const at::TensorBase&, const at::TensorBase&,
                       at::TensorBase&) {
  not_built("nhwc");
}
at::TensorBase nhwc_dgrad_weight(const at::TensorBase&) { not_built("nhwc"); }
#endif

#ifdef CONV2D_EXT_WITHOUT_SM90
void launch_fprop_sm90_flat(const ConvParams&, const at::TensorBase&, const at::TensorBase&,
                            const float*, at::TensorBase&, MathMode, WeightOrder) {
  not_built("sm90");
}
void launch_wgrad_sm90(const ConvParams&, const at::TensorBase&, const at::TensorBase&,
                       at::TensorBase&, MathMode) {
  not_built("sm90");
}
#endif

}  // namespace cuda
}  // namespace conv2d_ext
