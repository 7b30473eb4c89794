// Operator schemas. Kernels register per backend next to their code
// (cpu/*.cpp, cuda/*.cu), autograd for every backend in autograd.cpp, fake
// tensors in Python (conv2d_ext/_ops.py).
#include <torch/library.h>

#include <string>

#include "conv_params.h"
#include "options.h"
#include "plan.h"

TORCH_LIBRARY(conv2d_ext, m) {
  // aten::conv2d's schema and defaults, so that torch.ops calls take the same
  // arguments as torch.ops.aten.conv2d.
  m.def(
      "conv2d(Tensor input, Tensor weight, Tensor? bias=None, "
      "SymInt[2] stride=1, SymInt[2] padding=0, SymInt[2] dilation=1, "
      "SymInt groups=1) -> Tensor");
  // dgrad: the gradient of conv2d with respect to its input.
  m.def(
      "conv2d_backward_input(Tensor grad_output, Tensor weight, "
      "SymInt[4] input_size, SymInt[2] stride, SymInt[2] padding, "
      "SymInt[2] dilation, SymInt groups) -> Tensor");
  // wgrad: the gradient of conv2d with respect to its weight.
  m.def(
      "conv2d_backward_weight(Tensor grad_output, Tensor input, "
      "SymInt[4] weight_size, SymInt[2] stride, SymInt[2] padding, "
      "SymInt[2] dilation, SymInt groups) -> Tensor");
  // Tests and A/B runs: set one of the switches of options.h by name
  // ("hopper_kernels", ...); returns its previous value.
  m.def("_set_option(str name, bool value) -> bool", &conv2d_ext::set_option);
  // The switches' names.
  m.def("_option_names() -> str[]", &conv2d_ext::option_names);
  // The algorithm a pass ('forward', 'backward_input', 'backward_weight')
  // of a convolution of these forward arguments would run now, e.g. for
  // tests to check which kernels they cover.
  m.def(
      "_algorithm(str pass_, Tensor input, Tensor weight, int[2] stride, "
      "int[2] padding, int[2] dilation, int groups) -> str");
  // Which kernel variant a pass of these forward arguments would run on a
  // GPU of compute capability `sm` (90: H100): the algorithm, then its
  // family's choices (conv2d_ext::kernel_variant). Runs without a GPU.
  m.def(
      "_kernel(str pass_, Tensor input, Tensor weight, int[2] stride, int[2] padding, "
      "int[2] dilation, int groups, int sm) -> str",
      &conv2d_ext::kernel_variant);
  // Row shifts of the flat sm_90 layout a pass would use (see
  // conv2d_ext::flat_row_shifts), for tests to check that they cover both.
  m.def(
      "_flat_row_shifts(str pass_, Tensor input, Tensor weight, int[2] stride, "
      "int[2] padding, int[2] dilation, int groups) -> int",
      &conv2d_ext::flat_row_shifts);
  // Accumulation segments of that layout's items (conv2d_ext::flat_segments).
  m.def(
      "_flat_segments(str pass_, Tensor input, Tensor weight, int[2] stride, "
      "int[2] padding, int[2] dilation, int groups) -> int",
      &conv2d_ext::flat_segments);
  // How that layout's 3xTF32 split walks a box (conv2d_ext::flat_tf32x3_rounds).
  m.def(
      "_flat_tf32x3_rounds(str pass_, Tensor input, Tensor weight, int[2] stride, "
      "int[2] padding, int[2] dilation, int groups) -> int[]",
      &conv2d_ext::flat_tf32x3_rounds);
  // The precision mode ('tf32' or 'ieee') a float32 call would use now.
  m.def("_math_mode() -> str", [] {
    return std::string(
        conv2d_ext::to_string(conv2d_ext::math_mode(at::kFloat)));
  });
}
