// The channels_last implicit-GEMM engine (sm_80 and newer): operands and
// results in NHWC, the GEMM over the whole batch. float32 in TF32 mode;
// float16 and bfloat16 on Hopper's wgmma forward. Tiles: config.h.
#pragma once

#include <ATen/core/TensorBase.h>
#include <c10/util/Exception.h>

#include <cstdint>

#include "../../conv_params.h"
#include "config.h"

namespace conv2d_ext {
namespace cuda {

// y = conv(x, w) + bias: x and y channels_last, w as [N][R][S][C]
// contiguous (a channels_last weight's memory), bias undefined or [N], all
// of one dtype (float32, or float16 / bfloat16 where the plan says
// native_16bit). Also dgrad at unit stride: p = dgrad_as_fprop(layer),
// x = grad_output, w = the layer's weight flipped and transposed
// (nhwc_dgrad_weight).
void launch_fprop_nhwc(const ConvParams& p, const at::TensorBase& x, const at::TensorBase& w_nrsc,
                       const at::TensorBase& bias, at::TensorBase& y);

// The same, writing output pixels where `out` places them in y's memory
// (y channels_last, p.out_channels channels).
void launch_fprop_nhwc(const ConvParams& p, const igemm_nhwc::OutMap& out, const at::TensorBase& x,
                       const at::TensorBase& w_nrsc, const at::TensorBase& bias, at::TensorBase& y);

// grad_input of a strided layer (igemm_nhwc::dgrad_phases_fit): one forward
// per stride phase, each writing its pixels of grad_input in place; phases
// no tap reaches are zeroed.
void launch_dgrad_nhwc_phases(const ConvParams& p, const at::TensorBase& grad_out,
                              const at::TensorBase& w, at::TensorBase& grad_in);

// The forward on wgmma (fprop_sm90.cuh; 128 x 256, 128 x 128 or 128 x 64
// tiles, K split as `k` says), launched by launch_fprop_nhwc with its
// operands checked. E: float, __half or __nv_bfloat16 (fprop_sm90_*.cu).
template <typename E>
void launch_fprop_nhwc_wgmma(const ConvParams& p, const igemm_nhwc::OutMap& out, const E* x,
                             const E* w, const E* bias, E* y, const igemm_nhwc::FpropKernel& k);

// The forward's grid: M x N tiles, and K tiles of 128 bytes of channels
// per tap (elements of elem_bytes).
struct NhwcGrid {
  int64_t m_tiles, n_tiles, c_tiles, k_tiles;
};
inline NhwcGrid nhwc_fprop_grid(const ConvParams& p, const igemm_nhwc::Tile& t,
                                int elem_bytes = 4) {
  const int64_t bk = igemm_nhwc::block_k(elem_bytes);
  NhwcGrid g{(p.gemm_m() + t.m - 1) / t.m, (p.out_channels + t.n - 1) / t.n,
              (p.in_channels + bk - 1) / bk, igemm_nhwc::k_tiles(p, elem_bytes)};
  TORCH_CHECK(g.m_tiles * g.n_tiles < (int64_t(1) << 31) && g.k_tiles < (int64_t(1) << 31),
              "conv2d_ext: problem too large for the channels_last engine");
  return g;
}

// grad_w of a channels_last layer: grad_out, x and grad_w channels_last
// (grad_w's memory [K][R][S][C]); split over the pixels where tiles are
// few, reduced in a fixed order.
void launch_wgrad_nhwc(const ConvParams& p, const at::TensorBase& grad_out, const at::TensorBase& x,
                       at::TensorBase& grad_w);

// The layer's weight [K][C][R][S] as the forward weight of its unit-stride
// dgrad: [C][R][S][K], taps flipped.
at::TensorBase nhwc_dgrad_weight(const at::TensorBase& w);

}  // namespace cuda
}  // namespace conv2d_ext
