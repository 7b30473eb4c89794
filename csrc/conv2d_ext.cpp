// Operator schemas. Kernels register per backend next to their code
// (cpu/*.cpp, cuda/*.cu), autograd for every backend in autograd.cpp, fake
// tensors in Python (conv2d_ext/_ops.py).
#include <torch/library.h>

#include <string>

#include "conv_params.h"
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
  // Tests only: fill every output with NaN before kernels run, so that an
  // element a kernel never writes cannot pass. Returns the previous setting.
  m.def("_set_poison_outputs(bool enable) -> bool",
        &conv2d_ext::set_poison_outputs);
  // Tests only: whether the plan may pick Hopper (wgmma) kernels, so that
  // the mma.sync kernels stay tested on a Hopper GPU. Returns the previous
  // setting.
  m.def("_set_hopper_kernels(bool enable) -> bool",
        &conv2d_ext::set_hopper_kernels);
  // Tests only: whether the plan may pick the flat wgmma forward, so that
  // the other wgmma forward stays tested on unit-stride shapes.
  m.def("_set_flat_kernels(bool enable) -> bool", &conv2d_ext::set_flat_kernels);
  // Tests only: whether IEEE-mode wgrad of short reductions runs the direct
  // FFMA kernel (the default), so that the 3xTF32 tensor-core wgrad stays
  // tested on small shapes.
  m.def("_set_short_wgrad_direct(bool enable) -> bool", &conv2d_ext::set_short_wgrad_direct);
  // Whether the few-channel tensor-core wgrad runs its IEEE-mode stage on
  // wgmma on Hopper (the default) or on mma.sync (see plan.h).
  m.def("_set_few_channel_wgrad_wgmma(bool enable) -> bool",
        &conv2d_ext::set_few_channel_wgrad_wgmma);
  // Whether TF32-mode few-channel dgrad runs on tensor cores, all stride
  // phases at once (the default), or on the FFMA gather (see plan.h).
  m.def("_set_few_channel_dgrad_tc(bool enable) -> bool",
        &conv2d_ext::set_few_channel_dgrad_tc);
  // Whether the few-channel FFMA dgrad takes two columns a thread where it
  // can (the default) or one (see plan.h).
  m.def("_set_few_channel_dgrad_pairs(bool enable) -> bool",
        &conv2d_ext::set_few_channel_dgrad_pairs);
  // Whether the few-channel FFMA dgrad starts its heaviest blocks first (the
  // default) or keeps the grid's order (see plan.h).
  m.def("_set_few_channel_dgrad_order(bool enable) -> bool",
        &conv2d_ext::set_few_channel_dgrad_order);
  // Whether the few-channel FFMA dgrad takes 16 x 112 tiles where they fit
  // (the default) or 32 x 64 ones (see plan.h).
  m.def("_set_few_channel_dgrad_wide(bool enable) -> bool",
        &conv2d_ext::set_few_channel_dgrad_wide);
  // Whether the sm_90 IEEE-mode wgrad skips the k8 steps past the output's
  // right edge (the default) or runs them on zeros (see plan.h).
  m.def("_set_wgrad_edge_steps(bool enable) -> bool", &conv2d_ext::set_wgrad_edge_steps);
  // The algorithm a pass ('forward', 'backward_input', 'backward_weight')
  // of a convolution of these forward arguments would run now, e.g. for
  // tests to check which kernels they cover.
  m.def(
      "_algorithm(str pass_, Tensor input, Tensor weight, int[2] stride, "
      "int[2] padding, int[2] dilation, int groups) -> str");
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
  // How that layout's 3xTF32 split walks a box (conv2d_ext::flat_split_rounds).
  m.def(
      "_flat_split_rounds(str pass_, Tensor input, Tensor weight, int[2] stride, "
      "int[2] padding, int[2] dilation, int groups) -> int[]",
      &conv2d_ext::flat_split_rounds);
  // The precision mode ('tf32' or 'ieee') a float32 call would use now.
  m.def("_math_mode() -> str", [] {
    return std::string(
        conv2d_ext::to_string(conv2d_ext::math_mode(at::kFloat)));
  });
}
