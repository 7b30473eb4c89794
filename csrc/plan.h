// The one place where each call picks its algorithm and arithmetic.
//
// Every pass asks choose_plan(); new kernels (tensor-core implicit GEMM,
// depthwise, ...) plug in here and nowhere else.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "conv_params.h"

namespace conv2d_ext {

enum class Pass { kFprop, kDgrad, kWgrad };

// How float32 products are formed. kIEEE must be FP32-accurate; kTF32 may
// round operands to TF32 (PyTorch's default for convolutions).
enum class MathMode { kIEEE, kTF32 };

enum class Algo {
  kDirect,        // FFMA direct convolution: every dtype, every shape, every GPU
  kImplicitGemm,  // tensor-core implicit GEMM (float32, sm_80+): TF32 or 3xTF32
  kImplicitGemmSm90,  // the same tiles on Hopper's wgmma (sm_90a code): TF32 or 3xTF32
  kImplicitGemmSm90Flat,  // wgmma with pixels as N, halo channel-interleaved (unit stride)
  // Direct kernels around memory traffic for at most 4 input channels per
  // group (float32, sm_80+), FP32-accurate in both modes:
  kDepthwise,    // 1 input and at most 4 output channels per group
  kFewChannels,  // the others (RGB stems)
  // Few input channels per group on TF32 tensor cores (sm_80+): wgrad with
  // more than 4 output channels per group, the forward with at least 32;
  // TF32, or 3xTF32 in IEEE mode.
  kFewChannelsTensorCore,
  // dgrad at stride > 1 (float32, sm_80+): one forward per stride phase of
  // the input, each on the kernel the forward's plan picks for it.
  kDgradPhases,
};

struct Plan {
  Algo algo;
  MathMode math;
};

// PyTorch's convolution precision flag (torch.backends.cudnn.allow_tf32 or
// torch.backends.cudnn.conv.fp32_precision), read at call time.
bool allow_tf32_conv();

// The arithmetic a call in `dtype` runs in now: kTF32 only for float32 with
// the flag set.
MathMode math_mode(at::ScalarType dtype);

// Whether this binary carries sm_90a code (wgmma); setup.py defines
// CONV2D_EXT_SM90A when it builds for it.
bool built_with_sm90a();

// Tests only: allow (default) or forbid the Hopper kernels. Returns the
// previous setting.
bool set_hopper_kernels(bool enable);

// Whether Hopper-only code (wgmma, the tensor-copy engine) runs on a GPU of
// compute capability `sm`: the binary has sm_90a code and the tests have
// not switched it off.
bool hopper_kernels(int sm);

// Tests only: allow (default) or forbid the flat sm_90 kernel, so that the
// other wgmma kernel can be tested on unit-stride shapes too.
bool set_flat_kernels(bool enable);

// Tests only: whether IEEE-mode wgrad of short reductions goes to the
// direct FFMA kernel (default, for accuracy), so that the 3xTF32
// tensor-core wgrad kernels stay covered on small shapes.
bool set_short_wgrad_direct(bool enable);

// Whether the few-channel tensor-core wgrad (RGB stems) runs its 3xTF32
// (IEEE mode) stage on wgmma on Hopper (the default) or on mma.sync, as
// other GPUs do: off keeps that stage tested on Hopper. Returns the
// previous setting.
bool set_few_channel_wgrad_wgmma(bool enable);
bool few_channel_wgrad_wgmma(int sm);

// Whether TF32-mode dgrad of few input channels runs every stride phase at
// once on tensor cores (RGB stems at stride 2; the default) or on the FFMA
// gather (off: keeps the gather tested on those shapes in TF32 mode).
// Returns the previous setting.
bool set_few_channel_dgrad_tc(bool enable);

// Whether the FFMA gather takes two columns a thread on the phases it has
// compiled for (stride 2, unit dilation: RGB stems; the default) or one
// (off: keeps the one-column path tested on those shapes). Returns the
// previous setting.
bool set_few_channel_dgrad_pairs(bool enable);
bool few_channel_dgrad_pairs();

// Whether the FFMA gather starts its blocks heaviest (phase, tile) first
// within groups of at most a wave (the default) or in the grid's order (off:
// for A/B runs and for tests that both orders give the same bits). Returns
// the previous setting.
bool set_few_channel_dgrad_order(bool enable);
bool few_channel_dgrad_order();

// Whether the FFMA gather takes 16 x 112 tiles on phases of 65 to 112
// columns where every phase takes two columns a thread (RGB stems; the
// default) or 32 x 64 tiles (off: keeps those tested on such shapes).
// Returns the previous setting.
bool set_few_channel_dgrad_wide(bool enable);
bool few_channel_dgrad_wide();

// Whether the sm_90 wgrad's 3xTF32 kernel skips the k8 steps of a K tile
// past the output's right edge, in pairs (the default), or runs all 8 on
// zeros (off: for A/B runs and for tests that both give the same bits).
// Returns the previous setting.
bool set_wgrad_edge_steps(bool enable);
bool wgrad_edge_steps();

// `sm` is the GPU's compute capability as 10*major + minor (0: CPU).
Plan choose_plan(const ConvParams& p, Pass pass, at::ScalarType dtype, int sm);

// The algorithm `pass` ("forward", "backward_input" or "backward_weight")
// of a convolution of these forward arguments runs now on a device of
// compute capability `sm` (0: CPU); backs the _algorithm op.
std::string algorithm(const std::string& pass, const at::Tensor& input,
                      const at::Tensor& weight, c10::IntArrayRef stride,
                      c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                      int sm);

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
// {full rounds, pixels left to the tail} (see igemm_fprop_flat::
// kSplitPixels); {0, 0} where flat_row_shifts is 0.
std::vector<int64_t> flat_split_rounds(const std::string& pass, const at::Tensor& input,
                                       const at::Tensor& weight, c10::IntArrayRef stride,
                                       c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                       int64_t groups);

const char* to_string(Algo algo);
const char* to_string(MathMode math);

}  // namespace conv2d_ext
