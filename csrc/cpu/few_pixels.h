// The CPU's few-pixel kernels (few_pixels.cpp): layers whose GEMM has few
// rows, M = output pixels of all images (small planes at small batch, as
// the last stages of a CNN at batch 1). The blocked kernels would spend
// more on packing the weight than on the math, and a row of a few pixels
// fills a fraction of their pixel block; here every pass reads the weight
// once, in its own layout, with the reduction or the weight's row in
// vector registers.
#pragma once

#include <cstdint>

#include "../conv_params.h"

namespace conv2d_ext {
namespace cpu {

// At most this many output pixels over the batch.
constexpr int64_t kFewPixels = 64;
inline bool few_pixels_fits(const ConvParams& p) {
  return p.batch * p.out_h * p.out_w <= kFewPixels;
}

// All operands NCHW contiguous float32 (the weight [K][C per group][R][S]),
// or with `nhwc` channels_last (activations [N][H][W][C], the weight and
// grad_weight as a channels_last weight's memory, [K][R][S][C per group]);
// bias null or [K]. dgrad takes the layer's own weight, at any stride.
void fprop_few_pixels(const ConvParams& p, const float* x, const float* w, const float* bias,
                      float* y, bool nhwc = false);
void dgrad_few_pixels(const ConvParams& p, const float* grad_out, const float* w,
                      float* grad_in, bool nhwc = false);
void wgrad_few_pixels(const ConvParams& p, const float* grad_out, const float* x,
                      float* grad_w, bool nhwc = false);

}  // namespace cpu
}  // namespace conv2d_ext
