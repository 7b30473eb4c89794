// Backward-data pass on the CPU. Where the plan takes the blocked, narrow,
// packed-group or depthwise kernel, dgrad runs as forwards on the weight
// transposed per group and flipped: one at unit stride (dgrad_is_fprop),
// else one per stride phase of grad_input (dgrad_phases), each over its
// sub-kernel, so no multiply-add touches the zeros a stride inserts; a
// strided depthwise dgrad has kernels of its own instead (each grad_input
// pixel summing the taps that reach it), and the few-pixel kernel takes
// any stride itself. Otherwise each task owns one (image, input channel)
// plane of grad_input and scatters every grad_output tap that reaches it,
// so tasks never write the same memory.
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
void dgrad_direct(const ConvParams& p, const T* grad_out, const T* w,
                  T* grad_in) {
  const int64_t cin_g = p.in_channels_per_group();
  const int64_t cout_g = p.out_channels_per_group();
  const int64_t in_plane = p.in_h * p.in_w;
  const int64_t out_plane = p.out_h * p.out_w;
  at::parallel_for(0, p.batch * p.in_channels, 1, [&](int64_t begin,
                                                      int64_t end) {
    std::vector<double> acc(in_plane);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t n = task / p.in_channels;
      const int64_t ci = task % p.in_channels;
      const int64_t g = ci / cin_g;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t col = 0; col < cout_g; ++col) {
        const int64_t co = g * cout_g + col;
        const T* go_plane = grad_out + (n * p.out_channels + co) * out_plane;
        const T* w_taps = w + (co * cin_g + ci % cin_g) * p.taps();
        for (int64_t kh = 0; kh < p.kernel_h; ++kh) {
          const Range rows = valid_outputs(p.out_h, p.in_h, p.stride_h,
                                           kh * p.dilation_h - p.pad_h);
          for (int64_t kw = 0; kw < p.kernel_w; ++kw) {
            const int64_t w_off = kw * p.dilation_w - p.pad_w;
            const Range cols =
                valid_outputs(p.out_w, p.in_w, p.stride_w, w_off);
            const double wv = w_taps[kh * p.kernel_w + kw];
            for (int64_t oh = rows.lo; oh < rows.hi; ++oh) {
              const int64_t ih = oh * p.stride_h + kh * p.dilation_h - p.pad_h;
              double* a_row = acc.data() + ih * p.in_w + w_off;
              const T* g_row = go_plane + oh * p.out_w;
              for (int64_t ow = cols.lo; ow < cols.hi; ++ow) {
                a_row[ow * p.stride_w] += wv * g_row[ow];
              }
            }
          }
        }
      }
      T* gi_plane = grad_in + task * in_plane;
      for (int64_t i = 0; i < in_plane; ++i) gi_plane[i] = T(acc[i]);
    }
  });
}

// Each group's [K][C][R][S] as [C][K][R][S], taps flipped: the forward
// weight of dgrad_as_fprop(p), of which a phase's sub-kernel is a strided
// slice.
at::Tensor dgrad_weight(const ConvParams& p, const at::Tensor& w) {
  const int64_t cin = p.in_channels_per_group(), cout = p.out_channels_per_group();
  return w.view({p.groups, cout, cin, p.kernel_h, p.kernel_w})
      .transpose(1, 2)
      .flip({3, 4})
      .reshape({p.in_channels, cout, p.kernel_h, p.kernel_w});
}

using Forward = void (*)(const ConvParams&, const float*, const float*, const float*, float*);

// Strided dgrad phase by phase: each phase's forward writes a compact
// tensor, copied into its strided slice of grad_input. `format`: the
// operands' memory format, which the forward takes.
void dgrad_phases_on(Forward forward, at::MemoryFormat format, const ConvParams& p,
                     const at::Tensor& go, const at::Tensor& w, at::Tensor& grad_in) {
  const at::Tensor flipped = dgrad_weight(p, w);
  for (const DgradPhase& ph : dgrad_phases(p)) {
    const ConvParams& f = ph.fprop;
    at::Tensor dst = grad_in.slice(2, ph.row0, p.in_h, p.stride_h)
                         .slice(3, ph.col0, p.in_w, p.stride_w);
    if (f.kernel_h == 0 || f.kernel_w == 0) {
      dst.zero_();
      continue;
    }
    // Sub-kernel row u is kernel row kh_last - u * kh_step: flipped row
    // KH - 1 - kh_last + u * kh_step.
    const at::Tensor sub = flipped.slice(2, p.kernel_h - 1 - ph.kh_last, p.kernel_h, ph.kh_step)
                               .slice(3, p.kernel_w - 1 - ph.kw_last, p.kernel_w, ph.kw_step)
                               .contiguous();
    TORCH_CHECK(sub.size(2) == f.kernel_h && sub.size(3) == f.kernel_w,
                "conv2d_ext: internal error: dgrad phase sub-kernel ", sub.sizes());
    // A phase whose first tap reads past grad_output's first row reads it
    // from a later row (dgrad_phases).
    const at::Tensor src = ph.row_skip > 0 || ph.col_skip > 0
                               ? go.slice(2, ph.row_skip).slice(3, ph.col_skip).contiguous(format)
                               : go;
    at::Tensor y = at::empty({p.batch, p.in_channels, f.out_h, f.out_w},
                             grad_in.options().memory_format(format));
    forward(f, src.data_ptr<float>(), sub.data_ptr<float>(), nullptr, y.data_ptr<float>());
    dst.copy_(y);
  }
}

at::Tensor conv2d_backward_input_cpu(const at::Tensor& grad_output,
                                     const at::Tensor& weight,
                                     c10::IntArrayRef input_size,
                                     c10::IntArrayRef stride,
                                     c10::IntArrayRef padding,
                                     c10::IntArrayRef dilation,
                                     int64_t groups) {
  // A channels_last grad_input of the blocked, packed-group, few-pixel or
  // depthwise kernels (cpu_nhwc) is computed on the channels_last operands,
  // in place of NCHW copies.
  const auto nhwc = [](const ConvParams& p, at::ScalarType dtype, bool channels_last) {
    return channels_last && cpu_nhwc(p, Pass::kDgrad, dtype);
  };
  return dgrad_entry(
      grad_output, weight, input_size, stride, padding, dilation, groups, nhwc,
      [](const ConvParams& p, const at::Tensor& go, const at::Tensor& w,
         at::Tensor& grad_in, bool channels_last) {
        if (channels_last) {  // go, grad_in channels_last; w as given
          const Algo algo =
              choose_plan(p, Pass::kDgrad, go.scalar_type(), /*sm=*/0, /*channels_last=*/true).algo;
          if (algo == Algo::kCpuGrouped) {  // forwards on the flipped weight, by phases if strided
            if (!dgrad_is_fprop(p)) {
              dgrad_phases_on(
                  [](const ConvParams& f, const float* x, const float* sub, const float* b,
                     float* y) { fprop_grouped_nhwc(f, x, sub, b, y); },
                  at::MemoryFormat::ChannelsLast, p, go, w, grad_in);
              return;
            }
            const at::Tensor wt = dgrad_weight(p, w).contiguous();
            fprop_grouped_nhwc(dgrad_as_fprop(p), go.data_ptr<float>(), wt.data_ptr<float>(),
                               nullptr, grad_in.data_ptr<float>());
            return;
          }
          if (algo == Algo::kCpuFewPixels) {  // any stride; the weight in its own layout
            const at::Tensor wc = w.contiguous(at::MemoryFormat::ChannelsLast);
            dgrad_few_pixels(p, go.data_ptr<float>(), wc.data_ptr<float>(),
                             grad_in.data_ptr<float>(), /*nhwc=*/true);
            return;
          }
          if (algo == Algo::kCpuDepthwise) {  // strided: every grad_input pixel's taps
            if (!dgrad_is_fprop(p)) {
              const at::Tensor wc = w.contiguous();
              dgrad_depthwise_nhwc(p, go.data_ptr<float>(), wc.data_ptr<float>(),
                                   grad_in.data_ptr<float>());
              return;
            }
            const at::Tensor wt = dgrad_weight(p, w).contiguous();
            fprop_depthwise_nhwc(dgrad_as_fprop(p), go.data_ptr<float>(), wt.data_ptr<float>(),
                                 nullptr, grad_in.data_ptr<float>());
            return;
          }
          if (!dgrad_is_fprop(p)) {
            dgrad_phases_on(
                [](const ConvParams& f, const float* x, const float* sub, const float* b,
                   float* y) { fprop_blocked_nhwc(f, x, sub, b, y); },
                at::MemoryFormat::ChannelsLast, p, go, w, grad_in);
            return;
          }
          // Packed straight from the layer's weight, transposed and flipped.
          const at::Tensor wn = w.contiguous();
          fprop_blocked_nhwc(dgrad_as_fprop(p), go.data_ptr<float>(), wn.data_ptr<float>(),
                             nullptr, grad_in.data_ptr<float>(), WeightOrder::kDgrad);
          return;
        }
        const Algo algo = choose_plan(p, Pass::kDgrad, go.scalar_type(), /*sm=*/0).algo;
        if (algo == Algo::kCpuFewPixels) {
          dgrad_few_pixels(p, go.data_ptr<float>(), w.data_ptr<float>(),
                           grad_in.data_ptr<float>());
          return;
        }
        if (algo == Algo::kCpuBlocked || algo == Algo::kCpuDepthwise ||
            algo == Algo::kCpuNarrow) {
          const Forward blocked = [](const ConvParams& f, const float* x, const float* sub,
                                     const float* b, float* y) { fprop_blocked(f, x, sub, b, y); };
          const Forward forward = algo == Algo::kCpuBlocked     ? blocked
                                  : algo == Algo::kCpuDepthwise ? &fprop_depthwise
                                                                : &fprop_narrow;
          if (!dgrad_is_fprop(p)) {
            if (algo == Algo::kCpuDepthwise) {  // column stride 2 (the plan's)
              dgrad_depthwise_s2(p, go.data_ptr<float>(), w.data_ptr<float>(),
                                 grad_in.data_ptr<float>());
              return;
            }
            dgrad_phases_on(forward, at::MemoryFormat::Contiguous, p, go, w, grad_in);
            return;
          }
          if (algo == Algo::kCpuBlocked) {  // packed straight from the layer's weight
            fprop_blocked(dgrad_as_fprop(p), go.data_ptr<float>(), w.data_ptr<float>(), nullptr,
                          grad_in.data_ptr<float>(), WeightOrder::kDgrad);
            return;
          }
          const at::Tensor wt = dgrad_weight(p, w).contiguous();
          forward(dgrad_as_fprop(p), go.data_ptr<float>(), wt.data_ptr<float>(), nullptr,
                  grad_in.data_ptr<float>());
          return;
        }
        AT_DISPATCH_FLOATING_TYPES(go.scalar_type(), "conv2d_ext_dgrad_cpu", [&] {
          dgrad_direct<scalar_t>(p, go.data_ptr<scalar_t>(),
                                 w.data_ptr<scalar_t>(),
                                 grad_in.data_ptr<scalar_t>());
        });
      });
}

}  // namespace

TORCH_LIBRARY_IMPL(conv2d_ext, CPU, m) {
  m.impl("conv2d_backward_input", &conv2d_backward_input_cpu);
}

}  // namespace cpu
}  // namespace conv2d_ext
