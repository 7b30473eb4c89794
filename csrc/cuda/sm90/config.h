// Tiles of the Hopper-only kernels (sm90/fprop_flat.cu, sm90/wgrad.cu),
// shared by the kernels and by the plan that decides whether a problem fits.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

#include "../../conv_params.h"
#include "../limits.h"

namespace conv2d_ext {
// Hopper forward with output channels as wgmma's M and pixels as its N (see
// csrc/cuda/sm90/fprop_flat.cu). The input halo of a block is stored
// channel-interleaved ([4-channel plane][pixel][4 channels], i.e. K-major
// core matrices) and flattened with a row pitch P, so that the N pixels of
// one tap are consecutive 16-byte rows for any tap: output (r, c) reads halo
// pixel (r + kh) * P + c + kw * dilation_w. Columns c >= P - (KW-1)*dw wrap
// into the next row: they are computed and dropped.
namespace igemm_fprop_sm90_flat {

constexpr int kCo = 64;       // M: output channels per block (wgmma m64)
constexpr int kPositions = 256;  // N: flattened output positions per item (m64n256k8)
constexpr int kThreads = 128;  // one warpgroup
// Registers capped for three blocks per SM (at most 168 per thread): while
// one block rounds a halo or stores its tile, two others keep the tensor
// cores busy. 3xTF32 needs two 32-register temporaries and the split A
// operand next to the 128 accumulators: two blocks.
constexpr int kBlocksPerSm = 3;
constexpr int kTf32x3BlocksPerSm = 2;
constexpr int blocks_per_sm_cap(bool tf32x3) { return tf32x3 ? kTf32x3BlocksPerSm : kBlocksPerSm; }
constexpr int kStepFloats = kCo * 8;  // one k8 step of weights: [k half][co][4]
// 3xTF32 splits a chunk's box (halo_rows x P pixels) in rounds of
// kTf32x3Pixels pixels a thread, 32 loads in flight; a last partial round
// (the tail) clamps its loads into the box and skips its stores.
constexpr int kTf32x3Pixels = 4;
constexpr int64_t kMaxSmemBytes = 200 * 1024;
constexpr int64_t kSmemPerSm = 228 * 1024;  // sm_90, the only target of this kernel
constexpr int64_t kSmemReservedPerBlock = 1024 + 128;  // the driver's, and the mbarriers

// Blocks of `smem_bytes` dynamic shared memory that share an SM: by shared
// memory, at most blocks_per_sm_cap (registers). The layout choice weighs it
// and the launch sizes its persistent grid by it.
inline int blocks_per_sm(int64_t smem_bytes, bool tf32x3) {
  return static_cast<int>(std::min<int64_t>(
      blocks_per_sm_cap(tf32x3), kSmemPerSm / (smem_bytes + kSmemReservedPerBlock)));
}

// The halo arrives by the tensor-copy engine (TMA) as a box of the NCHW
// input, [chunk channels][halo rows][P + 4 columns], and is rounded into the
// interleaved layout by the block's threads. TMA needs 16-byte aligned rows
// (width a multiple of 4) and a box that starts on a 16-byte column (hence
// up to 3 columns more on the left, and P + 4 columns), steps over dilated
// rows by at most 8 (its element stride) and spans at most 256 elements per
// dimension (tma_limits below).
constexpr int kTmaColumnSlack = 4;

// Row shifts (S = 2, for at most 32 output channels per group): m64 would
// leave half of every MMA idle, so rows 32..63 of M hold the same channels
// one output row further down, with the weights shifted by one kernel row:
// K runs over KH + 1 kernel rows (the first and last are zero in one half)
// and a position row yields S output rows. The halo is stored by row phase
// (rows S*i + j at storage row j * plane_rows + i) so that the positions
// of one kernel row stay consecutive: 5x9 dgrad of a 32-channel layer does
// 6/5 of the MMAs per output instead of 2x.
constexpr int kMaxShifts = 2;

// 3xTF32 over a long K (at least kLongK): the accumulators' FP32 chain of
// temporaries (one add per 24 products) sets the error, which on a 5x9
// dgrad of 64 channels rose above cuDNN strict's. There the
// kernel splits the halo and weights with big rounded to nearest and cuts
// each item's chain into segments of at most kSegmentK: a segment's
// accumulators are added to the output in global memory (the block's own
// tile: the thread that wrote an element reads it back) and restart at
// zero. A model of the accumulation (exact k8 products, truncating
// tensor-core adds, round-to-nearest FADDs) and the measurements agree
// that rounding big and three segments bring it below cuDNN; more segments
// gain little accuracy for another read and write of the tile each, so
// three (docs/kernels.md, "Flat sm_90 forward").
constexpr int64_t kLongK = 2048;
constexpr int64_t kSegmentK = 1024;

struct Layout {
  int log2_pitch;  // P = 1 << log2_pitch; positions / P position rows per block
  int shifts;  // S: output rows per position row (1, or 2 with row shifts)
  int rows, out_cols;  // output rows (S * positions / P) and columns of a block's tile
  int tiles_w, tiles_h;  // tiles_h counts the dilation phases of the rows
  int halo_rows;  // rows + KH - 1: the TMA box's rows (one dilation phase)
  int plane_rows;  // storage rows per row phase: ceil(halo_rows / S)
  int halo_pixels;  // S * plane_rows * P + (KW-1)*dw: the wrapped tail is zeros
  int tap_rows;  // kernel rows of K: KH + S - 1
  int ksteps;  // k8 steps per chunk: a chunk is 8 * ksteps input channels
  int chunks, co_tiles;  // co_tiles of kCo / S output channels
  int rows_per_stage;  // kernel rows (of tap_rows) per weight stage: all, or one
  // 3xTF32 over a long K: stages per accumulation segment, 0 for one
  // segment (see kSegmentK).
  int segment_stages;
  int64_t staging_bytes;  // one TMA box: 8 * ksteps channels x halo_rows x (P + 4) floats
  int64_t smem_bytes;  // INT64_MAX when nothing fits
};

// Taps of K per weight stage: all kernel rows of K (KH + S - 1 with S row
// shifts) up to 16 taps, one row beyond.
constexpr int64_t stage_taps(int64_t kernel_h, int64_t kernel_w, int64_t shifts) {
  const int64_t taps = (kernel_h + shifts - 1) * kernel_w;
  return taps <= 16 ? taps : kernel_w;
}

// Whether every layout of a KH x KW kernel with `shifts` row shifts has
// one k8 step per tap (ksteps 1, see layout()): a stage of 8 or more taps.
// Known at compile time for the specialised sizes (3x3, 5x9), whose
// 3xTF32 groups of three steps then never straddle a kernel row.
constexpr bool one_k8_step(int64_t kernel_h, int64_t kernel_w, int64_t shifts) {
  return stage_taps(kernel_h, kernel_w, shifts) >= 8;
}

// Rows of a block are oh0 + dilation_h * r (one phase of the rows), so the
// halo rows a block needs are consecutive in that phase: rows + KH - 1.
inline Layout layout(const ConvParams& p, int log2_pitch, int shifts) {
  Layout l{};
  l.smem_bytes = INT64_MAX;
  const int64_t pitch = int64_t(1) << log2_pitch;
  const int64_t positions = kPositions;
  // Output columns per tile: a multiple of 8, so that a tile's rows start
  // on 32-byte sectors where the output's rows do. Tiles ending mid-sector
  // split sectors between blocks: with 62-column tiles memory traffic ran
  // well above the tensors' bytes, and 56-column tiles were faster despite
  // more MMAs.
  const int64_t out_cols = (pitch - (p.kernel_w - 1) * p.dilation_w) / 8 * 8;
  if (out_cols < 1 || pitch > positions || p.stride_h != 1 || p.stride_w != 1) return l;
  const int64_t halo_rows = shifts * positions / pitch + p.kernel_h - 1;
  if (p.in_w % 4 != 0 || pitch + kTmaColumnSlack > kMaxTmaBox ||
      p.dilation_h > kMaxTmaElementStride || halo_rows * p.dilation_h > kMaxTmaBox) {
    return l;
  }
  l.log2_pitch = log2_pitch;
  l.shifts = shifts;
  l.rows = static_cast<int>(shifts * positions / pitch);
  l.out_cols = static_cast<int>(out_cols);
  l.tiles_w = static_cast<int>((p.out_w + out_cols - 1) / out_cols);
  l.tiles_h = phase_row_tiles(p.out_h, l.rows, p.dilation_h);
  l.halo_rows = static_cast<int>(halo_rows);
  l.plane_rows = static_cast<int>((halo_rows + shifts - 1) / shifts);
  const int64_t halo = shifts * l.plane_rows * pitch + (p.kernel_w - 1) * p.dilation_w;
  l.halo_pixels = static_cast<int>(halo);
  l.tap_rows = static_cast<int>(p.kernel_h + shifts - 1);
  const int64_t taps = stage_taps(p.kernel_h, p.kernel_w, shifts);  // a stage's
  l.rows_per_stage = static_cast<int>(taps / p.kernel_w);
  // Short stages (1x1) take several k8 steps per chunk so that a stage
  // holds enough MMAs between barriers (none from 8 taps on).
  const int64_t cin_steps = (p.in_channels_per_group() + 7) / 8;
  l.ksteps = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>({(8 + taps - 1) / taps, 4, cin_steps})));
  // One TMA box; two interleaved halos and two weight stages.
  auto staging = [&](int ksteps) {
    return 8 * ksteps * halo_rows * (pitch + kTmaColumnSlack) * 4;
  };
  auto smem = [&](int ksteps) {
    const int64_t halo_bytes = 2 * ksteps * halo * 16;
    const int64_t weight_bytes = taps * ksteps * kStepFloats * 4;
    return staging(ksteps) + 2 * (halo_bytes + weight_bytes);
  };
  while (l.ksteps > 1 && blocks_per_sm(smem(l.ksteps), false) < 2) --l.ksteps;
  l.chunks = static_cast<int>((p.in_channels_per_group() + 8 * l.ksteps - 1) / (8 * l.ksteps));
  const int64_t co_per_tile = kCo / shifts;
  l.co_tiles = static_cast<int>((p.out_channels_per_group() + co_per_tile - 1) / co_per_tile);
  // Persistent blocks number work items in 32 bits.
  const int64_t items = int64_t(l.tiles_w) * l.tiles_h * p.groups * l.co_tiles * p.batch;
  if (items >= (int64_t(1) << 31)) return l;
  l.staging_bytes = staging(l.ksteps);
  l.smem_bytes = smem(l.ksteps);
  if (l.smem_bytes > kMaxSmemBytes) l.smem_bytes = INT64_MAX;
  return l;
}

// The pitch and row shifts with the fewest MMAs (blocks times kernel rows
// of K, dropped columns and rows included), weighted by how many blocks
// share an SM: narrower tiles at three blocks per SM beat wider ones at
// two, though those have a few percent fewer blocks.
inline Layout choose_layout(const ConvParams& p, bool tf32x3) {
  Layout best{};
  best.smem_bytes = INT64_MAX;
  double best_cost = 0;
  // One kernel row (1x1) gains nothing: K doubles with the outputs.
  const int max_shifts =
      p.out_channels_per_group() <= kCo / 2 && p.kernel_h > 1 ? kMaxShifts : 1;
  for (int shifts = 1; shifts <= max_shifts; ++shifts) {
    for (int log2_pitch = 8; log2_pitch >= 5; --log2_pitch) {
      const Layout l = layout(p, log2_pitch, shifts);
      if (l.smem_bytes == INT64_MAX) continue;
      // Fewer blocks per SM hide less of a block's halo rounding and stores.
      const int per_sm = blocks_per_sm(l.smem_bytes, tf32x3);
      const double factor = per_sm >= blocks_per_sm_cap(tf32x3) ? 1.0 : per_sm == 2 ? 1.15 : 1.6;
      const double cost = double(l.tiles_w) * l.tiles_h * l.co_tiles * l.tap_rows * factor;
      if (best.smem_bytes == INT64_MAX || cost < best_cost) {
        best = l;
        best_cost = cost;
      }
    }
  }
  if (tf32x3 && best.smem_bytes != INT64_MAX && p.gemm_k() >= kLongK) {
    // Segments of equal length in stages.
    const int64_t stages = int64_t(best.chunks) * (best.tap_rows / best.rows_per_stage);
    const int64_t segments = (p.gemm_k() + kSegmentK - 1) / kSegmentK;
    best.segment_stages = static_cast<int>(std::max<int64_t>(1, (stages + segments - 1) / segments));
  }
  return best;
}

// Which instantiation of the kernel runs a layout, besides the kernel size
// and the row shifts: 3xTF32's steps per temporary (kGroup) and whether its
// big parts are rounded (kRoundBig; otherwise truncated).
//  - Steps per temporary: three where K is long, two where it is short. The
//    sequence of temporaries sets the error of a long K, the products inside
//    one that of a short K; three also run a 9-step stage (5x9, 3x3) as
//    three groups instead of five.
//  - Big parts are rounded where truncated ones would leave more error than
//    cuDNN's strict FP32 (mma.cuh, tf32_split): K below 512 and K from
//    kLongK on, where the accumulation is also cut into segments.
// Measurements: docs/kernels.md, "Flat sm_90 forward".
struct Variant {
  bool tf32x3;
  int group;  // k8 steps per 3xTF32 temporary (1 in TF32 mode)
  bool round_big;
};
inline Variant choose_variant(const ConvParams& p, const Layout& l, bool tf32x3) {
  if (!tf32x3) return {false, 1, false};
  if (l.segment_stages > 0) return {true, 3, true};  // K >= kLongK
  if (p.gemm_k() >= 512) return {true, 3, false};
  return {true, 2, true};
}

// Accumulation segments of an item (1: one chain), for tests.
inline int segments(const Layout& l) {
  const int stages = l.chunks * (l.tap_rows / l.rows_per_stage);
  return l.segment_stages > 0 ? (stages + l.segment_stages - 1) / l.segment_stages : 1;
}

// The split's full rounds of a box and the pixels left to its tail, for
// tests.
inline int tf32x3_full_rounds(const Layout& l) {
  return (l.halo_rows << l.log2_pitch) / (kTf32x3Pixels * kThreads);
}
inline int tf32x3_tail_pixels(const Layout& l) {
  return (l.halo_rows << l.log2_pitch) % (kTf32x3Pixels * kThreads);
}

inline bool fits(const ConvParams& p, bool tf32x3) {
  return choose_layout(p, tf32x3).smem_bytes != INT64_MAX;
}

}  // namespace igemm_fprop_sm90_flat

// wgrad on Hopper's wgmma (csrc/cuda/sm90/wgrad.cu), unit stride. GEMM view
// per block: M = (input channel, tap) rows, N = 64 output channels, K =
// output positions. A (the input at each row's tap) comes from registers,
// loaded from a plain NCHW halo at any tap offset; B (grad_output) lands in
// wgmma's K-major layout (128-byte swizzle) and is rounded or split in
// place. A unit is 8 input channels at one tap; an m64 tile is 8 units.
namespace igemm_wgrad_sm90 {

constexpr int kCo = 64;       // N: output channels of a block
constexpr int kCols = 64;     // output columns of a K tile
constexpr int kThreads = 128;  // one warpgroup
constexpr int kUnitsPerTile = 8;
constexpr int kBlocksPerSm = 2;  // registers: up to 255 per thread; one where
                                 // the halo needs the SM's shared memory (7x7, IEEE)
constexpr int kMaxRows = 4;     // output rows of a K tile (one dilation phase)
// B of one output row: [2 column halves][64 channels][32 positions], each
// half a TMA box of 128-byte rows in the 128-byte swizzle (16 KB).
constexpr int kRowFloats = kCo * kCols;
constexpr int kAlignSlack = 1024;  // the swizzle's atoms are 1024-byte aligned
// Accumulators: 32 registers per m64 tile; 3xTF32 also keeps a temporary
// per tile that its products go into before FP32 adds (the tensor cores
// truncate as they accumulate).
constexpr int max_tiles(bool tf32x3) { return tf32x3 ? 2 : 4; }
// Shared memory of a block when `per_sm` blocks share an SM (the driver's
// reserve and the mbarriers taken off).
constexpr int64_t smem_budget(int per_sm) { return 228 * 1024 / per_sm - (1024 + 128); }

struct Layout {
  int tiles;  // m64 tiles per block
  int blocks_per_sm;  // kBlocksPerSm, or 1
  int units, unit_blocks;  // units of a group; blocks over them
  // Blocks per 8-channel group when a block's units stay in one group (its
  // halo then holds 8 channels), else 0: units run on across groups.
  int group_blocks;
  int box_channels;  // halo channels staged: 8 x the most channel groups a block spans
  int rows;  // output rows of a K tile
  int halo_rows;  // rows + KH - 1, made odd
  int halo_cols;  // box columns: 64 + 3 (alignment shift) + reach, = 4 mod 8
  int plane;  // halo_rows * halo_cols: = 4 mod 8, so 8 channels x 4 positions
              // of an A load fall in 32 different banks
  int tiles_h, tiles_w, co_tiles;
  int64_t k_tiles;
  int64_t halo_floats;  // one halo buffer, 128-byte aligned
  int64_t b_floats;  // B of a K tile (3xTF32: its big half; the small half follows)
  int64_t stage_floats;  // one of B's two buffers
  int64_t smem_bytes;  // INT64_MAX when nothing fits
};

inline Layout choose_layout(const ConvParams& p, bool tf32x3) {
  Layout l{};
  l.smem_bytes = INT64_MAX;
  // The halo and grad_output arrive by TMA: 16-byte rows of the input,
  // dilated rows at most 8 apart.
  if (p.stride_h != 1 || p.stride_w != 1 || p.in_w % 4 != 0 ||
      p.dilation_h > kMaxTmaElementStride) {
    return l;
  }
  const int64_t taps = p.kernel_h * p.kernel_w;
  const int64_t groups8 = (p.in_channels_per_group() + 7) / 8;
  l.units = static_cast<int>(groups8 * taps);
  l.tiles_w = static_cast<int>((p.out_w + kCols - 1) / kCols);
  // Narrow outputs would waste most of a 64-column K tile.
  if (10 * p.out_w < 7 * int64_t(kCols) * l.tiles_w) return l;
  int64_t cols = kCols + 3 + (p.kernel_w - 1) * p.dilation_w;
  cols = (cols + 3) / 4 * 4;
  if (cols % 8 == 0) cols += 4;
  if (cols > kMaxTmaBox) return l;
  l.halo_cols = static_cast<int>(cols);
  auto round128 = [](int64_t floats) { return (floats + 31) / 32 * 32; };
  // Tiles per block: the least work counting padded units and, per block,
  // grad_output's copy and split as about half a tile; two blocks per SM
  // where they fit. B is double-buffered: a K tile's B is rounded or split
  // under the wgmmas of the one before.
  int64_t best_cost = 0;
  for (int per_sm = kBlocksPerSm; per_sm >= 1 && best_cost == 0; --per_sm) {
    for (int mt = max_tiles(tf32x3); mt >= 1; --mt) {
      const int64_t per_block = int64_t(kUnitsPerTile) * mt;
      const int64_t blocks = (l.units + per_block - 1) / per_block;
      // Blocks that keep to one channel group stage half the halo or less;
      // taken where they cost no more blocks (45 taps in blocks of 16: 3
      // per group either way).
      const int64_t per_group = (taps + per_block - 1) / per_block;
      const bool in_group = groups8 * per_group == blocks;  // never fewer
      const int64_t cost = blocks * (2 * mt + 1);
      if (best_cost != 0 && cost >= best_cost) continue;
      const int64_t span =
          in_group ? 1 : std::min<int64_t>(groups8, (taps - 1 + per_block - 1) / taps + 1);
      for (int rows = kMaxRows; rows >= 1; rows /= 2) {
        if (rows > 1 && rows * p.dilation_h > p.out_h) continue;
        const int64_t halo_rows = (rows + p.kernel_h - 1) | 1;
        if (halo_rows * p.dilation_h > kMaxTmaBox) continue;
        const int64_t plane = halo_rows * cols;
        const int64_t halo = round128(span * 8 * plane);
        const int64_t b = int64_t(rows) * kRowFloats;
        const int64_t stage = (tf32x3 ? 2 : 1) * b;
        const int64_t bytes = kAlignSlack + 4 * (2 * stage + 2 * halo);
        if (bytes > smem_budget(per_sm)) continue;
        l.tiles = mt;
        l.blocks_per_sm = per_sm;
        l.unit_blocks = static_cast<int>(blocks);
        l.group_blocks = in_group ? static_cast<int>(per_group) : 0;
        l.box_channels = static_cast<int>(8 * span);
        l.rows = rows;
        l.halo_rows = static_cast<int>(halo_rows);
        l.plane = static_cast<int>(plane);
        l.halo_floats = halo;
        l.b_floats = b;
        l.stage_floats = stage;
        l.smem_bytes = bytes;
        best_cost = cost;
        break;
      }
    }
  }
  if (l.smem_bytes == INT64_MAX) return l;
  l.tiles_h = phase_row_tiles(p.out_h, l.rows, p.dilation_h);
  l.k_tiles = p.batch * l.tiles_h * int64_t(l.tiles_w);
  l.co_tiles = static_cast<int>((p.out_channels_per_group() + kCo - 1) / kCo);
  if (p.groups * l.co_tiles * int64_t(l.unit_blocks) >= (int64_t(1) << 31)) {
    l.smem_bytes = INT64_MAX;
  }
  return l;
}

inline bool fits(const ConvParams& p, bool tf32x3) {
  return choose_layout(p, tf32x3).smem_bytes != INT64_MAX;
}

}  // namespace igemm_wgrad_sm90
}  // namespace conv2d_ext
