// Tile shapes of the tensor-core implicit-GEMM kernels, shared by the kernels
// and by the plan that decides whether a problem fits them.
#pragma once

#include <cstdint>

#include "conv_params.h"

namespace conv2d_ext {
namespace igemm_fprop {

constexpr int kRows = 8;         // output rows per block
constexpr int kRowsPerWarp = 2;  // output rows of one warp's tile
constexpr int kCols = 32;        // output columns per block: two m16 fragments
constexpr int kCo = 64;          // output channels per block: eight n8 fragments
constexpr int kChunk = 8;        // input channels per K step (one k8 MMA)
constexpr int kWarps = kRows / kRowsPerWarp;
constexpr int kThreads = 32 * kWarps;
// m16 fragments of a warp tile: every B fragment read from shared memory
// feeds this many MMAs.
constexpr int kWarpFrags = 2 * kRowsPerWarp;
constexpr int64_t kMaxSmemBytes = 200 * 1024;

// Floats of one tap of the weight stages. mma.sync: 8 n-fragments x 32
// lanes x 2 registers in the order the lanes read them (3xTF32 splits them
// as it goes). wgmma: the 8 x 64 B tile as core matrices (see
// wgmma_desc_k8), and for 3xTF32 its small parts as a second tile.
C10_HOST_DEVICE inline int weight_floats_per_tap(bool wgmma, bool split) {
  return kCo * kChunk * (wgmma && split ? 2 : 1);
}

struct Layout {
  int halo_rows, halo_cols, plane;  // plane: halo_rows*halo_cols, padded
  int chunks, co_tiles;
  // Kernel rows per pipeline stage: all of them for small kernels, so that
  // a 3x3 stage holds 9 taps of MMAs between barriers rather than 3.
  int rows_per_stage;
  int weight_floats_per_tap;
  int64_t smem_bytes;  // INT64_MAX when the halo alone could not fit
};

constexpr int kMaxTapsPerStage = 16;

inline Layout layout(const ConvParams& p, int weight_floats_per_tap) {
  Layout l{};
  l.weight_floats_per_tap = weight_floats_per_tap;
  // In 64 bits first: huge strides or dilations would wrap an int.
  const int64_t rows = (kRows - 1) * p.stride_h + (p.kernel_h - 1) * p.dilation_h + 1;
  const int64_t cols = (kCols - 1) * p.stride_w + (p.kernel_w - 1) * p.dilation_w + 1;
  if (rows * cols > kMaxSmemBytes) {
    l.smem_bytes = INT64_MAX;
    return l;
  }
  l.halo_rows = static_cast<int>(rows);
  l.halo_cols = static_cast<int>(cols);
  // Lanes reading one A fragment touch 4 channel planes x 8 columns: a
  // plane size of 8 mod 32 puts them in 32 different banks.
  const int area = l.halo_rows * l.halo_cols;
  l.plane = area + ((8 - area % 32) + 32) % 32;
  l.chunks = static_cast<int>((p.in_channels_per_group() + kChunk - 1) / kChunk);
  l.co_tiles = static_cast<int>((p.out_channels_per_group() + kCo - 1) / kCo);
  l.rows_per_stage = p.kernel_h * p.kernel_w <= kMaxTapsPerStage
                         ? static_cast<int>(p.kernel_h) : 1;
  l.smem_bytes = 4 * (2 * int64_t(kChunk) * l.plane +
                      2 * l.rows_per_stage * p.kernel_w * int64_t(weight_floats_per_tap));
  return l;
}

// Whether the tile machinery covers this problem (any kernel size whose
// halo and weight stages fit in shared memory).
inline bool fits(const ConvParams& p, bool wgmma, bool split) {
  return layout(p, weight_floats_per_tap(wgmma, split)).smem_bytes <= kMaxSmemBytes;
}

}  // namespace igemm_fprop
}  // namespace conv2d_ext
