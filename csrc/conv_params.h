// The one description of a 2-D convolution shared by every pass (fprop,
// dgrad, wgrad) and every backend (CPU, CUDA).
//
// Passed by value to CUDA kernels too, hence C10_HOST_DEVICE accessors.
// Layout is always NCHW for activations and KCRS (out, in/groups, kh, kw)
// for weights; callers make tensors contiguous before building a ConvParams.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/TensorBase.h>
#include <c10/macros/Macros.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Optional.h>

// Declared, not defined: the kernel translation units include only
// TensorBase (the full Tensor class with every operator's method costs
// each of them most of its host compile time); the entry points include
// ATen.
namespace at {
class Tensor;
}  // namespace at

namespace conv2d_ext {

// The CUDA kernels count images, channels, kernel taps and weight elements,
// and index within one (image, channel) plane, in 32-bit arithmetic; only
// offsets of whole planes are formed in 64 bits. make_*_params rejects
// problems where any of these, or a padded input extent, reaches this
// bound: 2^31 less headroom for rounding extents up to whole tiles and for
// grid-stride loop steps past the end (at most 65535). Tensors themselves
// may have any number of elements.
constexpr int64_t kMaxIndex32 = (int64_t(1) << 31) - (int64_t(1) << 16);

struct ConvParams {
  int64_t batch = 0;
  int64_t in_channels = 0, in_h = 0, in_w = 0;
  // The output's channels: the weight's dimension 0, or 0 when in_channels
  // is (PyTorch's output shape; such a problem runs no kernel, and its
  // kernel extents may then be 0).
  int64_t out_channels = 0, out_h = 0, out_w = 0;
  int64_t kernel_h = 0, kernel_w = 0;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;

  C10_HOST_DEVICE int64_t in_channels_per_group() const { return in_channels / groups; }
  C10_HOST_DEVICE int64_t out_channels_per_group() const { return out_channels / groups; }
  C10_HOST_DEVICE int64_t taps() const { return kernel_h * kernel_w; }

  // Implicit-GEMM extents of the forward pass (per group), in CUTLASS's
  // naming: dgrad and wgrad permute these three.
  C10_HOST_DEVICE int64_t gemm_m() const { return batch * out_h * out_w; }
  C10_HOST_DEVICE int64_t gemm_n() const { return out_channels_per_group(); }
  C10_HOST_DEVICE int64_t gemm_k() const { return in_channels_per_group() * taps(); }

  C10_HOST_DEVICE int64_t input_numel() const { return batch * in_channels * in_h * in_w; }
  C10_HOST_DEVICE int64_t output_numel() const { return batch * out_channels * out_h * out_w; }
  C10_HOST_DEVICE int64_t weight_numel() const { return out_channels * gemm_k(); }
};

// dgrad at unit stride is a forward pass: grad_input = fprop(grad_output,
// w') with w' each group's weight transposed (its input and output channels
// swapped) and rotated by 180 degrees, and padding dilation*(K-1) - padding.
// The tensor-core forwards read w' straight from the layer's weight when
// told WeightOrder::kDgrad, so that dgrad shares their kernels.
enum class WeightOrder { kFprop, kDgrad };

// Whether dgrad of `p` is such a forward: unit stride, every input pixel
// reached by a full output row and column (no rows dropped by a stride
// that make_*_params normalised to 1), and padding at most dilation*(K-1)
// (the forward takes no negative padding).
bool dgrad_is_fprop(const ConvParams& p);

// The forward problem that computes dgrad of `p` (dgrad_is_fprop(p)): its
// input is grad_output, its output grad_input.
ConvParams dgrad_as_fprop(const ConvParams& p);

// dgrad at stride > 1 by phase, as CUTLASS's strided dgrad: the input
// pixels of one phase (row = row0 mod stride_h, column = col0 mod
// stride_w) are reached only by the taps whose offset lands on the stride
// grid, and those read grad_output at unit stride. Each phase is thus a
// forward over grad_output with a sub-kernel (every stride/gcd(stride,
// dilation)-th tap, dilation/gcd apart), and no multiply-add touches the
// zeros a stride inserts.
struct DgradPhase {
  int64_t row0 = 0, col0 = 0;  // the phase's first input row and column
  // Sub-kernel row u is kernel row kh_last - u * kh_step (ascending
  // grad_output offsets); columns likewise.
  int64_t kh_last = 0, kh_step = 1, kw_last = 0, kw_step = 1;
  // grad_output rows and columns the phase's forward skips: where its first
  // tap reads past grad_output's first row (padding past the kernel's
  // reach), it reads grad_output from a later row instead of taking a
  // negative padding. (Zero taps in front would multiply real grad_output
  // values by 0, and an Inf there would turn into NaN.)
  int64_t row_skip = 0, col_skip = 0;
  // The phase as a forward: grad_output in, the phase's input pixels out
  // (groups as the layer's, weight each group's transposed sub-kernel).
  // kernel_h or kernel_w 0: no tap reaches the phase (its gradient is 0).
  ConvParams fprop;
};

// The phases of dgrad of `p`, in row-major order of (row0, col0).
std::vector<DgradPhase> dgrad_phases(const ConvParams& p);

// float16 and bfloat16: the ops run them on float32 copies of their
// operands (pass_entry.h), the plan as for float32.
inline bool is_16bit(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// Output extent of one spatial dimension, as nn.Conv2d defines it.
inline int64_t conv_out_size(int64_t in, int64_t kernel, int64_t stride,
                             int64_t pad, int64_t dilation) {
  return (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1;
}

// Validates the forward arguments with PyTorch's wording and returns the
// parameters. Tensors may be in any layout; only sizes are read.
ConvParams make_fprop_params(const at::Tensor& input, const at::Tensor& weight,
                             const c10::optional<at::Tensor>& bias,
                             c10::IntArrayRef stride, c10::IntArrayRef padding,
                             c10::IntArrayRef dilation, int64_t groups);

// Validates dgrad arguments: grad_output [N, Cout, Ho, Wo], the weight and
// the shape of the input whose gradient is wanted.
ConvParams make_dgrad_params(const at::Tensor& grad_output,
                             const at::Tensor& weight,
                             c10::IntArrayRef input_size,
                             c10::IntArrayRef stride, c10::IntArrayRef padding,
                             c10::IntArrayRef dilation, int64_t groups);

// Validates wgrad arguments: grad_output, the forward input and the shape of
// the weight whose gradient is wanted.
ConvParams make_wgrad_params(const at::Tensor& grad_output,
                             const at::Tensor& input,
                             c10::IntArrayRef weight_size,
                             c10::IntArrayRef stride, c10::IntArrayRef padding,
                             c10::IntArrayRef dilation, int64_t groups);

// Allocates an op's output. When Option::kPoisonOutputs is on (tests), the
// buffer is filled with NaN so that any element a kernel fails to write
// shows up in the comparison against the reference.
at::TensorBase empty_output(c10::IntArrayRef sizes, const at::TensorOptions& opts,
                            at::MemoryFormat format = at::MemoryFormat::Contiguous);

// The memory format of a pass's result, as PyTorch's convolution picks it
// from its two operands (input and weight; for dgrad grad_output and
// weight; for wgrad grad_output and input): channels_last when either
// one's strides suggest it (Tensor::suggest_memory_format), except float64
// on CUDA, which cuDNN keeps contiguous.
at::MemoryFormat result_memory_format(const at::Tensor& a, const at::Tensor& b);

}  // namespace conv2d_ext
