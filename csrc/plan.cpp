#include "plan.h"

#include "cuda/few_channels/config.h"
#include "cuda/kernel_sizes.cuh"
#include "cpu/blocked.h"
#include "cpu/few_pixels.h"
#include "cpu/grouped.h"
#include "cuda/nhwc/config.h"
#include "cuda/implicit_gemm/config.h"
#include "cuda/sm90/config.h"

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <optional>
#include <sstream>
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#else
#include <torch/version.h>
#endif

namespace conv2d_ext {

// sm_90a code runs on compute capability 9.0 only; other GPUs get the
// mma.sync loops (sm_80 and newer).
bool hopper_kernels(int sm) {
  return sm == 90 && built_with_sm90a() && option(Option::kHopperKernels);
}

bool few_channels_wgrad_sm90(int sm) {
  return hopper_kernels(sm) && option(Option::kFewChannelsWgradSm90);
}

bool nhwc_wgmma(int sm) { return hopper_kernels(sm) && option(Option::kNhwcWgmma); }

bool nhwc_split_k(int sm) { return nhwc_wgmma(sm) && option(Option::kNhwcSplitK); }

bool nhwc_wide_tiles(int sm) { return nhwc_wgmma(sm) && option(Option::kNhwcWideTiles); }

bool nhwc_tf32x3(int sm) { return nhwc_wgmma(sm) && option(Option::kNhwcIeee); }

bool allow_tf32_conv() {
  // Since the per-operator precision API, asking without an operator throws
  // when conv and RNN flags differ; ask for convolutions explicitly.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 10)
  return at::globalContext().allowTF32CuDNN(at::Float32Op::CONV);
#else
  return at::globalContext().allowTF32CuDNN();
#endif
}

MathMode math_mode(at::ScalarType dtype) {
  return ((dtype == at::kFloat || is_16bit(dtype)) && allow_tf32_conv()) ? MathMode::kTF32
                                                    : MathMode::kIEEE;
}

namespace {

// The kernel and stride facts several rules below ask.
bool one_by_one(const ConvParams& p) { return p.kernel_h == 1 && p.kernel_w == 1; }
bool strided(const ConvParams& p) { return p.stride_h > 1 || p.stride_w > 1; }

// Tensor cores need a K step of 8 input channels and pay off from 8 output
// channels per group; fewer channels per group (depthwise, RGB stems) stay
// on the direct kernels, which are FP32-accurate in both modes.
bool tensor_core_channels(const ConvParams& p) {
  return p.in_channels_per_group() >= 8 && p.out_channels_per_group() >= 8;
}

// IEEE mode: 3xTF32 splits each operand into two TF32 parts and drops
// small*small, which leaves an error floor however short the reduction,
// while FP32 is exact per product: cuDNN's strict FP32 on a short wgrad
// reduction is below that floor. So a wgrad reduction of fewer than
// kShortWgradReduction products per weight (N*Ho*Wo) runs on FFMA: the
// direct kernel, whose short per-thread sums and fixed-order tree stay
// below cuDNN there, or for channels_last results the engine's FFMA wgrad
// (nhwc_ieee_wgrad), whose sums in runs do too. An FP32 sum's error, growing as sqrt(K) from cuDNN's on
// short reductions, reaches the 3xTF32 floor below kShortWgradReduction,
// which leaves a margin (docs/kernels.md, "Precision: what every kernel
// shares").
constexpr int64_t kShortWgradReduction = 8192;
bool short_wgrad(const ConvParams& p) {
  return option(Option::kShortWgradDirect) &&
         p.batch * p.out_h * p.out_w < kShortWgradReduction;
}

// The forward's choice among its kernels; kDirect when no tensor-core
// kernel takes the problem.
Algo fprop_algo(const ConvParams& p, MathMode math, int sm) {
  if (!tensor_core_channels(p)) return Algo::kDirect;
  const bool tf32x3 = math == MathMode::kIEEE;  // 3xTF32
  const bool hopper = hopper_kernels(sm);
  // The flat kernel (pixels as wgmma's N) is the faster one at unit stride.
  if (hopper && option(Option::kFlatKernels) &&
      igemm_fprop_sm90_flat::fits(p, tf32x3)) {
    return Algo::kImplicitGemmSm90Flat;
  }
  if (hopper && igemm_fprop::fits(p, /*sm90=*/true, tf32x3)) return Algo::kImplicitGemmSm90;
  if (sm >= 80 && igemm_fprop::fits(p, /*sm90=*/false, /*tf32x3=*/false)) {
    return Algo::kImplicitGemm;
  }
  return Algo::kDirect;
}

// Few input channels per group: the few-channel kernels when their tiles
// fit (kDirect otherwise). They stage tiles with cp.async (sm_80+).
Algo few_channels_algo(const ConvParams& p, Pass pass, MathMode math, int sm) {
  namespace fc = few_channels;
  if (sm < 80 || p.in_channels_per_group() > fc::kMaxChannels) return Algo::kDirect;
  // wgrad of wide tiles (RGB stems) is a GEMM of few bytes per product:
  // the FFMA kernel stayed far below the FFMA peak, itself well under the
  // tensor cores' (docs/kernels.md, "Few channels on tensor cores"). IEEE mode
  // keeps short reductions on FFMA, as above.
  if (pass == Pass::kWgrad && fc::wgrad_tc_fits(p, math == MathMode::kIEEE) &&
      !(math == MathMode::kIEEE && short_wgrad(p))) {
    return Algo::kFewChannelsTensorCore;
  }
  // TF32-mode dgrad of every stride phase at once (RGB stems at stride 2):
  // the FFMA gather stays well below the FFMA peak. 3xTF32 (on this
  // kernel, and on wgmma) was slower than the gather and, on wgmma, less
  // accurate than cuDNN's strict FP32: IEEE mode keeps the gather.
  if (pass == Pass::kDgrad && math == MathMode::kTF32 &&
      option(Option::kFewChannelsDgradTc) && fc::dgrad_tc_fits(p)) {
    return Algo::kFewChannelsTensorCore;
  }
  // The forward of wide tiles likewise: the FFMA kernel is issue-bound well
  // below the FFMA peak, on a GEMM whose floor is writing its output.
  if (pass == Pass::kFprop && fc::fprop_tc_fits(p, math == MathMode::kIEEE, sm)) {
    return Algo::kFewChannelsTensorCore;
  }
  const bool fits = pass == Pass::kFprop   ? fc::fprop_fits(p)
                    : pass == Pass::kDgrad ? fc::dgrad_runs_as_fprop(p) || fc::dgrad_fits(p)
                                           : fc::wgrad_fits(p, sm);
  if (!fits) return Algo::kDirect;
  return Algo::kFewChannels;
}

// The channels_last engine, for a channels_last call: TF32 mode, the
// forward, dgrad (at unit stride its forward over grad_output, at larger
// strides one forward per phase) and wgrad.
// On Hopper, forwards of at most kNhwcFlatMaxChannels input or output
// channels that the flat sm_90 kernel takes run faster there, on NCHW
// copies, than on the engine: its K tiles and 64-channel N tiles run part
// empty (docs/kernels.md, "The channels_last engine"; measured against the
// engine's mma.sync, before its wgmma forward).
constexpr int64_t kNhwcFlatMaxChannels = 32;
bool nhwc_fprop(const ConvParams& p, int sm, bool tf32x3 = false) {
  if (!igemm_nhwc::fits(p)) return false;
  return !(hopper_kernels(sm) && option(Option::kFlatKernels) &&
           std::min(p.in_channels, p.out_channels) <= kNhwcFlatMaxChannels &&
           igemm_fprop_sm90_flat::fits(p, tf32x3));
}
// wgrad likewise: the engine's N tile is one tap's input channels, so it
// reads both operands once per tap, where the sm_90 wgrad reads them once;
// with few channels and many taps that traffic dominates.
bool nhwc_wgrad(const ConvParams& p, int sm) {
  if (!option(Option::kNhwcWgrad) || !igemm_nhwc::wgrad_fits(p)) return false;
  return !(hopper_kernels(sm) &&
           std::min(p.in_channels, p.out_channels) <= kNhwcFlatMaxChannels &&
           igemm_wgrad_sm90::fits(p, false));
}
// 16-bit operands natively, in either precision flag's mode (16-bit
// products are exact in float32): wgrad on m16n8k16 MMAs (sm_80+) where
// the float32 engine's wgrad would run; the forward and dgrad (the forward
// over grad_output, or its stride phases) on the wgmma forward. Its K
// tiles hold 64 channels; over at most 32 they run half empty, and the
// float32 kernels' full 32-channel tiles on copies run faster there.
bool nhwc_engine_16bit(const ConvParams& p, Pass pass, int sm) {
  if (!option(Option::kNhwcKernels) || !option(Option::kNhwc16Bit) || sm < 80) return false;
  if (pass == Pass::kWgrad) return igemm_nhwc::wgrad_fits(p, 2) && nhwc_wgrad(p, sm);
  if (!nhwc_wgmma(sm)) return false;
  const ConvParams f = pass == Pass::kFprop ? p : dgrad_as_fprop(p);
  if (f.in_channels <= igemm_nhwc::kBlockK) return false;
  if (pass == Pass::kDgrad && !dgrad_is_fprop(p)) return igemm_nhwc::dgrad_phases_fit(p, 2);
  return igemm_nhwc::fits(f, 2);
}
// IEEE mode's short wgrad reductions (short_wgrad: 3xTF32 errs more than
// cuDNN's FP32 there) on the engine's FFMA wgrad, where the option asks;
// else the direct kernel's. Below kFfmaMinReduction products a weight the
// FFMA wgrad's two-level sums come within a few percent of cuDNN's error
// (both near the rounding of the result alone), and the direct kernel's
// tree stays below it; such layers take microseconds either way.
constexpr int64_t kFfmaMinReduction = 256;
bool nhwc_ieee_wgrad(const ConvParams& p) {
  return option(Option::kNhwcWgrad) && option(Option::kNhwcIeeeWgrad) && short_wgrad(p) &&
         p.gemm_m() >= kFfmaMinReduction && igemm_nhwc::wgrad_fits(p);
}
// IEEE mode's forward and dgrad take the engine's wgmma forward in 3xTF32
// where the option asks (nhwc_tf32x3), as TF32 mode's would.
bool nhwc_engine(const ConvParams& p, Pass pass, MathMode math, int sm) {
  if (!option(Option::kNhwcKernels) || sm < 80) return false;
  const bool tf32x3 = math == MathMode::kIEEE;
  if (tf32x3) {
    if (pass == Pass::kWgrad) return nhwc_ieee_wgrad(p);
    if (!nhwc_tf32x3(sm)) return false;
  }
  if (pass == Pass::kFprop) return nhwc_fprop(p, sm, tf32x3);
  if (pass == Pass::kDgrad) {
    return dgrad_is_fprop(p) ? nhwc_fprop(dgrad_as_fprop(p), sm, tf32x3)
                             : igemm_nhwc::dgrad_phases_fit(p);
  }
  return nhwc_wgrad(p, sm);
}

}  // namespace

Plan choose_plan(const ConvParams& p, Pass pass, at::ScalarType dtype, int sm,
                 bool channels_last) {
  // 16-bit operands run the float32 kernels on float32 copies (pass_entry.h),
  // but where the engine reads them natively.
  if (is_16bit(dtype)) {
    if (sm != 0 && channels_last && nhwc_engine_16bit(p, pass, sm)) {
      return {Algo::kImplicitGemmNhwc, math_mode(dtype), /*native_16bit=*/true};
    }
    dtype = at::kFloat;
  }
  Plan plan;
  plan.math = math_mode(dtype);
  plan.algo = Algo::kDirect;
  if (dtype != at::kFloat) return plan;
  if (sm == 0) {  // the CPU: every pass; dgrad as forwards (one per stride phase)
    if (cpu::few_pixels_fits(p)) {
      plan.algo = Algo::kCpuFewPixels;
      return plan;
    }
    // dgrad runs forwards at unit stride (one per phase where the layer's
    // is larger) with dgrad_as_fprop(p)'s channels and groups.
    ConvParams f = p;
    if (pass == Pass::kDgrad) {
      f = dgrad_as_fprop(p);
      f.stride_h = f.stride_w = 1;
    }
    // channels_last grouped layers of a few channels a group: several
    // groups a vector (wgrad with the kernel widths it is compiled for).
    if (channels_last && (pass == Pass::kWgrad ? cpu::grouped_wgrad_nhwc_fits(p)
                                               : cpu::grouped_nhwc_fits(f))) {
      plan.algo = Algo::kCpuGrouped;
      return plan;
    }
    // Strided depthwise dgrad: kernels of its own, over channels_last
    // operands at any stride, over NCHW ones at column stride 2; else the
    // direct loop (which beat the phases' forwards).
    const bool depthwise =
        cpu::depthwise_fits(f) &&
        (pass != Pass::kDgrad || dgrad_is_fprop(p) ||
         (channels_last ? cpu::depthwise_nhwc_fits(f) : cpu::depthwise_dgrad_s2_fits(p)));
    // (Depthwise dgrad would fill a quarter of the narrow kernel's
    // channels.)
    const bool depthwise_layer = p.in_channels_per_group() == 1 && p.groups > 1;
    if (depthwise) {
      plan.algo = Algo::kCpuDepthwise;
    } else if (cpu::blocked_fits(f)) {
      plan.algo = Algo::kCpuBlocked;
    } else if ((pass == Pass::kWgrad || cpu::narrow_fits(f)) &&
               !(pass == Pass::kDgrad && depthwise_layer)) {  // (wgrad: any stride)
      plan.algo = Algo::kCpuNarrow;
    }
    return plan;
  }
  const Algo small = few_channels_algo(p, pass, plan.math, sm);
  if (small != Algo::kDirect) {
    plan.algo = small;
    return plan;
  }
  if (channels_last && nhwc_engine(p, pass, plan.math, sm)) {
    plan.algo = Algo::kImplicitGemmNhwc;
    return plan;
  }
  if (pass == Pass::kFprop) {
    plan.algo = fprop_algo(p, plan.math, sm);
  } else if (pass == Pass::kDgrad && dgrad_is_fprop(p)) {
    // The forward kernels run dgrad_as_fprop(p); kDirect here means the
    // direct dgrad kernel, not the forward one.
    plan.algo = fprop_algo(dgrad_as_fprop(p), plan.math, sm);
  } else if (pass == Pass::kDgrad && sm >= 80 && tensor_core_channels(p) && strided(p)) {
    plan.algo = Algo::kDgradPhases;
  } else if (pass == Pass::kWgrad && sm >= 80 && tensor_core_channels(p) &&
             !(plan.math == MathMode::kIEEE && short_wgrad(p))) {
    const bool tf32x3 = plan.math == MathMode::kIEEE;
    if (hopper_kernels(sm) && igemm_wgrad_sm90::fits(p, tf32x3)) {
      plan.algo = Algo::kImplicitGemmSm90;
    } else if (igemm_wgrad::fits(p, tf32x3, sm)) {
      plan.algo = Algo::kImplicitGemm;
    }
  }
  return plan;
}

namespace {
Pass to_pass(const std::string& pass) {
  if (pass == "forward") return Pass::kFprop;
  if (pass == "backward_input") return Pass::kDgrad;
  TORCH_CHECK(pass == "backward_weight", "conv2d_ext: unknown pass '", pass,
              "' (expected forward, backward_input or backward_weight)");
  return Pass::kWgrad;
}
}  // namespace

namespace {
// The plan a call with these operands runs, for the reports: an NCHW call
// on copies (`copies` set) runs the channels_last plan.
Plan call_plan(const ConvParams& p, Pass pass, at::ScalarType dtype, int sm, bool channels_last,
               bool& copies) {
  copies = !channels_last && sm != 0 && nhwc_on_copies(p, pass, dtype, sm);
  return choose_plan(p, pass, dtype, sm, channels_last || copies);
}
}  // namespace

std::string algorithm(const std::string& pass, const at::Tensor& input,
                      const at::Tensor& weight, c10::IntArrayRef stride,
                      c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                      int sm) {
  const ConvParams p = make_fprop_params(input, weight, c10::nullopt, stride,
                                         padding, dilation, groups);
  const bool channels_last =
      result_memory_format(input, weight) == at::MemoryFormat::ChannelsLast;
  bool copies = false;
  return to_string(
      call_plan(p, to_pass(pass), input.scalar_type(), sm, channels_last, copies).algo);
}

namespace {
// The flat kernel's layout for `pass` (the forward, or a dgrad that runs as
// one), or none where the pass does not run on it.
std::optional<igemm_fprop_sm90_flat::Layout> flat_layout(
    const std::string& pass, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
    int64_t groups) {
  const ConvParams p = make_fprop_params(input, weight, c10::nullopt, stride,
                                         padding, dilation, groups);
  const bool tf32x3 = math_mode(input.scalar_type()) == MathMode::kIEEE;
  if (pass == "forward") return igemm_fprop_sm90_flat::choose_layout(p, tf32x3);
  if (pass == "backward_input" && dgrad_is_fprop(p)) {
    return igemm_fprop_sm90_flat::choose_layout(dgrad_as_fprop(p), tf32x3);
  }
  return std::nullopt;
}
}  // namespace

int64_t flat_row_shifts(const std::string& pass, const at::Tensor& input,
                        const at::Tensor& weight, c10::IntArrayRef stride,
                        c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups) {
  const auto l = flat_layout(pass, input, weight, stride, padding, dilation, groups);
  return l ? l->shifts : 0;
}

int64_t flat_segments(const std::string& pass, const at::Tensor& input,
                      const at::Tensor& weight, c10::IntArrayRef stride,
                      c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups) {
  const auto l = flat_layout(pass, input, weight, stride, padding, dilation, groups);
  return l && l->smem_bytes != INT64_MAX ? igemm_fprop_sm90_flat::segments(*l) : 0;
}

std::vector<int64_t> flat_tf32x3_rounds(const std::string& pass, const at::Tensor& input,
                                       const at::Tensor& weight, c10::IntArrayRef stride,
                                       c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                       int64_t groups) {
  const auto l = flat_layout(pass, input, weight, stride, padding, dilation, groups);
  if (!l || l->smem_bytes == INT64_MAX) return {0, 0};
  return {igemm_fprop_sm90_flat::tf32x3_full_rounds(*l), igemm_fprop_sm90_flat::tf32x3_tail_pixels(*l)};
}

namespace {
// The variant the few-channel launchers choose (their choose_* functions),
// for kernel_variant. Rows count as 16-byte aligned (can_vectorise) when
// their width is a multiple of 4, as for tensors from the allocator.
void few_channels_variant(std::ostringstream& out, const ConvParams& p, Pass pass, Algo algo,
                          MathMode math, int sm) {
  namespace fc = few_channels;
  const bool tf32x3 = math == MathMode::kIEEE;
  if (algo == Algo::kFewChannelsTensorCore) {
    out << " math=" << (tf32x3 ? "tf32x3" : "tf32");
    if (pass == Pass::kWgrad) {
      out << " sm90=" << fc::choose_wgrad_tc_variant(tf32x3, few_channels_wgrad_sm90(sm)).sm90;
    } else if (pass == Pass::kFprop) {
      out << " sm90=" << hopper_kernels(sm);
    }
    return;
  }
  const bool dgrad_fprop = pass == Pass::kDgrad && fc::dgrad_runs_as_fprop(p);
  const ConvParams f = dgrad_fprop ? dgrad_as_fprop(p) : p;
  const bool compiled = cuda::few_channels_kernel_size(f.kernel_h, f.kernel_w);
  out << " size=" << (compiled ? "specialised" : "generic");
  if (pass == Pass::kFprop || dgrad_fprop) {
    const fc::FpropVariant v = fc::choose_fprop_variant(f, f.in_w % 4 == 0, compiled);
    if (dgrad_fprop) out << " as=forward";
    out << " tile=" << (!v.narrow ? "wide" : v.tall ? "tall" : "narrow") << " pairs=" << v.pairs
        << " odd_lead=" << v.odd_lead;
  } else if (pass == Pass::kDgrad) {
    const fc::DgradVariant v = fc::choose_dgrad_variant(p, compiled);
    out << " pitch=" << (v.fixed_pitch ? "fixed" : "generic") << " pairs=" << v.pairs
        << " tile=" << (v.wide ? "wide" : "narrow");
  } else {
    out << " tile=" << (fc::choose_wgrad_variant(p).narrow ? "narrow" : "wide");
  }
}

// The layout the tensor-core implicit-GEMM launchers choose.
void implicit_gemm_variant(std::ostringstream& out, const ConvParams& p, Pass pass, Algo algo,
                           MathMode math, int sm) {
  const bool tf32x3 = math == MathMode::kIEEE;
  out << " math=" << (tf32x3 ? "tf32x3" : "tf32");
  const ConvParams f = pass == Pass::kDgrad ? dgrad_as_fprop(p) : p;
  if (algo == Algo::kImplicitGemmSm90Flat) {
    namespace cfg = igemm_fprop_sm90_flat;
    const cfg::Layout l = cfg::choose_layout(f, tf32x3);
    const cfg::Variant v = cfg::choose_variant(f, l, tf32x3);
    out << " pitch=" << (1 << l.log2_pitch) << " shifts=" << l.shifts
        << " segments=" << cfg::segments(l) << " group=" << v.group
        << " round_big=" << v.round_big;
  } else if (pass == Pass::kWgrad && algo == Algo::kImplicitGemmSm90) {
    const igemm_wgrad_sm90::Layout l = igemm_wgrad_sm90::choose_layout(p, tf32x3);
    out << " tiles=" << l.tiles << " blocks_per_sm=" << l.blocks_per_sm;
  } else if (pass == Pass::kWgrad) {
    const igemm_wgrad::Layout l = igemm_wgrad::choose_layout(p, tf32x3, sm);
    out << " taps=" << l.taps << " ci_groups=" << l.ci_groups;
  } else {
    const bool sm90 = algo == Algo::kImplicitGemmSm90;
    const igemm_fprop::Layout l = igemm_fprop::choose_layout(
        f, igemm_fprop::weight_floats_per_tap(sm90, sm90 && tf32x3));
    out << " rows_per_stage=" << l.rows_per_stage;
  }
}
}  // namespace

bool nhwc_engine_takes(const ConvParams& p, Pass pass, at::ScalarType dtype, int sm) {
  const Plan plan = choose_plan(p, pass, dtype, sm, /*channels_last=*/true);
  return plan.algo == Algo::kImplicitGemmNhwc && (plan.native_16bit || !is_16bit(dtype));
}

namespace {
// NCHW kernels against the engine on copies (nhwc_on_copies). The NCHW
// tensor-core kernels other than the flat one tile one image's plane: on
// small planes their tiles run mostly empty, where the engine's span
// images; the mma.sync wgrad splits K over one image's pixels; the direct
// kernel (IEEE mode's short wgrads) and the strided dgrad's phases are
// slower still. The copies read and write every activation once more,
// which the flat forward and dgrad, the sm_90 wgrad and the phases of a
// 1x1 dgrad (a quarter of its pixels, the rest zeros) on large planes do
// not repay. The plane bounds follow ResNet-50's layers in NCHW, each pass
// timed with and without copies (docs/kernels.md).
constexpr int64_t kCopiesSmallPlane = 64;          // outputs of at most 8 x 8
constexpr int64_t kCopiesStridedPlane = 256;       // strided forwards: 16 x 16
constexpr int64_t kCopiesPointwisePhasesPlane = 32 * 32;

// The plane of `pass`'s result: output pixels of the forward and wgrad's
// reduction, input pixels of dgrad.
int64_t result_plane(const ConvParams& p, Pass pass) {
  return pass == Pass::kDgrad ? p.in_h * p.in_w : p.out_h * p.out_w;
}

bool nchw_loses_to_engine(const ConvParams& p, Pass pass, Algo nchw) {
  const int64_t plane = result_plane(p, pass);
  switch (nchw) {
    case Algo::kDirect:
    case Algo::kImplicitGemm:
      return true;
    case Algo::kDgradPhases:
      return !one_by_one(p) || plane <= kCopiesPointwisePhasesPlane;
    case Algo::kImplicitGemmSm90:
      if (pass == Pass::kWgrad) return false;
      return one_by_one(p) || plane <= kCopiesSmallPlane ||
             (pass == Pass::kFprop && strided(p) && plane <= kCopiesStridedPlane);
    default:
      return false;
  }
}

// 16-bit operands run float32 copies on the NCHW kernels anyway; copies in
// their own type to the engine's 16-bit MMAs win on all but large planes,
// where the NCHW kernels' float32 reads cost less than two more passes
// over the activations: strided layers up to 56 x 56, 1x1 forwards and
// dgrads up to 16 x 16, the rest up to 28 x 28.
constexpr int64_t kCopies16BitStridedPlane = 56 * 56;
constexpr int64_t kCopies16BitPointwisePlane = 16 * 16;
constexpr int64_t kCopies16BitPlane = 28 * 28;

bool half_nchw_loses_to_engine(const ConvParams& p, Pass pass) {
  const int64_t plane = result_plane(p, pass);
  if (strided(p)) return plane <= kCopies16BitStridedPlane;
  if (pass != Pass::kWgrad && one_by_one(p)) return plane <= kCopies16BitPointwisePlane;
  return plane <= kCopies16BitPlane;
}
}  // namespace

bool nhwc_on_copies(const ConvParams& p, Pass pass, at::ScalarType dtype, int sm) {
  // Weighed on Hopper only.
  if (!option(Option::kNhwcCopies) || sm < 90 || !nhwc_engine_takes(p, pass, dtype, sm)) {
    return false;
  }
  if (is_16bit(dtype)) return half_nchw_loses_to_engine(p, pass);
  return nchw_loses_to_engine(p, pass, choose_plan(p, pass, dtype, sm).algo);
}

bool nhwc_engine_runs(const ConvParams& p, Pass pass, at::ScalarType dtype, int sm,
                      bool channels_last) {
  return channels_last ? nhwc_engine_takes(p, pass, dtype, sm) : nhwc_on_copies(p, pass, dtype, sm);
}

bool cpu_nhwc(const ConvParams& p, Pass pass, at::ScalarType dtype) {
  if (is_16bit(dtype)) return false;  // float32 copies, in whichever format
  const Algo algo = choose_plan(p, pass, dtype, /*sm=*/0, /*channels_last=*/true).algo;
  if (algo == Algo::kCpuFewPixels || algo == Algo::kCpuGrouped) return true;
  switch (pass) {
    case Pass::kFprop:
      return (algo == Algo::kCpuDepthwise && cpu::depthwise_nhwc_fits(p)) ||
             (algo == Algo::kCpuBlocked && cpu::blocked_nhwc_fits(p));
    case Pass::kDgrad:
      // Depthwise: one forward, or where strided dgrad_depthwise_nhwc.
      return (algo == Algo::kCpuDepthwise && cpu::depthwise_nhwc_fits(dgrad_as_fprop(p))) ||
             (algo == Algo::kCpuBlocked && cpu::blocked_nhwc_fits(dgrad_as_fprop(p)));
    case Pass::kWgrad:
      return (algo == Algo::kCpuDepthwise && cpu::depthwise_wgrad_nhwc_fits(p)) ||
             (algo == Algo::kCpuBlocked && cpu::blocked_wgrad_nhwc_fits(p));
  }
  return false;
}

std::string kernel_variant(const std::string& pass, const at::Tensor& input,
                           const at::Tensor& weight, c10::IntArrayRef stride,
                           c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                           int64_t sm) {
  const ConvParams p = make_fprop_params(input, weight, c10::nullopt, stride, padding, dilation,
                                         groups);
  const Pass which = to_pass(pass);
  const int s = static_cast<int>(sm);
  const bool channels_last =
      result_memory_format(input, weight) == at::MemoryFormat::ChannelsLast;
  bool copies = false;
  const Plan plan = call_plan(p, which, input.scalar_type(), s, channels_last, copies);
  std::ostringstream out;
  out << to_string(plan.algo);
  if (copies) out << " copies=channels_last";
  // What the kernels read: 16-bit operands natively or as float32 copies.
  const at::ScalarType dtype =
      is_16bit(input.scalar_type()) && !plan.native_16bit ? at::kFloat : input.scalar_type();
  if (dtype != input.scalar_type()) out << " operands=float32";
  switch (plan.algo) {
    case Algo::kFewChannels:
    case Algo::kFewChannelsTensorCore:
      few_channels_variant(out, p, which, plan.algo, plan.math, s);
      break;
    case Algo::kImplicitGemm:
    case Algo::kImplicitGemmSm90:
    case Algo::kImplicitGemmSm90Flat:
      implicit_gemm_variant(out, p, which, plan.algo, plan.math, s);
      break;
    case Algo::kDgradPhases:
      out << " phases=" << p.stride_h * p.stride_w;
      break;
    case Algo::kImplicitGemmNhwc:
      // Forward tiles of 128 rows run on wgmma where this is 1 (the tile
      // itself depends on the GPU's multiprocessor count).
      out << " math="
          << (plan.native_16bit ? (input.scalar_type() == at::kBFloat16 ? "bf16" : "fp16")
              : plan.math == MathMode::kIEEE ? (which == Pass::kWgrad ? "ffma" : "tf32x3")
                                             : "tf32");
      if (which != Pass::kWgrad) out << " wgmma=" << nhwc_wgmma(s);
      if (which == Pass::kDgrad && !dgrad_is_fprop(p)) out << " phases=" << dgrad_phases(p).size();
      break;
    case Algo::kCpuBlocked:
    case Algo::kCpuDepthwise:
    case Algo::kCpuNarrow:
    case Algo::kCpuFewPixels:
    case Algo::kCpuGrouped:
      out << " isa=" << cpu::blocked_isa();
      // (The few-pixel and depthwise dgrads take their strides
      // themselves; the others run a forward a stride phase.)
      if (plan.algo != Algo::kCpuFewPixels && plan.algo != Algo::kCpuDepthwise &&
          which == Pass::kDgrad && !dgrad_is_fprop(p))
        out << " phases=" << dgrad_phases(p).size();
      if (channels_last && cpu_nhwc(p, which, dtype)) out << " layout=nhwc";
      break;
    case Algo::kDirect:
      break;
  }
  return out.str();
}

bool built_with_sm90a() {
#ifdef CONV2D_EXT_SM90A
  return true;
#else
  return false;
#endif
}

const char* to_string(Algo algo) {
  switch (algo) {
    case Algo::kDirect:
      return "direct";
    case Algo::kImplicitGemm:
      return "implicit_gemm";
    case Algo::kImplicitGemmSm90:
      return "implicit_gemm_sm90";
    case Algo::kImplicitGemmSm90Flat:
      return "implicit_gemm_sm90_flat";
    case Algo::kFewChannels:
      return "few_channels";
    case Algo::kFewChannelsTensorCore:
      return "few_channels_tc";
    case Algo::kDgradPhases:
      return "dgrad_phases";
    case Algo::kCpuBlocked:
      return "cpu_blocked";
    case Algo::kCpuDepthwise:
      return "cpu_depthwise";
    case Algo::kCpuNarrow:
      return "cpu_narrow";
    case Algo::kCpuFewPixels:
      return "cpu_few_pixels";
    case Algo::kCpuGrouped:
      return "cpu_grouped";
    case Algo::kImplicitGemmNhwc:
      return "implicit_gemm_nhwc";
  }
  return "?";
}

const char* to_string(MathMode math) {
  return math == MathMode::kTF32 ? "tf32" : "ieee";
}

}  // namespace conv2d_ext
