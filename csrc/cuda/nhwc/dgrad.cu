// The engine's host code that needs tensor operators, apart from its
// kernels' files (which include TensorBase only): the dgrad's weight, and
// strided dgrad over channels_last operands: one engine forward per stride
// phase (dgrad_phases in conv_params.h), each over grad_output with its
// sub-kernel, writing its pixels of grad_input in place through the
// forward's output map, so no multiply-add touches the zeros a stride
// inserts and no phase result is copied.
#include <ATen/ATen.h>

#include <vector>

#include "../../conv_params.h"
#include "../../options.h"
#include "../common.cuh"
#include "config.h"
#include "nhwc.h"

namespace conv2d_ext {
namespace cuda {

at::TensorBase nhwc_dgrad_weight(const at::TensorBase& w) {
  return at::Tensor(w).flip({2, 3}).permute({1, 2, 3, 0}).contiguous();
}

void launch_dgrad_nhwc_phases(const ConvParams& p, const at::TensorBase& grad_out,
                              const at::TensorBase& w, at::TensorBase& grad_in) {
  TORCH_CHECK(igemm_nhwc::dgrad_phases_fit(p, static_cast<int>(grad_out.element_size())) &&
                  grad_in.is_contiguous(at::MemoryFormat::ChannelsLast),
              "conv2d_ext: internal error: the channels_last strided dgrad got a layer it "
              "does not take");
  // The weight as [C][K][R][S], flipped, so that a phase's sub-kernel is a
  // strided slice of it (as launch_dgrad_phases in ../dgrad.cu).
  const at::Tensor flipped = at::Tensor(w).transpose(0, 1).flip({2, 3});
  const int64_t row_pitch = p.in_w * p.in_channels;
  // The reached phases run one forward each (side by side with the option
  // dgrad_phase_streams).
  const std::vector<DgradPhase> work = reached_phases(p, grad_in);
  for_each_work(static_cast<int>(work.size()), option(Option::kDgradPhaseStreams), [&](int i) {
    const DgradPhase& ph = work[i];
    const ConvParams& f = ph.fprop;
    // Sub-kernel row u is kernel row kh_last - u * kh_step: flipped row
    // KH - 1 - kh_last + u * kh_step. As the forward's [N][R][S][C] weight.
    const at::Tensor sub = flipped.slice(2, p.kernel_h - 1 - ph.kh_last, p.kernel_h, ph.kh_step)
                               .slice(3, p.kernel_w - 1 - ph.kw_last, p.kernel_w, ph.kw_step)
                               .permute({0, 2, 3, 1})
                               .contiguous();
    TORCH_CHECK(sub.size(1) == f.kernel_h && sub.size(2) == f.kernel_w,
                "conv2d_ext: internal error: dgrad phase sub-kernel ", sub.sizes());
    const igemm_nhwc::OutMap out{p.in_h * row_pitch, p.stride_h * row_pitch,
                                 p.stride_w * p.in_channels,
                                 ph.row0 * row_pitch + ph.col0 * p.in_channels};
    launch_fprop_nhwc(f, out, grad_out, sub, at::Tensor(), grad_in);
  });
}

}  // namespace cuda
}  // namespace conv2d_ext
