// Tile shapes of the tensor-core implicit-GEMM kernels, shared by the kernels
// and by the plan that decides whether a problem fits them.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

#include "conv_params.h"

namespace conv2d_ext {

// What the tensor-copy engine (TMA) takes, for the sm_90 kernels that stage
// NCHW boxes with it: at most 256 elements per box dimension, rows stepped
// over by at most 8 (its element stride).
constexpr int kMaxTmaBox = 256;
constexpr int kMaxTmaElementStride = 8;

// Tiles of `rows` output rows of one dilation phase (rows oh0 + dilation*r)
// that cover `out_h` rows: the sm_90 kernels' row tiling, which lets a
// dilated halo be one TMA box with the dilation as its row step.
inline int phase_row_tiles(int64_t out_h, int rows, int64_t dilation_h) {
  const int64_t span = rows * dilation_h;
  return static_cast<int>((out_h + span - 1) / span * dilation_h);
}
// First output row of row tile `tile_h` of that tiling.
C10_HOST_DEVICE inline int phase_row0(int tile_h, int rows, int dilation_h) {
  return (tile_h / dilation_h) * rows * dilation_h + tile_h % dilation_h;
}

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

namespace conv2d_ext {
// Hopper forward with output channels as wgmma's M and pixels as its N (see
// csrc/cuda/fprop_sm90_flat.cu). The input halo of a block is stored
// channel-interleaved ([4-channel plane][pixel][4 channels], i.e. K-major
// core matrices) and flattened with a row pitch P, so that the N pixels of
// one tap are consecutive 16-byte rows for any tap: output (r, c) reads halo
// pixel (r + kh) * P + c + kw * dilation_w. Columns c >= P - (KW-1)*dw wrap
// into the next row: they are computed and dropped.
namespace igemm_fprop_flat {

constexpr int kCo = 64;       // M: output channels per block (wgmma m64)
constexpr int kPositions = 256;  // N: flattened output positions per item (m64n256k8)
constexpr int kThreads = 128;  // one warpgroup
// Registers capped for three blocks per SM (at most 168 per thread): while
// one block rounds a halo or stores its tile, two others keep the tensor
// cores busy. 3xTF32 needs two 32-register temporaries and the split A
// operand next to the 128 accumulators: two blocks.
constexpr int kBlocksPerSm = 3;
constexpr int kSplitBlocksPerSm = 2;
constexpr int blocks_per_sm_cap(bool split) { return split ? kSplitBlocksPerSm : kBlocksPerSm; }
constexpr int kStepFloats = kCo * 8;  // one k8 step of weights: [k half][co][4]
// 3xTF32 splits a chunk's box (halo_rows x P pixels) in rounds of
// kSplitPixels pixels a thread, 32 loads in flight; a last partial round
// (the tail) clamps its loads into the box and skips its stores.
constexpr int kSplitPixels = 4;
constexpr int64_t kMaxSmemBytes = 200 * 1024;
constexpr int64_t kSmemPerSm = 228 * 1024;  // sm_90, the only target of this kernel
constexpr int64_t kSmemReservedPerBlock = 1024 + 128;  // the driver's, and the mbarriers

// Blocks of `smem_bytes` dynamic shared memory that share an SM: by shared
// memory, at most blocks_per_sm_cap (registers). The layout choice weighs it
// and the launch sizes its persistent grid by it.
inline int blocks_per_sm(int64_t smem_bytes, bool split) {
  return static_cast<int>(std::min<int64_t>(
      blocks_per_sm_cap(split), kSmemPerSm / (smem_bytes + kSmemReservedPerBlock)));
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
// temporaries (one add per 24 products) sets the error. On 5x9 dgrad (K =
// 64 * 45) it measured 2.8e-7 against cuDNN strict's 1.9e-7. There the
// kernel splits the halo and weights with big rounded to nearest and cuts
// each item's chain into segments of at most kSegmentK: a segment's
// accumulators are added to the output in global memory (the block's own
// tile: the thread that wrote an element reads it back) and restart at
// zero. A model of the accumulation (exact k8 products, truncating
// tensor-core adds, round-to-nearest FADDs) puts K = 2880 at 2.84e-7 as it
// was, 2.33e-7 with big rounded, 1.77e-7 with three segments, 1.54e-7 with
// five; five measured 1.53e-7, but each segment's read and write of the
// tile cost a's dgrad about 0.2 ms (docs/history/), so three.
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
  // split sectors between blocks: on c (62-column tiles) memory traffic was
  // 28% above the tensors' bytes, and 56-column tiles ran 3.87 -> 2.97 ms
  // despite 11% more MMAs.
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
// share an SM: on c, 56-column tiles at three blocks per SM (2.97 ms) beat
// 120-column tiles at two (3.54 ms) with 6% fewer blocks.
inline Layout choose_layout(const ConvParams& p, bool split) {
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
      const int per_sm = blocks_per_sm(l.smem_bytes, split);
      const double factor = per_sm >= blocks_per_sm_cap(split) ? 1.0 : per_sm == 2 ? 1.15 : 1.6;
      const double cost = double(l.tiles_w) * l.tiles_h * l.co_tiles * l.tap_rows * factor;
      if (best.smem_bytes == INT64_MAX || cost < best_cost) {
        best = l;
        best_cost = cost;
      }
    }
  }
  if (split && best.smem_bytes != INT64_MAX && p.gemm_k() >= kLongK) {
    // Segments of equal length in stages.
    const int64_t stages = int64_t(best.chunks) * (best.tap_rows / best.rows_per_stage);
    const int64_t segments = (p.gemm_k() + kSegmentK - 1) / kSegmentK;
    best.segment_stages = static_cast<int>(std::max<int64_t>(1, (stages + segments - 1) / segments));
  }
  return best;
}

// Accumulation segments of an item (1: one chain), for tests.
inline int segments(const Layout& l) {
  const int stages = l.chunks * (l.tap_rows / l.rows_per_stage);
  return l.segment_stages > 0 ? (stages + l.segment_stages - 1) / l.segment_stages : 1;
}

// The split's full rounds of a box and the pixels left to its tail, for
// tests.
inline int split_full_rounds(const Layout& l) {
  return (l.halo_rows << l.log2_pitch) / (kSplitPixels * kThreads);
}
inline int split_tail_pixels(const Layout& l) {
  return (l.halo_rows << l.log2_pitch) % (kSplitPixels * kThreads);
}

inline bool fits(const ConvParams& p, bool split) {
  return choose_layout(p, split).smem_bytes != INT64_MAX;
}

}  // namespace igemm_fprop_flat
}  // namespace conv2d_ext

namespace conv2d_ext {
// wgrad on mma.sync (see csrc/cuda/wgrad_implicit_gemm.cu): M = output
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
// staged grad_output tile feeds more MMAs (resnet_1x1: 8 -> 16 groups,
// 0.47 -> 0.42 ms TF32, 0.96 -> 0.82 ms IEEE); shared memory bounds it.
constexpr int kMaxChannelGroups = 16;
// Lanes of an A fragment read 8 channel rows x 4 pixels: a row pitch of 4
// mod 32 puts them in 32 different banks (the halo planes likewise).
constexpr int kGoPitch = kPixels + 4;

// Largest dynamic shared memory one block may opt into on a GPU of compute
// capability `sm`. Per-architecture constants (CUDA programming guide), so
// that the plan can decide without a device query.
inline int64_t max_block_smem_bytes(int sm) {
  if (sm == 90 || sm >= 100) return 227 * 1024;
  if (sm == 80 || sm == 87) return 163 * 1024;
  return 99 * 1024;  // sm_86, sm_89 and others
}

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
  // summation would, and even one tile's chain (48 MMAs) measured worse
  // than cuDNN's FP32, so each chain is cut to one row (12 MMAs).
  int units_per_warp;
  int64_t sum_floats;
  int64_t smem_bytes;  // INT64_MAX when the stages do not fit
};

inline Layout layout(const ConvParams& p, bool split, int sm) {
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
    t.sum_floats = split ? int64_t(kWarps) * t.units_per_warp * 16 * 32 : 0;
    t.smem_bytes = 4 * (2 * t.stage_floats + t.sum_floats);  // two stages
    return t;
  };
  int64_t most = std::min<int64_t>({kMaxChannelGroups, kMaxUnits / l.taps, ci8});
  Layout t = with_groups(most);
  while (t.smem_bytes > limit && most > 1) t = with_groups(--most);
  if (t.smem_bytes > limit) t.smem_bytes = INT64_MAX;
  return t;
}

inline bool fits(const ConvParams& p, bool split, int sm) {
  return layout(p, split, sm).smem_bytes != INT64_MAX;
}

// 3xTF32: the FP32 sums (Layout::sum_floats) are stored to a workspace slot
// of their own and restarted every `tiles_per_chunk` K tiles of a slice,
// and the slots summed in double. Over a whole slice the FP32 chain of row
// sums dominated the error: ResNet's 3x3 stride-2 layer (128 -> 256, 56x56,
// batch 64; 448 rows per slice) measured 4.5e-7 against cuDNN's 4.2e-7, and
// slices 4 and 16 times shorter 3.2e-7 and 2.7e-7 (H100, 4 seeds). A chunk
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

namespace conv2d_ext {
// wgrad on Hopper's wgmma (csrc/cuda/wgrad_sm90.cu), unit stride. GEMM view
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
constexpr int max_tiles(bool split) { return split ? 2 : 4; }
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

inline Layout layout(const ConvParams& p, bool split) {
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
    for (int mt = max_tiles(split); mt >= 1; --mt) {
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
        const int64_t stage = (split ? 2 : 1) * b;
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

inline bool fits(const ConvParams& p, bool split) {
  return layout(p, split).smem_bytes != INT64_MAX;
}

}  // namespace igemm_wgrad_sm90
}  // namespace conv2d_ext

namespace conv2d_ext {
// Direct FFMA kernels for few input channels per group (depthwise layers, RGB
// stems; csrc/cuda/*_small_channels.cu). They do a few multiply-adds per
// byte, so they are built around memory traffic: a block stages an input
// tile with its halo in shared memory (16-byte copies where rows are
// 16-byte aligned) and every output element is written once.
namespace small_channels {

constexpr int kThreads = 256;
constexpr int kTileCols = 64;  // output columns of a block tile: two warps
constexpr int kSlots = kThreads / kTileCols;  // 64-thread slots: row or channel groups
constexpr int kMaxChannels = 4;  // input channels per group these kernels take
// Narrow tiles (at most 4 output channels per group: depthwise, grouped
// layers of 4 -> 4): each thread owns a column of 8 output rows and all of
// its group's output channels; 4 slots stack to 32 rows. A 64-channel wide
// tile would leave 15/16 of its FMAs idle on 4 channels per group (grouped
// 3x3: 0.80 ms against 0.42 on the direct kernel).
constexpr int kNarrowRows = 8;
constexpr int kNarrowMaxCo = 4;
// Wide tiles (more output channels, RGB stems): each thread owns 4 rows x
// 16 channels, the 4 slots split a 64-channel tile.
constexpr int kWideRows = 4;
constexpr int kWideCo = 16;
// dgrad gathers into at most 4 input channels per group from chunks of
// this many grad_output channels at a time.
constexpr int kDgradCoChunk = 4;
constexpr int64_t kMaxSmemBytes = 100 * 1024;
// Staged tiles per block: a block computes one while the copies of the
// next fly. wgrad (which stages grad_output too) gained 11% from three.
// The forward gained 4-16% from three once the tensor-copy engine staged
// it (dw_5x5 0.145 -> 0.125 ms on the H100); it takes three where they fit
// in kFpropThreeStageBytes (three blocks per SM), else two.
constexpr int kFpropStages = 3;
constexpr int64_t kFpropThreeStageBytes = 72 * 1024;
constexpr int kHaloStages = 3;

inline bool narrow(const ConvParams& p) { return p.out_channels_per_group() <= kNarrowMaxCo; }

// Floats of one staged plane: `rows` x a pitch wide enough for `cols`
// columns shifted right by up to 3 (16-byte alignment of the copy).
struct Halo {
  int rows, pitch;
  int64_t floats;  // of one plane
  int cols;        // the columns staged (rows x cols of the pitch are read)
};

inline Halo halo(int64_t out_rows, int64_t out_cols, int64_t kernel_h, int64_t kernel_w,
                 int64_t stride_h, int64_t stride_w, int64_t dil_h, int64_t dil_w) {
  // In 64 bits: huge strides or dilations would wrap an int.
  const int64_t rows = (out_rows - 1) * stride_h + (kernel_h - 1) * dil_h + 1;
  const int64_t cols = (out_cols - 1) * stride_w + (kernel_w - 1) * dil_w + 1;
  Halo h{};
  if (rows * cols > kMaxSmemBytes) {
    h.floats = INT64_MAX / 8;
    return h;
  }
  h.rows = static_cast<int>(rows);
  h.cols = static_cast<int>(cols);
  h.pitch = static_cast<int>((cols + 3 + 3) / 4 * 4);
  h.floats = int64_t(h.rows) * h.pitch;
  return h;
}

// Forward: a ring of halo buffers of the block's input channels (one image
// computes while the next ones' copies fly) and the weights of its
// output-channel tile. Narrow tiles stack 32 rows, so their halo grows
// with the stride; where it does not fit, layers of 3 or 4 output channels
// per group take the wide tile (2 rows) instead.
// Staged buffers start 128-byte aligned, as the tensor-copy engine writes.
constexpr int64_t aligned_floats(int64_t floats) { return (floats + 31) / 32 * 32; }
// One staged image: the group's input channels, each a Halo plane of
// `plane_floats`.
constexpr int64_t fprop_buffer_floats(int64_t cin, int64_t plane_floats) {
  return aligned_floats(cin * plane_floats);
}
// A channel tile's weights [ci][kh][kw][co_tile], then its biases.
constexpr int64_t fprop_weight_floats(int64_t cin, int64_t taps, int64_t co_tile) {
  return (cin * taps + 1) * co_tile;
}
// Output columns of a forward tile. Narrow tiles split the plane's width
// into even tiles of at most kTileCols, as many as 64-column tiles would
// be, rounded up to whole column pairs (their threads cover just that),
// and the halo shrinks with them. That matters to the tensor copy beyond
// the bytes: dw_5x5's 56-column planes staged as 72 x 60 boxes streamed
// 7% slower than as 64 x 60 boxes (a copy-only kernel of the same pattern
// on the H100: 2.52 against 2.71 TB/s, docs/history), and a 112-column plane
// is two 56-column tiles whose boxes are 64 wide, not a 64-column tile and
// a 48-column one, each staged 72 wide.
inline int64_t fprop_tile_cols(const ConvParams& p, bool narrow_tile) {
  if (!narrow_tile) return kTileCols;
  const int64_t tiles = (p.out_w + kTileCols - 1) / kTileCols;
  return ((p.out_w + tiles - 1) / tiles + 1) / 2 * 2;
}
// Narrow tiles stage their few weights with each item's halo, in the ring:
// a block's consecutive items are usually other channels, and weights read
// when an item starts put a global load's latency before every item. Wide
// tiles (64 channels, 37.6 KB of weights for the RGB stem) stage them once
// per channel tile, after the ring.
inline int64_t fprop_smem_bytes(const ConvParams& p, bool narrow_tile, int stages,
                                int narrow_rows = kNarrowRows) {
  const int64_t cin = p.in_channels_per_group();
  const int rows = narrow_tile ? narrow_rows * kSlots : kWideRows;
  const int64_t co_tile = narrow_tile ? p.out_channels_per_group() : kWideCo * kSlots;
  const Halo h = halo(rows, fprop_tile_cols(p, narrow_tile), p.kernel_h, p.kernel_w, p.stride_h,
                      p.stride_w, p.dilation_h, p.dilation_w);
  if (h.floats > kMaxSmemBytes) return INT64_MAX;  // a halo too large to stage
  const int64_t weights = fprop_weight_floats(cin, p.kernel_h * p.kernel_w, co_tile);
  if (narrow_tile) {
    return 4 * stages * (fprop_buffer_floats(cin, h.floats) + aligned_floats(weights));
  }
  return 4 * (stages * fprop_buffer_floats(cin, h.floats) + weights);
}
// Which tile and whether the kernel fits are decided at two stages.
inline bool fprop_narrow(const ConvParams& p) {
  return narrow(p) && (p.out_channels_per_group() <= 2 ||
                       fprop_smem_bytes(p, true, 2) <= kMaxSmemBytes);
}
// Tall narrow tiles: 14 rows per thread, a 56-row tile, for one output
// channel per group (depthwise) where that covers the plane's rows with no
// more waste than 32-row tiles: 56-row planes (dw_5x5) took two 32-row
// tiles, one of them a quarter empty, and each work item costs a fixed
// few hundred instructions (cursor, copy, barriers, epilogue) besides its
// multiply-adds. 112 and 224 rows split evenly too. Up to 25 taps: the
// register window of a 7x7 kernel would not fit next to 14 rows.
constexpr int kTallRows = 14;
constexpr int kTallMaxTaps = 25;
inline bool fprop_tall(const ConvParams& p) {
  if (!fprop_narrow(p) || p.out_channels_per_group() != 1 ||
      p.kernel_h * p.kernel_w > kTallMaxTaps) {
    return false;
  }
  const int64_t tall = kTallRows * kSlots, short_ = kNarrowRows * kSlots;
  return (p.out_h + tall - 1) / tall * tall <= (p.out_h + short_ - 1) / short_ * short_ &&
         fprop_smem_bytes(p, true, kFpropStages, kTallRows) <= kFpropThreeStageBytes;
}
// Output rows per thread of the forward's tile.
inline int fprop_rows_per_thread(const ConvParams& p) {
  return !fprop_narrow(p) ? kWideRows : fprop_tall(p) ? kTallRows : kNarrowRows;
}
inline int fprop_tile_rows(const ConvParams& p) {
  return fprop_narrow(p) ? fprop_rows_per_thread(p) * kSlots : kWideRows;
}
inline Halo fprop_halo(const ConvParams& p) {
  return halo(fprop_tile_rows(p), fprop_tile_cols(p, fprop_narrow(p)), p.kernel_h, p.kernel_w,
              p.stride_h, p.stride_w, p.dilation_h, p.dilation_w);
}
inline int fprop_stages(const ConvParams& p) {
  return fprop_smem_bytes(p, fprop_narrow(p), kFpropStages, fprop_rows_per_thread(p)) <=
                 kFpropThreeStageBytes
             ? kFpropStages
             : 2;
}
inline int64_t fprop_smem_bytes(const ConvParams& p) {
  return fprop_smem_bytes(p, fprop_narrow(p), fprop_stages(p), fprop_rows_per_thread(p));
}
inline bool fprop_fits(const ConvParams& p) {
  return p.in_channels_per_group() <= kMaxChannels &&
         fprop_smem_bytes(p, fprop_narrow(p), 2) <= kMaxSmemBytes;
}

// dgrad (any stride): one stride phase of the input per block, a tile of
// 32 x 64 of that phase's pixels; its grad_output halo spans the offsets
// of the taps that reach the phase (at most (K-1)*dilation/stride + 1).
// The specialised dgrad kernels stage at this pitch (a compile-time one:
// their window loads are then a base register plus immediates); it holds
// grad_output reaches of up to 11 columns. Wider ones run the generic kernel.
constexpr int kDgradPitch = 80;
// The grad_output halo of a rows x cols tile of one phase, staged at least
// `pitch` wide (a wider one does not fit that pitch's kernels).
inline Halo dgrad_tile_halo(const ConvParams& p, int64_t rows, int64_t cols, int pitch) {
  auto span = [](int64_t kernel, int64_t stride, int64_t dil) {
    return ((kernel - 1) * dil + stride - 1) / stride + 1;
  };
  Halo h = halo(rows, cols, span(p.kernel_h, p.stride_h, p.dilation_h),
                span(p.kernel_w, p.stride_w, p.dilation_w), 1, 1, 1, 1);
  if (h.pitch < pitch && h.floats < INT64_MAX / 8) {
    h.pitch = pitch;
    h.floats = int64_t(h.rows) * h.pitch;
  }
  return h;
}
inline Halo dgrad_halo(const ConvParams& p) {
  return dgrad_tile_halo(p, kNarrowRows * kSlots, kTileCols, kDgradPitch);
}
// Shared memory of one stage: kDgradCoChunk channels' halo `h` and weights.
inline int64_t dgrad_smem_bytes(const ConvParams& p, const Halo& h) {
  if (h.floats > kMaxSmemBytes) return INT64_MAX;  // a halo too large to stage
  return 4 * kDgradCoChunk * (h.floats + p.kernel_h * p.kernel_w * kMaxChannels);
}
inline int64_t dgrad_smem_bytes(const ConvParams& p) { return dgrad_smem_bytes(p, dgrad_halo(p)); }
// The strided dgrad's wide tiles (pairs of columns only, phases of 65 to
// 112 columns such as an RGB stem's 112 x 112): 16 rows x 112 columns, 4
// row groups of 56 pairs, 7 busy warps of 8, where 32 x 64 tiles idled 15
// of every 64 warps on 112-column phases. The pitch keeps warps that
// straddle two row groups (4 rows apart) on distinct banks: 4 * 124 = 16
// (mod 32).
constexpr int kDgradWideRows = 16;
constexpr int kDgradWideCols = 112;
constexpr int kDgradWidePitch = 124;
inline Halo dgrad_wide_halo(const ConvParams& p) {
  return dgrad_tile_halo(p, kDgradWideRows, kDgradWideCols, kDgradWidePitch);
}

inline bool dgrad_fits(const ConvParams& p) {
  return p.in_channels_per_group() <= kMaxChannels && dgrad_smem_bytes(p) <= kMaxSmemBytes;
}
// Chunks staged at a time: two where they fit in the bound (the next one's
// copies fly while this one computes; the stem: 2 x 48 KB), each 128-byte
// aligned for the tensor copy, else one.
inline int64_t dgrad_stage_floats(const ConvParams& p, const Halo& h) {
  return aligned_floats(dgrad_smem_bytes(p, h) / 4);
}
inline int64_t dgrad_stage_floats(const ConvParams& p) {
  return dgrad_stage_floats(p, dgrad_halo(p));
}
inline int dgrad_stages(const ConvParams& p, const Halo& h) {
  return 2 * 4 * dgrad_stage_floats(p, h) <= kMaxSmemBytes ? 2 : 1;
}
inline int dgrad_stages(const ConvParams& p) {
  return dgrad_stages(p, dgrad_halo(p));
}

// wgrad, narrow: the input halo of one channel for a 32 x 64 output tile.
// Wide: a 2 x 64 output tile's grad_output [pixel][64 channels] and the
// group's input halo.
constexpr int kWgradWideRows = 2;
constexpr int kWgradWidePixels = kWgradWideRows * kTileCols;
constexpr int kWgradWideCo = 64;
constexpr int kWgradGoPitch = kWgradWideCo + 4;
constexpr int kWgradSumPitch = 64 + 4;  // a thread's 8 x 8 sums, padded
// Narrow tiles of planes narrower than a tile stage only the plane's
// columns (their threads past it skip the tile): as for the forward
// (fprop_tile_cols), dw_5x5's input boxes are then 64 floats wide, not 72.
inline int64_t wgrad_tile_cols(const ConvParams& p) {
  return narrow(p) ? std::min<int64_t>(kTileCols, p.out_w) : kTileCols;
}
inline Halo wgrad_halo(const ConvParams& p) {
  return halo(narrow(p) ? kNarrowRows * kSlots : kWgradWideRows, wgrad_tile_cols(p), p.kernel_h,
              p.kernel_w, p.stride_h, p.stride_w, p.dilation_h, p.dilation_w);
}
// Wide: one stage (grad_output tile and input halo), then each of the
// block's `workers` threads' sums of its tiles.
inline int64_t wgrad_wide_smem_bytes(const ConvParams& p, int workers) {
  const int64_t halo_floats = wgrad_halo(p).floats;
  if (halo_floats > kMaxSmemBytes) return INT64_MAX;  // a halo too large to stage
  return 4 * (int64_t(kWgradWidePixels) * kWgradGoPitch + p.in_channels_per_group() * halo_floats +
              int64_t(workers) * kWgradSumPitch);
}
inline int64_t wgrad_smem_bytes(const ConvParams& p) {
  if (narrow(p)) {  // a ring of (input halo, grad_output tiles)
    const int64_t halo_floats = wgrad_halo(p).floats;
    if (halo_floats > kMaxSmemBytes) return INT64_MAX;  // a halo too large to stage
    return 4 * kHaloStages *
           (aligned_floats(halo_floats) +
            p.out_channels_per_group() * kNarrowRows * kSlots * kTileCols);
  }
  return wgrad_wide_smem_bytes(p, kThreads);  // at most one worker per thread
}
// Up to the GPU's per-block limit: the narrow ring at stride 2 needs more
// than the other passes' bound (one block per SM then). The limit counts
// the kernels' static shared memory too (the warp sums, at most 1.6 KB).
constexpr int64_t kWgradStaticSmemBytes = 2 * 1024;
inline bool wgrad_fits(const ConvParams& p, int sm) {
  // INT64_MAX (nothing fits) must not wrap: the static bytes go on the right.
  return p.in_channels_per_group() <= kMaxChannels &&
         wgrad_smem_bytes(p) <= igemm_wgrad::max_block_smem_bytes(sm) - kWgradStaticSmemBytes;
}

// wgrad on tensor cores for wide tiles (wgrad_small_channels_tc.cu): a
// 64-channel tile of M, up to kWgradTcWarpN n8 tiles of N per warp (the
// stem's 147 columns in one block), one output row x 64 columns per stage;
// two raw stages (one lands while the other computes) and, for 3xTF32,
// the small parts of one. Each starts 1024-byte aligned (grad_output's
// tile is in the 128-byte swizzle), after up to 1 KB of alignment slack.
constexpr int kWgradTcCo = 64;
constexpr int kWgradTcWarpN = 3;
inline Halo wgrad_tc_halo(const ConvParams& p) {
  return halo(1, kTileCols, p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.dilation_h,
              p.dilation_w);
}
constexpr int64_t wgrad_tc_buffer_floats(int64_t cin, int64_t plane_floats) {
  return (kWgradTcCo * kTileCols + cin * plane_floats + 255) / 256 * 256;
}
inline int64_t wgrad_tc_smem_bytes(const ConvParams& p, bool split) {
  const int64_t halo_floats = wgrad_tc_halo(p).floats;
  if (halo_floats > kMaxSmemBytes) return INT64_MAX;  // a halo too large to stage
  const int64_t stages =
      (split ? 3 : 2) * wgrad_tc_buffer_floats(p.in_channels_per_group(), halo_floats);
  // The warps' accumulators meet through the same memory at the end.
  const int64_t sums = int64_t(kThreads) * (kWgradTcCo / 16) * kWgradTcWarpN * 4;
  return 1024 + 4 * std::max(stages, sums);
}
inline bool wgrad_tc_fits(const ConvParams& p, bool split) {
  return p.in_channels_per_group() <= kMaxChannels && !narrow(p) &&
         wgrad_tc_smem_bytes(p, split) <= kMaxSmemBytes;
}

// The forward on tensor cores for wide tiles (fprop_small_channels_tc.cu):
// M = a 64-channel tile of output channels, K = the group's (input channel,
// tap) pairs in k8 steps, N = the pixels of a stage, kFpropTcRows output
// rows x 64 columns (each warp one row and 32 columns: kFpropTcWarpN n8
// tiles). Shared memory: the weights [64][k8 steps * 8 + 4] (3xTF32: big
// and small parts), a table of each k's halo offset (and the tile's bias
// after it), then two raw halo
// buffers (one lands while the other computes) and, for 3xTF32, one of
// [big, small] pairs (twice the floats); buffers start 128-byte aligned,
// after 128 bytes of slack.
// Channel tiles of fewer than kFpropTcMinCo of 64 channels stay on FFMA.
constexpr int kFpropTcCo = 64;
constexpr int kFpropTcRows = 4;
constexpr int kFpropTcWarpN = 4;
constexpr int kFpropTcMinCo = 32;
inline Halo fprop_tc_halo(const ConvParams& p) {
  return halo(kFpropTcRows, kTileCols, p.kernel_h, p.kernel_w, p.stride_h, p.stride_w,
              p.dilation_h, p.dilation_w);
}
struct FpropTcLayout {
  int halo_rows, pitch;
  int k_steps;       // k8 steps over the group's (input channel, tap) pairs
  int weight_pitch;  // 4 mod 8 floats: an ldmatrix's 8 rows in 8 bank groups
  int weight_floats, table_floats, buffer_floats;
  int64_t smem_bytes;  // INT64_MAX where a halo is too large to stage
};
inline FpropTcLayout fprop_tc_layout(const ConvParams& p, bool split) {
  FpropTcLayout l{};
  l.smem_bytes = INT64_MAX;
  const Halo h = fprop_tc_halo(p);
  if (h.floats > kMaxSmemBytes) return l;
  const int64_t k_steps = (p.in_channels_per_group() * p.kernel_h * p.kernel_w + 7) / 8;
  if (k_steps * 8 * kFpropTcCo > kMaxSmemBytes) return l;  // weights too large to stage
  l.halo_rows = h.rows;
  l.pitch = h.pitch;
  l.k_steps = static_cast<int>(k_steps);
  l.weight_pitch = l.k_steps * 8 + 4;
  l.weight_floats = static_cast<int>(aligned_floats(int64_t(kFpropTcCo) * l.weight_pitch));
  l.table_floats = static_cast<int>(aligned_floats(k_steps * 8 + kFpropTcCo));
  l.buffer_floats = static_cast<int>(aligned_floats(p.in_channels_per_group() * h.floats));
  l.smem_bytes = 128 + 4 * ((split ? 2 : 1) * int64_t(l.weight_floats) + l.table_floats +
                            (split ? 4 : 2) * int64_t(l.buffer_floats));
  return l;
}
// wgmma (Hopper) reads the weights as [k8 step][64 channels][8], without
// the pitch that keeps ldmatrix off bank conflicts.
constexpr int fprop_tc_weight_floats(const FpropTcLayout& l, bool wgmma) {
  return wgmma ? l.k_steps * 8 * kFpropTcCo : l.weight_floats;
}
inline int64_t fprop_tc_smem_bytes(const FpropTcLayout& l, bool split, bool wgmma) {
  return l.smem_bytes -
         4 * int64_t(split ? 2 : 1) * (l.weight_floats - fprop_tc_weight_floats(l, wgmma));
}
// The kernel's static shared memory (its copy barriers).
constexpr int64_t kFpropTcStaticSmemBytes = 16;
inline bool fprop_tc_fits(const ConvParams& p, bool split, int sm) {
  const int64_t co_tiles = (p.out_channels_per_group() + kFpropTcCo - 1) / kFpropTcCo;
  return p.in_channels_per_group() <= kMaxChannels &&
         p.out_channels_per_group() >= kFpropTcMinCo &&
         p.groups * co_tiles <= 65535 &&  // (group, channel tile) is the grid's y
         fprop_tc_layout(p, split).smem_bytes <=
             igemm_wgrad::max_block_smem_bytes(sm) - kFpropTcStaticSmemBytes;
}

// dgrad on tensor cores for wide tiles (dgrad_small_channels_tc.cu): every
// stride phase of the input at once. Position (i, j) of the phase grid
// stands for input pixels (i * stride + py, j * stride + px) for each phase
// (py, px); each is a sum over output channels and grad_output offsets
// (i + dh, j + dw) within one window shared by all phases, with zero
// weights where a phase's taps do not reach an offset. GEMM per group: M =
// (py, px, input channel) rows, at most one m16 tile (kDgradTcN), N = the
// phase grid's positions (kDgradTcRows x kTileCols a stage), K = (output
// channel, dh, dw), staged kDgradTcChunk output channels at a time.
constexpr int kDgradTcRows = 4;
constexpr int kDgradTcN = 16;
constexpr int kDgradTcChunk = 8;
// The window of grad_output offsets along one dimension: tap k reaches
// phase ph from offset (ph + pad - k * dil) / stride where that divides.
struct DgradTcWindow {
  int first = 0, count = 0;  // offsets first .. first + count - 1
};
inline DgradTcWindow dgrad_tc_window(int64_t kernel, int64_t stride, int64_t pad, int64_t dil) {
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (int64_t ph = 0; ph < stride; ++ph)
    for (int64_t k = 0; k < kernel; ++k) {
      const int64_t num = ph + pad - k * dil;
      if (((num % stride) + stride) % stride != 0) continue;
      lo = std::min(lo, num / stride);
      hi = std::max(hi, num / stride);
    }
  DgradTcWindow w;
  if (lo <= hi && hi - lo < 64) {
    w.first = static_cast<int>(lo);
    w.count = static_cast<int>(hi - lo + 1);
  }
  return w;
}
// Shared memory (floats): the k offset table, then two ring buffers, each
// a chunk's grad_output halo [channel][rows][pitch] and its weights [16]
// [k8 steps * 8 + 4] (TF32-rounded, arranged once per call). TF32 only.
struct DgradTcLayout {
  DgradTcWindow win_h, win_w;
  int halo_rows, pitch;
  int k_chunk, k_steps;  // a chunk's (channel, dh, dw) and its k8 steps
  int weight_pitch;      // 4 mod 8 floats: an ldmatrix's 8 rows in 8 bank groups
  int weight_floats;     // one part
  int table_floats, halo_floats, buffer_floats;
  int64_t smem_bytes = INT64_MAX;  // where the window or halo is too large to stage
};
inline DgradTcLayout dgrad_tc_layout(const ConvParams& p) {
  DgradTcLayout l{};
  l.win_h = dgrad_tc_window(p.kernel_h, p.stride_h, p.pad_h, p.dilation_h);
  l.win_w = dgrad_tc_window(p.kernel_w, p.stride_w, p.pad_w, p.dilation_w);
  if (l.win_h.count == 0 || l.win_w.count == 0 || l.win_h.count * l.win_w.count > 64) return l;
  const Halo h = halo(kDgradTcRows, kTileCols, l.win_h.count, l.win_w.count, 1, 1, 1, 1);
  l.halo_rows = h.rows;
  l.pitch = h.pitch;
  l.k_chunk = kDgradTcChunk * l.win_h.count * l.win_w.count;
  l.k_steps = (l.k_chunk + 7) / 8;
  l.weight_pitch = l.k_steps * 8 + 4;
  l.weight_floats = static_cast<int>(aligned_floats(int64_t(kDgradTcN) * l.weight_pitch));
  l.table_floats = static_cast<int>(aligned_floats(l.k_steps * 8));
  l.halo_floats = static_cast<int>(aligned_floats(kDgradTcChunk * h.floats));
  l.buffer_floats = l.halo_floats + l.weight_floats;
  l.smem_bytes = 128 + 4 * (int64_t(l.table_floats) + 2 * int64_t(l.buffer_floats));
  return l;
}
// Worth it where the phases and channels fill at least half of the m16
// tile (an RGB stem at stride 2: 12 rows); unit stride keeps the forward
// (as dgrad) or the FFMA gather.
inline bool dgrad_tc_fits(const ConvParams& p) {
  const int64_t rows = p.stride_h * p.stride_w * p.in_channels_per_group();
  return p.in_channels_per_group() <= kMaxChannels && rows >= kDgradTcN / 2 &&
         rows <= kDgradTcN && p.out_channels_per_group() >= kDgradTcChunk &&
         dgrad_tc_layout(p).smem_bytes <= kMaxSmemBytes;
}

// dgrad runs on the forward kernel where it is a unit-stride forward that
// fits it (depthwise: the forward's register window), else on the gather.
inline bool dgrad_runs_as_fprop(const ConvParams& p) {
  return dgrad_is_fprop(p) && fprop_fits(dgrad_as_fprop(p));
}

}  // namespace small_channels
}  // namespace conv2d_ext
