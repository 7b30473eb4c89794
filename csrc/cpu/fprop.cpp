// Forward pass on the CPU: float32 (and 16-bit, on float32 copies) on the
// register-blocked kernel (blocked.cpp) where it fits; float64 and narrow
// groups as a direct convolution, one (image, output channel) plane per
// task, accumulated in double.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <string>
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
void fprop_direct(const ConvParams& p, const T* x, const T* w, const T* bias,
                  T* y) {
  const int64_t cin_g = p.in_channels_per_group();
  const int64_t cout_g = p.out_channels_per_group();
  const int64_t in_plane = p.in_h * p.in_w;
  const int64_t out_plane = p.out_h * p.out_w;
  at::parallel_for(0, p.batch * p.out_channels, 1, [&](int64_t begin,
                                                       int64_t end) {
    std::vector<double> acc(out_plane);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t n = task / p.out_channels;
      const int64_t co = task % p.out_channels;
      const int64_t g = co / cout_g;
      std::fill(acc.begin(), acc.end(), bias ? double(bias[co]) : 0.0);
      for (int64_t ci = 0; ci < cin_g; ++ci) {
        const T* x_plane = x + (n * p.in_channels + g * cin_g + ci) * in_plane;
        const T* w_taps = w + (co * cin_g + ci) * p.taps();
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
              const T* x_row = x_plane + ih * p.in_w + w_off;
              double* a_row = acc.data() + oh * p.out_w;
              for (int64_t ow = cols.lo; ow < cols.hi; ++ow) {
                a_row[ow] += wv * x_row[ow * p.stride_w];
              }
            }
          }
        }
      }
      T* y_plane = y + task * out_plane;
      for (int64_t i = 0; i < out_plane; ++i) y_plane[i] = T(acc[i]);
    }
  });
}

at::Tensor conv2d_cpu(const at::Tensor& input, const at::Tensor& weight,
                      const c10::optional<at::Tensor>& bias,
                      c10::IntArrayRef stride, c10::IntArrayRef padding,
                      c10::IntArrayRef dilation, int64_t groups) {
  // A channels_last result of the blocked, packed-group or few-pixel
  // kernel, or of a depthwise layer (one output channel per input channel),
  // is computed on the channels_last operands, in place of NCHW copies.
  const auto nhwc = [](const ConvParams& p, at::ScalarType dtype, bool channels_last) {
    return channels_last && cpu_nhwc(p, Pass::kFprop, dtype);
  };
  return fprop_entry(
      input, weight, bias, stride, padding, dilation, groups, nhwc,
      [](const ConvParams& p, const at::Tensor& x, const at::Tensor& w,
         const at::Tensor& b, at::Tensor& y, bool channels_last) {
        if (channels_last) {
          const float* bias_ptr = b.defined() ? b.data_ptr<float>() : nullptr;
          const Algo algo =
              choose_plan(p, Pass::kFprop, x.scalar_type(), /*sm=*/0, /*channels_last=*/true).algo;
          if (algo == Algo::kCpuGrouped) {
            const at::Tensor wn = w.contiguous();  // packed from NCHW
            fprop_grouped_nhwc(p, x.data_ptr<float>(), wn.data_ptr<float>(), bias_ptr,
                               y.data_ptr<float>());
          } else if (algo == Algo::kCpuFewPixels) {  // the weight in its own layout
            fprop_few_pixels(p, x.data_ptr<float>(), w.data_ptr<float>(), bias_ptr,
                             y.data_ptr<float>(), /*nhwc=*/true);
          } else if (algo == Algo::kCpuDepthwise) {
            // (A depthwise weight's channels_last layout is its NCHW one.)
            fprop_depthwise_nhwc(p, x.data_ptr<float>(), w.data_ptr<float>(), bias_ptr,
                                 y.data_ptr<float>());
          } else {
            const at::Tensor wn = w.contiguous();  // packed from NCHW
            fprop_blocked_nhwc(p, x.data_ptr<float>(), wn.data_ptr<float>(), bias_ptr,
                               y.data_ptr<float>());
          }
          return;
        }
        const Algo algo = choose_plan(p, Pass::kFprop, x.scalar_type(), /*sm=*/0).algo;
        if (algo == Algo::kCpuBlocked || algo == Algo::kCpuDepthwise ||
            algo == Algo::kCpuNarrow || algo == Algo::kCpuFewPixels) {
          const float* bias_ptr = b.defined() ? b.data_ptr<float>() : nullptr;
          if (algo == Algo::kCpuBlocked) {
            fprop_blocked(p, x.data_ptr<float>(), w.data_ptr<float>(), bias_ptr,
                          y.data_ptr<float>());
            return;
          }
          if (algo == Algo::kCpuFewPixels) {
            fprop_few_pixels(p, x.data_ptr<float>(), w.data_ptr<float>(), bias_ptr,
                             y.data_ptr<float>());
            return;
          }
          auto* run = algo == Algo::kCpuDepthwise ? &fprop_depthwise : &fprop_narrow;
          run(p, x.data_ptr<float>(), w.data_ptr<float>(), bias_ptr, y.data_ptr<float>());
          return;
        }
        AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "conv2d_ext_fprop_cpu", [&] {
          fprop_direct<scalar_t>(
              p, x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
              b.defined() ? b.data_ptr<scalar_t>() : nullptr,
              y.data_ptr<scalar_t>());
        });
      });
}

}  // namespace

std::string algorithm_cpu(const std::string& pass, const at::Tensor& input,
                          const at::Tensor& weight, c10::IntArrayRef stride,
                          c10::IntArrayRef padding, c10::IntArrayRef dilation,
                          int64_t groups) {
  return algorithm(pass, input, weight, stride, padding, dilation, groups, /*sm=*/0);
}

TORCH_LIBRARY_IMPL(conv2d_ext, CPU, m) {
  m.impl("conv2d", &conv2d_cpu);
  m.impl("_algorithm", &algorithm_cpu);
}

}  // namespace cpu
}  // namespace conv2d_ext
