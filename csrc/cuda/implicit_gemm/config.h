// Tiles of the mma.sync implicit-GEMM kernels (implicit_gemm/fprop.cu, whose
// forward also has a wgmma main loop on Hopper, and implicit_gemm/wgrad.cu),
// shared by the kernels and by the plan that decides whether a problem fits.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

#include "../../conv_params.h"
#include "../limits.h"

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
C10_HOST_DEVICE inline int weight_floats_per_tap(bool sm90, bool tf32x3) {
  return kCo * kChunk * (sm90 && tf32x3 ? 2 : 1);
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

inline Layout choose_layout(const ConvParams& p, int weight_floats_per_tap) {
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
inline bool fits(const ConvParams& p, bool sm90, bool tf32x3) {
  return choose_layout(p, weight_floats_per_tap(sm90, tf32x3)).smem_bytes <= kMaxSmemBytes;
}

}  // namespace igemm_fprop

// wgrad on mma.sync (see csrc/cuda/implicit_gemm/wgrad.cu): M = output
// channels, N = (input channel, tap) pairs, K = output pixels, split over
// blocks and reduced in a fixed order.
namespace igemm_wgrad {

constexpr int kCo = 64;  // M per block: four m16 fragments, shared by all warps
constexpr int kRows = 4, kCols = 32;  // a K tile: output pixels of one image
constexpr int kPixels = kRows * kCols;
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
// An N unit is one n8 fragment: 8 input channels at one tap. Each warp owns
// up to this many units for the whole K range, 4 m16 accumulators each.
constexpr int kUnitsPerWarp = 6;
constexpr int kMaxUnits = kWarps * kUnitsPerWarp;
// 8-channel groups per block: few-tap kernels (1x1) take many, so that a
// staged grad_output tile feeds more MMAs (faster on 1x1 layers in both
// modes); shared memory bounds it.
constexpr int kMaxChannelGroups = 16;
// Lanes of an A fragment read 8 channel rows x 4 pixels: a row pitch of 4
// mod 32 puts them in 32 different banks (the halo planes likewise).
constexpr int kGoPitch = kPixels + 4;


struct Layout {
  int taps, tap_groups;  // taps per block; blocks per kernel
  int ci_groups, ci_chunks;  // 8-channel groups per block; blocks per group's channels
  int co_tiles;
  int units;  // ci_groups * taps, at most kMaxUnits
  int halo_rows, halo_cols, plane;
  int tiles_h, tiles_w;
  int64_t k_tiles;  // K tiles of the whole batch
  int64_t stage_floats;
  // 3xTF32 only: FP32 sums that the accumulators are added to (and then
  // cleared) after every output row of a K tile, [warp][unit of the warp]
  // [16][lane]. The tensor cores' accumulation truncates; over the whole K
  // of a slice (tens of thousands of pixels) that loses far more than FP32
  // summation would, and even one tile's chain (48 MMAs) was less accurate
  // than cuDNN's FP32, so each chain is cut to one row (12 MMAs).
  int units_per_warp;
  int64_t sum_floats;
  int64_t smem_bytes;  // INT64_MAX when the stages do not fit
};

inline Layout choose_layout(const ConvParams& p, bool tf32x3, int sm) {
  Layout l{};
  l.smem_bytes = INT64_MAX;
  const int64_t limit = max_block_smem_bytes(sm);
  const int64_t taps = p.kernel_h * p.kernel_w;
  l.tap_groups = static_cast<int>((taps + kMaxUnits - 1) / kMaxUnits);
  l.taps = static_cast<int>((taps + l.tap_groups - 1) / l.tap_groups);
  l.co_tiles = static_cast<int>((p.out_channels_per_group() + kCo - 1) / kCo);
  // In 64 bits first: huge strides or dilations would wrap an int.
  const int64_t rows = (kRows - 1) * p.stride_h + (p.kernel_h - 1) * p.dilation_h + 1;
  const int64_t cols = (kCols - 1) * p.stride_w + (p.kernel_w - 1) * p.dilation_w + 1;
  if (rows * cols > limit) return l;
  l.halo_rows = static_cast<int>(rows);
  l.halo_cols = static_cast<int>(cols);
  const int area = l.halo_rows * l.halo_cols;
  l.plane = area + ((4 - area % 32) + 32) % 32;
  l.tiles_h = static_cast<int>((p.out_h + kRows - 1) / kRows);
  l.tiles_w = static_cast<int>((p.out_w + kCols - 1) / kCols);
  l.k_tiles = p.batch * l.tiles_h * l.tiles_w;
  // Channel groups per block: as many as the units and shared memory allow
  // (they share each grad_output tile), spread evenly over the chunks.
  const int64_t ci8 = (p.in_channels_per_group() + 7) / 8;
  auto with_groups = [&](int64_t most) {
    Layout t = l;
    t.ci_chunks = static_cast<int>((ci8 + most - 1) / most);
    t.ci_groups = static_cast<int>((ci8 + t.ci_chunks - 1) / t.ci_chunks);
    t.units = t.ci_groups * t.taps;
    t.stage_floats = int64_t(kCo) * kGoPitch + int64_t(t.ci_groups) * 8 * t.plane;
    t.units_per_warp = (t.units + kWarps - 1) / kWarps;
    t.sum_floats = tf32x3 ? int64_t(kWarps) * t.units_per_warp * 16 * 32 : 0;
    t.smem_bytes = 4 * (2 * t.stage_floats + t.sum_floats);  // two stages
    return t;
  };
  int64_t most = std::min<int64_t>({kMaxChannelGroups, kMaxUnits / l.taps, ci8});
  Layout t = with_groups(most);
  while (t.smem_bytes > limit && most > 1) t = with_groups(--most);
  if (t.smem_bytes > limit) t.smem_bytes = INT64_MAX;
  return t;
}

inline bool fits(const ConvParams& p, bool tf32x3, int sm) {
  return choose_layout(p, tf32x3, sm).smem_bytes != INT64_MAX;
}

// 3xTF32: the FP32 sums (Layout::sum_floats) are stored to a workspace slot
// of their own and restarted every `tiles_per_chunk` K tiles of a slice,
// and the slots summed in double. Over a whole slice the FP32 chain of row
// sums dominated the error: on a slice of hundreds of output rows it rose
// above cuDNN's, and shorter chains brought it well below (docs/kernels.md,
// "wgrad on mma.sync"). A chunk
// is 16 tiles (64 output rows) where the workspace stays under 64 MB, and
// longer where the weights are so large that it would not.
constexpr int64_t kSumChunkTiles = 16;
constexpr int64_t kSumWorkspaceBytes = int64_t(64) << 20;
struct SumChunks {
  int64_t tiles_per_chunk;
  int64_t chunks;  // per slice
};
inline SumChunks sum_chunking(int64_t tiles_per_split, int64_t splits, int64_t weight_numel) {
  const int64_t most_slots = std::max(splits, kSumWorkspaceBytes / (4 * weight_numel));
  const int64_t most_chunks = std::max<int64_t>(1, most_slots / splits);
  SumChunks c;
  c.tiles_per_chunk = std::max(kSumChunkTiles, (tiles_per_split + most_chunks - 1) / most_chunks);
  c.chunks = (tiles_per_split + c.tiles_per_chunk - 1) / c.tiles_per_chunk;
  return c;
}

}  // namespace igemm_wgrad
}  // namespace conv2d_ext
