// The wgrad op on CUDA: the plan's kernel for each call, and the op's
// registration. docs/kernels.md says which kernel runs when.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../pass_entry.h"
#include "../plan.h"
#include "common.cuh"
#include "direct/direct.h"
#include "few_channels/few_channels.h"
#include "implicit_gemm/implicit_gemm.h"
#include "nhwc/nhwc.h"
#include "sm90/sm90.h"

namespace conv2d_ext {
namespace cuda {
namespace {
at::Tensor conv2d_backward_weight_cuda(const at::Tensor& grad_output,
                                       const at::Tensor& input,
                                       c10::IntArrayRef weight_size,
                                       c10::IntArrayRef stride,
                                       c10::IntArrayRef padding,
                                       c10::IntArrayRef dilation,
                                       int64_t groups) {
  // As the forward: the entry asks once, under its device guard, whether the
  // channels_last engine runs, and the launch takes that answer.
  return wgrad_entry(
      grad_output, input, weight_size, stride, padding, dilation, groups,
      [](const ConvParams& p, at::ScalarType dtype, bool channels_last) {
        return nhwc_engine_runs(p, Pass::kWgrad, dtype, current_sm(), channels_last);
      },
      [&](const ConvParams& p, const at::Tensor& go, const at::Tensor& x,
          at::Tensor& grad_w, bool nhwc) {
        if (nhwc) {  // go, x, grad_w channels_last
          launch_wgrad_nhwc(p, go, x, grad_w);
          return;
        }
        const Plan plan = choose_plan(p, Pass::kWgrad, go.scalar_type(), current_sm());
        switch (plan.algo) {
          case Algo::kImplicitGemm:  // float32 only
            launch_wgrad_implicit_gemm(p, go, x, grad_w, plan.math);
            return;
          case Algo::kImplicitGemmSm90:  // float32 only
            launch_wgrad_sm90(p, go, x, grad_w, plan.math);
            return;
          case Algo::kFewChannels:  // float32 only
            launch_wgrad_few_channels(p, go, x, grad_w);
            return;
          case Algo::kFewChannelsTensorCore:  // float32 only
            launch_wgrad_few_channels_tc(p, go, x, grad_w, plan.math);
            return;
          case Algo::kDirect:
            launch_wgrad_direct(p, go, x, grad_w);
            return;
          case Algo::kImplicitGemmSm90Flat:
          case Algo::kDgradPhases:
          case Algo::kImplicitGemmNhwc:  // not without channels_last operands
          case Algo::kCpuBlocked:  // the CPU's
          case Algo::kCpuDepthwise:
            break;
        }
        TORCH_CHECK(false, "conv2d_ext: no CUDA wgrad kernel for algorithm ",
                    to_string(plan.algo));
      });
}

}  // namespace

TORCH_LIBRARY_IMPL(conv2d_ext, CUDA, m) {
  m.impl("conv2d_backward_weight", &conv2d_backward_weight_cuda);
}

}  // namespace cuda
}  // namespace conv2d_ext
