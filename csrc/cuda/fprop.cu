// The forward op on CUDA: the plan's kernel for each call (launch_fprop,
// shared with strided dgrad, whose phases are forwards over grad_output),
// and the op's CUDA registrations. The kernels live in one folder per
// family; docs/kernels.md says which runs when.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>

#include "../pass_entry.h"
#include "../plan.h"
#include "common.cuh"
#include "direct/direct.h"
#include "few_channels/few_channels.h"
#include "fprop.h"
#include "implicit_gemm/implicit_gemm.h"
#include "nhwc/nhwc.h"
#include "sm90/sm90.h"

namespace conv2d_ext {
namespace cuda {
namespace {

at::Tensor conv2d_cuda(const at::Tensor& input, const at::Tensor& weight,
                       const c10::optional<at::Tensor>& bias,
                       c10::IntArrayRef stride, c10::IntArrayRef padding,
                       c10::IntArrayRef dilation, int64_t groups) {
  // The entry asks once, under its device guard, whether the channels_last
  // engine runs; the launch then takes that answer rather than asking again.
  return fprop_entry(
      input, weight, bias, stride, padding, dilation, groups,
      [](const ConvParams& p, at::ScalarType dtype, bool channels_last) {
        return nhwc_engine_runs(p, Pass::kFprop, dtype, current_sm(), channels_last);
      },
      launch_fprop);
}

}  // namespace

void launch_fprop(const ConvParams& p, const at::Tensor& x, const at::Tensor& w,
                  const at::Tensor& b, at::Tensor& y, bool nhwc) {
  if (nhwc) {  // x, w, y channels_last: the engine, as the caller's plan said
    launch_fprop_nhwc(p, x, w.permute({0, 2, 3, 1}).contiguous(), b, y);
    return;
  }
  const Plan plan = choose_plan(p, Pass::kFprop, x.scalar_type(), current_sm());
  switch (plan.algo) {
    case Algo::kImplicitGemm:
    case Algo::kImplicitGemmSm90:  // float32 only
      launch_fprop_implicit_gemm(p, x, w, b.defined() ? b.data_ptr<float>() : nullptr, y,
                                 plan.math, plan.algo == Algo::kImplicitGemmSm90,
                                 WeightOrder::kFprop);
      return;
    case Algo::kImplicitGemmSm90Flat:
      launch_fprop_sm90_flat(p, x, w, b.defined() ? b.data_ptr<float>() : nullptr, y,
                             plan.math, WeightOrder::kFprop);
      return;
    case Algo::kFewChannels:  // float32 only
      launch_fprop_few_channels(p, x, w, b.defined() ? b.data_ptr<float>() : nullptr, y,
                                  WeightOrder::kFprop);
      return;
    case Algo::kFewChannelsTensorCore:  // float32 only
      launch_fprop_few_channels_tc(p, x, w, b.defined() ? b.data_ptr<float>() : nullptr, y,
                                     plan.math);
      return;
    case Algo::kDirect:
      launch_fprop_direct(p, x, w, b, y);
      return;
    case Algo::kDgradPhases:      // a dgrad algorithm
    case Algo::kImplicitGemmNhwc:  // not without channels_last operands
    case Algo::kCpuBlocked:  // the CPU's
    case Algo::kCpuDepthwise:
      break;
  }
  TORCH_CHECK(false, "conv2d_ext: no CUDA fprop kernel for algorithm ", to_string(plan.algo));
}

std::string algorithm_cuda(const std::string& pass, const at::Tensor& input,
                           const at::Tensor& weight, c10::IntArrayRef stride,
                           c10::IntArrayRef padding, c10::IntArrayRef dilation,
                           int64_t groups) {
  const c10::cuda::CUDAGuard guard(input.device());
  return algorithm(pass, input, weight, stride, padding, dilation, groups, current_sm());
}

TORCH_LIBRARY_IMPL(conv2d_ext, CUDA, m) {
  m.impl("conv2d", &conv2d_cuda);
  m.impl("_algorithm", &algorithm_cuda);
}

}  // namespace cuda
}  // namespace conv2d_ext
