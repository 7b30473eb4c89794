// Argument validation for all three passes. Messages follow PyTorch's own
// (aten/src/ATen/native/Convolution.cpp) so that a user moving from
// nn.Conv2d sees familiar errors.
#include "conv_params.h"

#include "options.h"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <limits>
#include <numeric>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace conv2d_ext {
namespace {

void check_float_dtype(const char* op, const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble ||
                  is_16bit(t.scalar_type()),
              op, " not implemented for '", t.scalar_type(),
              "' (supported: float32, float64, float16, bfloat16)");
}

void check_same_dtype(const char* first_name, const at::Tensor& first,
                      const char* second_name, const at::Tensor& second) {
  TORCH_CHECK(first.scalar_type() == second.scalar_type(), first_name,
              " type (", first.scalar_type(), ") and ", second_name, " type (",
              second.scalar_type(), ") should be the same");
}

void check_same_device(const char* first_name, const at::Tensor& first,
                       const char* second_name, const at::Tensor& second) {
  TORCH_CHECK(first.device() == second.device(),
              "Expected all tensors to be on the same device, but found at "
              "least two devices, ",
              first.device(), " and ", second.device(), "! (", first_name,
              " is on ", first.device(), ", ", second_name, " is on ",
              second.device(), ")");
}

// One value of a 2-element geometry argument; a single value stands for
// both dimensions, as in PyTorch's convolutions (forward and backward).
int64_t dim_value(const char* name, c10::IntArrayRef values, size_t dim) {
  TORCH_CHECK(values.size() == 1 || values.size() == 2, "expected ", name,
              " to be a single integer value or a list of 2 values to match "
              "the convolution dimensions, but got ",
              name, "=", values);
  return values.size() == 1 ? values[0] : values[dim];
}

// Fills stride, padding, dilation and groups after checking each.
void set_geometry(ConvParams& p, c10::IntArrayRef stride,
                  c10::IntArrayRef padding, c10::IntArrayRef dilation,
                  int64_t groups) {
  p.stride_h = dim_value("stride", stride, 0);
  p.stride_w = dim_value("stride", stride, 1);
  p.pad_h = dim_value("padding", padding, 0);
  p.pad_w = dim_value("padding", padding, 1);
  p.dilation_h = dim_value("dilation", dilation, 0);
  p.dilation_w = dim_value("dilation", dilation, 1);
  TORCH_CHECK(p.stride_h > 0 && p.stride_w > 0,
              "non-positive stride is not supported");
  TORCH_CHECK(p.pad_h >= 0 && p.pad_w >= 0,
              "negative padding is not supported");
  TORCH_CHECK(p.dilation_h > 0 && p.dilation_w > 0,
              "dilation should be greater than zero");
  TORCH_CHECK(groups > 0, "non-positive groups is not supported");
  p.groups = groups;
}

// Checks that the weight fits the input's channels and padded extent, then
// derives the output extent. `input_size` is [N, C, H, W]. The weight's
// checks run in PyTorch's order, so that the first failing one gives
// PyTorch's message.
void set_shapes(ConvParams& p, c10::IntArrayRef input_size,
                c10::IntArrayRef weight_size) {
  TORCH_CHECK(weight_size[0] >= p.groups, "Given groups=", p.groups,
              ", expected weight to be at least ", p.groups,
              " at dimension 0, but got weight of size ", weight_size,
              " instead");
  TORCH_CHECK(weight_size[0] % p.groups == 0, "Given groups=", p.groups,
              ", expected weight to be divisible by ", p.groups,
              " at dimension 0, but got weight of size ", weight_size,
              " instead");
  TORCH_CHECK(input_size[1] == weight_size[1] * p.groups,
              "Given groups=", p.groups, ", weight of size ", weight_size,
              ", expected input", input_size, " to have ",
              weight_size[1] * p.groups, " channels, but got ", input_size[1],
              " channels instead");
  // An input without channels runs no kernel (its output is empty, see
  // below): PyTorch, which then runs none either, skips these two checks.
  const bool no_channels = input_size[1] == 0;
  TORCH_CHECK(no_channels || (weight_size[2] > 0 && weight_size[3] > 0),
              "kernel size should be greater than zero, but got weight of "
              "size ",
              weight_size);
  TORCH_CHECK(no_channels || (input_size[2] > 0 && input_size[3] > 0),
              "Expected input's non-batch dimensions to have positive length, "
              "but input has a shape of ",
              input_size);
  p.batch = input_size[0];
  p.in_channels = input_size[1];
  p.in_h = input_size[2];
  p.in_w = input_size[3];
  // As PyTorch (its path for empty inputs): an input without channels
  // gives an output without channels, whatever the weight's dimension 0.
  p.out_channels = no_channels ? 0 : weight_size[0];
  p.kernel_h = weight_size[2];
  p.kernel_w = weight_size[3];
  const int64_t padded_h = p.in_h + 2 * p.pad_h;
  const int64_t padded_w = p.in_w + 2 * p.pad_w;
  const int64_t extent_h = p.dilation_h * (p.kernel_h - 1) + 1;
  const int64_t extent_w = p.dilation_w * (p.kernel_w - 1) + 1;
  TORCH_CHECK(padded_h >= extent_h && padded_w >= extent_w,
              "Calculated padded input size per channel: (", padded_h, " x ",
              padded_w, "). Kernel size: (", extent_h, " x ", extent_w,
              "). Kernel size can't be greater than actual input size");
  // Bounds of the kernels' 32-bit arithmetic (kMaxIndex32), checked before
  // any product that could overflow: the padded extents (which bound the
  // unpadded ones, padding, kernel extent and, below, stride), then the
  // planes, the counts and the weight.
  TORCH_CHECK(padded_h < kMaxIndex32 && padded_w < kMaxIndex32,
              "conv2d_ext: a padded input extent of ", kMaxIndex32,
              " or more is not supported (padded input ", padded_h, "x",
              padded_w, ")");
  p.out_h = conv_out_size(p.in_h, p.kernel_h, p.stride_h, p.pad_h,
                          p.dilation_h);
  p.out_w = conv_out_size(p.in_w, p.kernel_w, p.stride_w, p.pad_w,
                          p.dilation_w);
  TORCH_CHECK(p.in_h * p.in_w < kMaxIndex32 && p.out_h * p.out_w < kMaxIndex32,
              "conv2d_ext: one channel plane of ", kMaxIndex32,
              " or more elements is not supported (input ", p.in_h, "x",
              p.in_w, ", output ", p.out_h, "x", p.out_w, ")");
  TORCH_CHECK(p.batch < kMaxIndex32 && p.in_channels < kMaxIndex32 &&
                  weight_size[0] < kMaxIndex32,
              "conv2d_ext: a batch or channel count of ", kMaxIndex32,
              " or more is not supported (input", input_size, ", weight",
              weight_size, ")");
  // Every factor is below 2^31 here, and each partial product is checked
  // before the next multiplication, so nothing overflows int64.
  int64_t weight_numel = 1;
  for (const int64_t d : {weight_size[0], weight_size[1], p.kernel_h,
                          p.kernel_w}) {
    weight_numel *= d;
    TORCH_CHECK(weight_numel < kMaxIndex32, "conv2d_ext: a weight of ",
                kMaxIndex32, " or more elements is not supported (weight",
                weight_size, ")");
  }
  // With a single output row (column) the stride never multiplies anything,
  // and with a single kernel row (column) the dilation never does: they are
  // normalised to 1, so that every geometry value the kernels narrow to int
  // is bounded by the padded extent (with two or more outputs, stride <
  // padded extent; with two or more taps, dilation < padded extent). An
  // arbitrary stride would otherwise wrap when narrowed.
  if (p.out_h == 1) p.stride_h = 1;
  if (p.out_w == 1) p.stride_w = 1;
  if (p.kernel_h == 1) p.dilation_h = 1;
  if (p.kernel_w == 1) p.dilation_w = 1;
}

void check_4d(const char* what, const char* op, const at::Tensor& t) {
  TORCH_CHECK(t.dim() == 4, "Expected 4D (batched) ", what, " to ", op,
              ", but got ", what, " of size: ", t.sizes());
}

// A backward pass's grad_output must have the forward output's shape.
void check_grad_output_size(const char* op, const at::Tensor& grad_output,
                            const ConvParams& p, c10::IntArrayRef input_size,
                            c10::IntArrayRef weight_size) {
  const std::array<int64_t, 4> expected{p.batch, p.out_channels, p.out_h,
                                        p.out_w};
  TORCH_CHECK(grad_output.sizes() == c10::IntArrayRef(expected), op,
              ": grad_output of size ", grad_output.sizes(),
              " does not match the output size ", c10::IntArrayRef(expected),
              " of a convolution of input", input_size, " with weight",
              weight_size);
}

}  // namespace

ConvParams make_fprop_params(const at::Tensor& input, const at::Tensor& weight,
                             const c10::optional<at::Tensor>& bias,
                             c10::IntArrayRef stride, c10::IntArrayRef padding,
                             c10::IntArrayRef dilation, int64_t groups) {
  constexpr const char* op = "conv2d_ext::conv2d";
  check_4d("input", op, input);
  TORCH_CHECK(weight.dim() == 4,
              "Expected 4-dimensional weight for 4-dimensional input ",
              input.sizes(), ", but got ", weight.dim(),
              "-dimensional weight of size ", weight.sizes(), " instead");
  check_float_dtype(op, input);
  check_same_dtype("Input", input, "weight", weight);
  check_same_device("input", input, "weight", weight);
  ConvParams p;
  set_geometry(p, stride, padding, dilation, groups);
  set_shapes(p, input.sizes(), weight.sizes());
  if (bias.has_value() && bias->defined()) {
    check_same_dtype("Input", input, "bias", *bias);
    check_same_device("input", input, "bias", *bias);
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0),
                "Given weight of size ", weight.sizes(),
                ", expected bias to be 1-dimensional with ", weight.size(0),
                " elements, but got bias of size ", bias->sizes(),
                " instead");
  }
  return p;
}

ConvParams make_dgrad_params(const at::Tensor& grad_output,
                             const at::Tensor& weight,
                             c10::IntArrayRef input_size,
                             c10::IntArrayRef stride, c10::IntArrayRef padding,
                             c10::IntArrayRef dilation, int64_t groups) {
  constexpr const char* op = "conv2d_ext::conv2d_backward_input";
  check_4d("grad_output", op, grad_output);
  TORCH_CHECK(weight.dim() == 4, op, ": expected a 4-D weight, got size ",
              weight.sizes());
  TORCH_CHECK(input_size.size() == 4, op,
              ": expected input_size to have 4 elements, got ", input_size);
  check_float_dtype(op, grad_output);
  check_same_dtype("grad_output", grad_output, "weight", weight);
  check_same_device("grad_output", grad_output, "weight", weight);
  ConvParams p;
  set_geometry(p, stride, padding, dilation, groups);
  set_shapes(p, input_size, weight.sizes());
  check_grad_output_size(op, grad_output, p, input_size, weight.sizes());
  return p;
}

ConvParams make_wgrad_params(const at::Tensor& grad_output,
                             const at::Tensor& input,
                             c10::IntArrayRef weight_size,
                             c10::IntArrayRef stride, c10::IntArrayRef padding,
                             c10::IntArrayRef dilation, int64_t groups) {
  constexpr const char* op = "conv2d_ext::conv2d_backward_weight";
  check_4d("grad_output", op, grad_output);
  check_4d("input", op, input);
  TORCH_CHECK(weight_size.size() == 4, op,
              ": expected weight_size to have 4 elements, got ", weight_size);
  check_float_dtype(op, grad_output);
  check_same_dtype("grad_output", grad_output, "input", input);
  check_same_device("grad_output", grad_output, "input", input);
  ConvParams p;
  set_geometry(p, stride, padding, dilation, groups);
  set_shapes(p, input.sizes(), weight_size);
  check_grad_output_size(op, grad_output, p, input.sizes(), weight_size);
  return p;
}

at::TensorBase empty_output(c10::IntArrayRef sizes, const at::TensorOptions& opts,
                            at::MemoryFormat format) {
  at::Tensor out = at::empty(sizes, opts.memory_format(format));
  if (option(Option::kPoisonOutputs)) {
    out.fill_(std::numeric_limits<double>::quiet_NaN());
  }
  return out;
}

at::MemoryFormat result_memory_format(const at::Tensor& a, const at::Tensor& b) {
  if (a.is_cuda() && a.scalar_type() == at::kDouble) return at::MemoryFormat::Contiguous;
  constexpr auto kCl = at::MemoryFormat::ChannelsLast;
  return a.suggest_memory_format() == kCl || b.suggest_memory_format() == kCl
             ? kCl
             : at::MemoryFormat::Contiguous;
}

bool dgrad_is_fprop(const ConvParams& p) {
  auto dim_ok = [](int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t pad,
                   int64_t dilation) {
    const int64_t reach = dilation * (kernel - 1);
    // in + reach bounds the forward's padded extent, out + 2*(reach - pad).
    return stride == 1 && pad <= reach && out == in + 2 * pad - reach &&
           in + reach < kMaxIndex32;
  };
  return dim_ok(p.in_h, p.out_h, p.kernel_h, p.stride_h, p.pad_h, p.dilation_h) &&
         dim_ok(p.in_w, p.out_w, p.kernel_w, p.stride_w, p.pad_w, p.dilation_w);
}

namespace {

// One dimension of a dgrad phase: the input positions r, r + s, ...
struct PhaseDim {
  int64_t count = 0;       // input positions of the phase
  int64_t taps = 0;        // kernel taps that reach them
  int64_t last = 0, step = 1, dilation = 1, pad = 0;
  int64_t skip = 0;        // grad_output positions skipped, for a padding of at least 0
};

PhaseDim phase_dim(int64_t r, int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                   int64_t dilation) {
  PhaseDim d;
  d.count = (in - r + stride - 1) / stride;
  const int64_t g = std::gcd(stride, dilation);
  d.step = stride / g;
  d.dilation = dilation / g;
  // Tap k reaches output (r + pad - k * dilation) / stride when that is
  // exact; the valid taps repeat every `step`.
  for (int64_t k = 0; k < std::min(kernel, d.step); ++k) {
    if (((r + pad - k * dilation) % stride + stride) % stride == 0) {
      d.taps = (kernel - 1 - k) / d.step + 1;
      d.last = k + (d.taps - 1) * d.step;
      // The last tap reads the lowest grad_output offset: -pad of the
      // forward, or the grad_output positions it skips when positive.
      const int64_t offset = (r + pad - d.last * dilation) / stride;
      d.skip = std::max<int64_t>(offset, 0);
      d.pad = std::max<int64_t>(-offset, 0);
      break;
    }
  }
  return d;
}

}  // namespace

std::vector<DgradPhase> dgrad_phases(const ConvParams& p) {
  std::vector<DgradPhase> phases;
  for (int64_t r = 0; r < std::min(p.stride_h, p.in_h); ++r) {
    const PhaseDim h = phase_dim(r, p.in_h, p.kernel_h, p.stride_h, p.pad_h, p.dilation_h);
    for (int64_t c = 0; c < std::min(p.stride_w, p.in_w); ++c) {
      const PhaseDim w = phase_dim(c, p.in_w, p.kernel_w, p.stride_w, p.pad_w, p.dilation_w);
      DgradPhase ph;
      ph.row0 = r;
      ph.col0 = c;
      ph.kh_last = h.last;
      ph.kh_step = h.step;
      ph.kw_last = w.last;
      ph.kw_step = w.step;
      ph.row_skip = h.skip;
      ph.col_skip = w.skip;
      // dgrad's forward (channels and extents swapped), narrowed to the phase.
      ConvParams& f = ph.fprop;
      f = dgrad_as_fprop(p);
      f.in_h -= h.skip;
      f.in_w -= w.skip;
      f.out_h = h.count;
      f.out_w = w.count;
      // No tap, or every tap past grad_output's end: the gradient is 0.
      const bool reached = h.taps > 0 && w.taps > 0 && f.in_h > 0 && f.in_w > 0;
      f.kernel_h = reached ? h.taps : 0;
      f.kernel_w = reached ? w.taps : 0;
      f.stride_h = f.stride_w = 1;
      f.pad_h = h.pad;
      f.pad_w = w.pad;
      f.dilation_h = h.dilation;
      f.dilation_w = w.dilation;
      phases.push_back(ph);
    }
  }
  return phases;
}

ConvParams dgrad_as_fprop(const ConvParams& p) {
  ConvParams f = p;
  f.in_channels = p.out_channels;
  f.in_h = p.out_h;
  f.in_w = p.out_w;
  f.out_channels = p.in_channels;
  f.out_h = p.in_h;
  f.out_w = p.in_w;
  f.pad_h = p.dilation_h * (p.kernel_h - 1) - p.pad_h;
  f.pad_w = p.dilation_w * (p.kernel_w - 1) - p.pad_w;
  return f;
}

}  // namespace conv2d_ext
