// The one place where each call picks its algorithm and arithmetic.
//
// Every pass asks choose_plan(); a new kernel family plugs in here and in
// the pass files' switch on the Algo, nowhere else (docs/kernels.md).
#pragma once

#include <string>
#include <vector>

#include "conv_params.h"
#include "math_mode.h"
#include "options.h"

namespace conv2d_ext {

enum class Pass { kFprop, kDgrad, kWgrad };


enum class Algo {
  kDirect,        // FFMA direct convolution: every dtype, every shape, every GPU
  kImplicitGemm,  // tensor-core implicit GEMM (float32, sm_80+): TF32 or 3xTF32
  kImplicitGemmSm90,  // the same tiles on Hopper's wgmma (sm_90a code): TF32 or 3xTF32
  kImplicitGemmSm90Flat,  // wgmma with pixels as N, halo channel-interleaved (unit stride)
  // Direct kernels around memory traffic for at most 4 input channels per
  // group (float32, sm_80+; depthwise layers, RGB stems), FP32-accurate in
  // both modes:
  kFewChannels,
  // Few input channels per group on TF32 tensor cores (sm_80+): wgrad with
  // more than 4 output channels per group, the forward with at least 32;
  // TF32, or 3xTF32 in IEEE mode.
  kFewChannelsTensorCore,
  // dgrad at stride > 1 (float32, sm_80+): one forward per stride phase of
  // the input, each on the kernel the forward's plan picks for it.
  kDgradPhases,
  // The channels_last engine (float32, sm_80+, TF32 mode): implicit GEMM
  // over the whole batch on NHWC operands; the forward, dgrad (unit stride
  // as one forward, larger strides one per phase) and wgrad.
  kImplicitGemmNhwc,
  // The CPU's register-blocked float32 kernels (cpu/blocked.cpp): the
  // forward, wgrad, and dgrad as forwards (one per stride phase).
  kCpuBlocked,
  // The CPU's depthwise float32 forward (cpu/blocked.cpp).
  kCpuDepthwise,
  // The CPU's float32 forward for few output channels per group at unit
  // column stride (cpu/blocked.cpp), also dgrad as forwards.
  kCpuNarrow,
  // The CPU's float32 kernels for few output pixels over the batch
  // (cpu/few_pixels.cpp), all three passes.
  kCpuFewPixels,
  // The CPU's float32 kernels for channels_last grouped layers of 2, 4 or 8
  // channels a group, several groups a vector (cpu/grouped.cpp): the
  // forward, wgrad, and dgrad as forwards.
  kCpuGrouped,
};

struct Plan {
  Algo algo;
  MathMode math;
  // float16 / bfloat16 operands read as they are (16-bit MMAs, float32
  // sums); otherwise they run the float32 kernels on float32 copies.
  bool native_16bit = false;
};

// PyTorch's convolution precision flag (torch.backends.cudnn.allow_tf32 or
// torch.backends.cudnn.conv.fp32_precision), read at call time.
bool allow_tf32_conv();

// The arithmetic a call in `dtype` runs in now: kTF32 only for float32 with
// the flag set.
MathMode math_mode(at::ScalarType dtype);

// Whether this binary carries sm_90a code (wgmma); setup.py and CMakeLists.txt define
// CONV2D_EXT_SM90A when it builds for it.
bool built_with_sm90a();

// Whether Hopper-only code (wgmma, the tensor-copy engine) runs on a GPU of
// compute capability `sm`: the binary has sm_90a code and
// Option::kHopperKernels is on.
bool hopper_kernels(int sm);

// Whether the few-channel tensor-core wgrad runs its 3xTF32 stage on wgmma:
// hopper_kernels(sm) and Option::kFewChannelsWgradSm90.
bool few_channels_wgrad_sm90(int sm);

// Whether the channels_last engine's forward runs its 128-row tiles on
// wgmma: hopper_kernels(sm) and Option::kNhwcWgmma.
bool nhwc_wgmma(int sm);

// On the CPU: whether a channels_last result of `pass` runs on the
// channels_last operands themselves (the blocked, packed-group and
// few-pixel kernels' three passes, depthwise layers') rather than on NCHW
// copies.
bool cpu_nhwc(const ConvParams& p, Pass pass, at::ScalarType dtype);

// Whether that forward may split K where its 128-row tiles are few:
// nhwc_wgmma(sm) and Option::kNhwcSplitK.
bool nhwc_split_k(int sm);

// Whether it may take 128 x 256 tiles: nhwc_wgmma(sm) and
// Option::kNhwcWideTiles.
bool nhwc_wide_tiles(int sm);

// Whether IEEE mode's forward and dgrad may run it in 3xTF32:
// nhwc_wgmma(sm) and Option::kNhwcIeee.
bool nhwc_tf32x3(int sm);

// Whether a channels_last call of `pass` with operands of `dtype` runs on
// the channels_last engine with those operands as they are (float32, or
// 16-bit ones natively) rather than on NCHW kernels or float32 copies.
bool nhwc_engine_takes(const ConvParams& p, Pass pass, at::ScalarType dtype, int sm);

// Whether an NCHW call of `pass` (its result NCHW) runs the channels_last
// engine on channels_last copies of its operands, the result copied back
// (Option::kNhwcCopies): where the engine takes such operands and the NCHW
// kernel the plan would pick is expected to lose by more than the copies.
bool nhwc_on_copies(const ConvParams& p, Pass pass, at::ScalarType dtype, int sm);

// The entries' question: whether a call whose result is (or is not)
// channels_last runs the channels_last engine, on its operands or on
// copies (nhwc_engine_takes, nhwc_on_copies).
bool nhwc_engine_runs(const ConvParams& p, Pass pass, at::ScalarType dtype, int sm,
                      bool channels_last);

// `sm` is the GPU's compute capability as 10*major + minor (0: CPU).
// `channels_last`: the result is channels_last (result_memory_format), so
// the channels_last engine may take the call. (The kernel for operands in
// those layouts: an NCHW call on copies, nhwc_on_copies, is the entries'.)
Plan choose_plan(const ConvParams& p, Pass pass, at::ScalarType dtype, int sm,
                 bool channels_last = false);

// The algorithm `pass` ("forward", "backward_input" or "backward_weight")
// of a convolution of these forward arguments runs now on a device of
// compute capability `sm` (0: CPU); backs the _algorithm op.
std::string algorithm(const std::string& pass, const at::Tensor& input,
                      const at::Tensor& weight, c10::IntArrayRef stride,
                      c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                      int sm);

// The kernel variant `pass` would run on a GPU of compute capability `sm`
// with this binary and the current options and precision flag: the
// algorithm, then the family's choices as key=value words (the layouts'
// and choose_* functions' answers), e.g. "few_channels size=specialised
// pitch=fixed pairs=1 tile=wide". Backs the _kernel op.
std::string kernel_variant(const std::string& pass, const at::Tensor& input,
                           const at::Tensor& weight, c10::IntArrayRef stride,
                           c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                           int64_t sm);

// Tests only: the row shifts (1 or 2) of the flat sm_90 layout for `pass`
// in the current precision mode, 0 where the layout fits nothing (or the
// pass never runs the forward kernels); whether the plan picks that kernel
// is algorithm()'s answer.
int64_t flat_row_shifts(const std::string& pass, const at::Tensor& input,
                        const at::Tensor& weight, c10::IntArrayRef stride,
                        c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups);

// Tests only: accumulation segments of an item of that flat layout (1: one
// chain; more for 3xTF32 over a long K), 0 where flat_row_shifts is 0.
int64_t flat_segments(const std::string& pass, const at::Tensor& input,
                      const at::Tensor& weight, c10::IntArrayRef stride,
                      c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups);

// Tests only: how the 3xTF32 split of that layout walks a chunk's box:
// {full rounds, pixels left to the tail} (see igemm_fprop_sm90_flat::
// kTf32x3Pixels); {0, 0} where flat_row_shifts is 0.
std::vector<int64_t> flat_tf32x3_rounds(const std::string& pass, const at::Tensor& input,
                                       const at::Tensor& weight, c10::IntArrayRef stride,
                                       c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                       int64_t groups);

const char* to_string(Algo algo);
const char* to_string(MathMode math);

}  // namespace conv2d_ext
