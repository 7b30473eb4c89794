// The dgrad op on CUDA: the plan's kernel for each call. Where dgrad is a
// forward pass (unit stride: dgrad_is_fprop), the forward kernels run it on
// the transposed, rotated weight; at stride > 1 on tensor-core channel
// counts, one forward per stride phase of the input (launch_dgrad_phases,
// below; on channels_last operands nhwc/dgrad.cu's, in place). docs/kernels.md
// says which kernel runs when.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

#include "../pass_entry.h"
#include "../options.h"
#include "../plan.h"
#include "common.cuh"
#include "direct/direct.h"
#include "few_channels/config.h"
#include "few_channels/few_channels.h"
#include "fprop.h"
#include "implicit_gemm/implicit_gemm.h"
#include "nhwc/nhwc.h"
#include "sm90/sm90.h"

namespace conv2d_ext {
namespace cuda {
namespace {
// Strided dgrad, phase by phase: each phase's forward writes a compact
// tensor, copied into its strided slice of grad_input (an extra pass over
// grad_input: the forward kernels write dense outputs only).
void launch_dgrad_phases(const ConvParams& p, const at::Tensor& go, const at::Tensor& w,
                         at::Tensor& grad_in) {
  const int64_t cin_g = p.in_channels_per_group(), cout_g = p.out_channels_per_group();
  // Each group's weight transposed (input and output channels swapped) and
  // flipped, so that a phase's sub-kernel is a strided slice of it.
  const at::Tensor flipped = w.view({p.groups, cout_g, cin_g, p.kernel_h, p.kernel_w})
                                 .transpose(1, 2)
                                 .reshape({p.in_channels, cout_g, p.kernel_h, p.kernel_w})
                                 .flip({2, 3});
  // The reached phases run one forward each (side by side with the option
  // dgrad_phase_streams).
  const std::vector<DgradPhase> work = reached_phases(p, grad_in);
  for_each_work(static_cast<int>(work.size()), option(Option::kDgradPhaseStreams), [&](int i) {
    const DgradPhase& ph = work[i];
    const ConvParams& f = ph.fprop;
    // Sub-kernel row u is kernel row kh_last - u * kh_step: flipped row
    // KH - 1 - kh_last + u * kh_step.
    const at::Tensor sub = flipped.slice(2, p.kernel_h - 1 - ph.kh_last, p.kernel_h, ph.kh_step)
                               .slice(3, p.kernel_w - 1 - ph.kw_last, p.kernel_w, ph.kw_step)
                               .contiguous();
    TORCH_CHECK(sub.size(2) == f.kernel_h && sub.size(3) == f.kernel_w,
                "conv2d_ext: internal error: dgrad phase sub-kernel ", sub.sizes());
    at::Tensor y = at::empty({p.batch, p.in_channels, f.out_h, f.out_w}, grad_in.options());
    // A phase whose first tap reads past grad_output's first row starts
    // later (rare: padding past the kernel's reach); copied, as the forward
    // kernels take contiguous inputs.
    const at::Tensor src = ph.row_skip > 0 || ph.col_skip > 0
                               ? go.slice(2, ph.row_skip).slice(3, ph.col_skip).contiguous()
                               : go;
    launch_fprop(f, src, sub, at::Tensor(), y);
    grad_in.slice(2, ph.row0, p.in_h, p.stride_h).slice(3, ph.col0, p.in_w, p.stride_w).copy_(y);
  });
}

at::Tensor conv2d_backward_input_cuda(const at::Tensor& grad_output,
                                      const at::Tensor& weight,
                                      c10::IntArrayRef input_size,
                                      c10::IntArrayRef stride,
                                      c10::IntArrayRef padding,
                                      c10::IntArrayRef dilation,
                                      int64_t groups) {
  // As the forward: the entry asks once, under its device guard, whether the
  // channels_last engine runs, and the launch takes that answer.
  return dgrad_entry(
      grad_output, weight, input_size, stride, padding, dilation, groups,
      [](const ConvParams& p, at::ScalarType dtype, bool channels_last) {
        return nhwc_engine_runs(p, Pass::kDgrad, dtype, current_sm(), channels_last);
      },
      [&](const ConvParams& p, const at::Tensor& go, const at::Tensor& w,
          at::Tensor& grad_in, bool nhwc) {
        if (nhwc) {  // go, grad_in channels_last
          if (dgrad_is_fprop(p)) {
            launch_fprop_nhwc(dgrad_as_fprop(p), go, nhwc_dgrad_weight(w), at::Tensor(),
                              grad_in);
          } else {
            launch_dgrad_nhwc_phases(p, go, w, grad_in);
          }
          return;
        }
        const Plan plan = choose_plan(p, Pass::kDgrad, go.scalar_type(), current_sm());
        switch (plan.algo) {
          case Algo::kImplicitGemm:
          case Algo::kImplicitGemmSm90:  // float32 only
            launch_fprop_implicit_gemm(dgrad_as_fprop(p), go, w, /*bias=*/nullptr, grad_in,
                                       plan.math, plan.algo == Algo::kImplicitGemmSm90,
                                       WeightOrder::kDgrad);
            return;
          case Algo::kImplicitGemmSm90Flat:
            launch_fprop_sm90_flat(dgrad_as_fprop(p), go, w, /*bias=*/nullptr, grad_in,
                                   plan.math, WeightOrder::kDgrad);
            return;
          case Algo::kFewChannels:  // float32 only
            if (few_channels::dgrad_runs_as_fprop(p)) {
              launch_fprop_few_channels(dgrad_as_fprop(p), go, w, /*bias=*/nullptr, grad_in,
                                          WeightOrder::kDgrad);
            } else {
              launch_dgrad_few_channels(p, go, w, grad_in);
            }
            return;
          case Algo::kDgradPhases:  // float32 only
            launch_dgrad_phases(p, go, w, grad_in);
            return;
          case Algo::kDirect:
            launch_dgrad_direct(p, go, w, grad_in);
            return;
          case Algo::kFewChannelsTensorCore:  // float32 only
            launch_dgrad_few_channels_tc(p, go, w, grad_in);
            return;
          case Algo::kImplicitGemmNhwc:  // not without channels_last operands
          case Algo::kCpuBlocked:  // the CPU's
          case Algo::kCpuDepthwise:
            break;
        }
        TORCH_CHECK(false, "conv2d_ext: no CUDA dgrad kernel for algorithm ",
                    to_string(plan.algo));
      });
}

}  // namespace

TORCH_LIBRARY_IMPL(conv2d_ext, CUDA, m) {
  m.impl("conv2d_backward_input", &conv2d_backward_input_cuda);
}

}  // namespace cuda
}  // namespace conv2d_ext
