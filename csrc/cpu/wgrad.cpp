// Backward-weight pass on the CPU: float32 (and 16-bit, on float32 copies)
// on the blocked kernel where the plan says so (blocked.cpp); otherwise
// each task owns one (output channel, input channel) pair and reduces all
// of its taps over the batch and the output plane in a fixed order, so the
// result is deterministic.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "../conv_params.h"
#include "../pass_entry.h"
#include "../plan.h"
#include "blocked.h"
#include "few_pixels.h"
#include "grouped.h"
#include "loops.h"

namespace conv2d_ext {
namespace cpu {
namespace {

template <typename T>
void wgrad_direct(const ConvParams& p, const T* grad_out, const T* x,
                  T* grad_w) {
  const int64_t cin_g = p.in_channels_per_group();
  const int64_t cout_g = p.out_channels_per_group();
  const int64_t in_plane = p.in_h * p.in_w;
  const int64_t out_plane = p.out_h * p.out_w;
  at::parallel_for(0, p.out_channels * cin_g, 1, [&](int64_t begin,
                                                     int64_t end) {
    std::vector<double> acc(p.taps());
    for (int64_t task = begin; task < end; ++task) {
      const int64_t co = task / cin_g;
      const int64_t ci = (co / cout_g) * cin_g + task % cin_g;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t n = 0; n < p.batch; ++n) {
        const T* go_plane = grad_out + (n * p.out_channels + co) * out_plane;
        const T* x_plane = x + (n * p.in_channels + ci) * in_plane;
        for (int64_t kh = 0; kh < p.kernel_h; ++kh) {
          const Range rows = valid_outputs(p.out_h, p.in_h, p.stride_h,
                                           kh * p.dilation_h - p.pad_h);
          for (int64_t kw = 0; kw < p.kernel_w; ++kw) {
            const int64_t w_off = kw * p.dilation_w - p.pad_w;
            const Range cols =
                valid_outputs(p.out_w, p.in_w, p.stride_w, w_off);
            double sum = 0.0;
            for (int64_t oh = rows.lo; oh < rows.hi; ++oh) {
              const int64_t ih = oh * p.stride_h + kh * p.dilation_h - p.pad_h;
              const T* x_row = x_plane + ih * p.in_w + w_off;
              const T* g_row = go_plane + oh * p.out_w;
              for (int64_t ow = cols.lo; ow < cols.hi; ++ow) {
                sum += double(g_row[ow]) * x_row[ow * p.stride_w];
              }
            }
            acc[kh * p.kernel_w + kw] += sum;
          }
        }
      }
      T* gw_taps = grad_w + task * p.taps();
      for (int64_t t = 0; t < p.taps(); ++t) gw_taps[t] = T(acc[t]);
    }
  });
}

at::Tensor conv2d_backward_weight_cpu(const at::Tensor& grad_output,
                                      const at::Tensor& input,
                                      c10::IntArrayRef weight_size,
                                      c10::IntArrayRef stride,
                                      c10::IntArrayRef padding,
                                      c10::IntArrayRef dilation,
                                      int64_t groups) {
  // A channels_last grad_weight of the blocked, packed-group or few-pixel
  // kernel, or of a depthwise layer (cpu_nhwc), is computed on the
  // channels_last operands, in place of NCHW copies.
  const auto nhwc = [](const ConvParams& p, at::ScalarType dtype, bool channels_last) {
    return channels_last && cpu_nhwc(p, Pass::kWgrad, dtype);
  };
  return wgrad_entry(
      grad_output, input, weight_size, stride, padding, dilation, groups, nhwc,
      [](const ConvParams& p, const at::Tensor& go, const at::Tensor& x,
         at::Tensor& grad_w, bool channels_last) {
        if (channels_last) {
          const Algo algo =
              choose_plan(p, Pass::kWgrad, go.scalar_type(), /*sm=*/0, /*channels_last=*/true).algo;
          if (algo == Algo::kCpuGrouped) {
            wgrad_grouped_nhwc(p, go.data_ptr<float>(), x.data_ptr<float>(),
                               grad_w.data_ptr<float>());
            return;
          }
          if (algo == Algo::kCpuFewPixels) {  // grad_w written in its own layout
            wgrad_few_pixels(p, go.data_ptr<float>(), x.data_ptr<float>(),
                             grad_w.data_ptr<float>(), /*nhwc=*/true);
            return;
          }
          if (algo == Algo::kCpuDepthwise) {
            wgrad_depthwise_nhwc(p, go.data_ptr<float>(), x.data_ptr<float>(),
                                 grad_w.data_ptr<float>());
            return;
          }
          wgrad_blocked_nhwc(p, go.data_ptr<float>(), x.data_ptr<float>(),
                             grad_w.data_ptr<float>());
          return;
        }
        const Algo algo = choose_plan(p, Pass::kWgrad, go.scalar_type(), /*sm=*/0).algo;
        if (algo == Algo::kCpuBlocked || algo == Algo::kCpuDepthwise ||
            algo == Algo::kCpuNarrow || algo == Algo::kCpuFewPixels) {
          // Depthwise layers' wgrad is the narrow kernel's.
          if (algo == Algo::kCpuFewPixels) {
            wgrad_few_pixels(p, go.data_ptr<float>(), x.data_ptr<float>(),
                             grad_w.data_ptr<float>());
            return;
          }
          auto* run = algo == Algo::kCpuBlocked ? &wgrad_blocked : &wgrad_narrow;
          run(p, go.data_ptr<float>(), x.data_ptr<float>(), grad_w.data_ptr<float>());
          return;
        }
        AT_DISPATCH_FLOATING_TYPES(go.scalar_type(), "conv2d_ext_wgrad_cpu", [&] {
          wgrad_direct<scalar_t>(p, go.data_ptr<scalar_t>(),
                                 x.data_ptr<scalar_t>(),
                                 grad_w.data_ptr<scalar_t>());
        });
      });
}

}  // namespace

TORCH_LIBRARY_IMPL(conv2d_ext, CPU, m) {
  m.impl("conv2d_backward_weight", &conv2d_backward_weight_cpu);
}

}  // namespace cpu
}  // namespace conv2d_ext
