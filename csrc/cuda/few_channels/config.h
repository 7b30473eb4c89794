// Tiles of the few-input-channel kernels (few_channels/), shared by the
// kernels and by the plan that decides whether a problem fits.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

#include "../../conv_params.h"
#include "../../options.h"
#include "../limits.h"

namespace conv2d_ext {
// Direct FFMA kernels for few input channels per group (depthwise layers, RGB
// stems; csrc/cuda/few_channels/). They do a few multiply-adds per
// byte, so they are built around memory traffic: a block stages an input
// tile with its halo in shared memory (16-byte copies where rows are
// 16-byte aligned) and every output element is written once.
namespace few_channels {

constexpr int kThreads = 256;
constexpr int kTileCols = 64;  // output columns of a block tile: two warps
constexpr int kSlots = kThreads / kTileCols;  // 64-thread slots: row or channel groups
constexpr int kMaxChannels = 4;  // input channels per group these kernels take
// Narrow tiles (at most 4 output channels per group: depthwise, grouped
// layers of 4 -> 4): each thread owns a column of 8 output rows and all of
// its group's output channels; 4 slots stack to 32 rows. A 64-channel wide
// tile would leave 15/16 of its FMAs idle on 4 channels per group (slower
// than the direct kernel).
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
// next fly. wgrad (which stages grad_output too) gained from three, and
// so did the forward once the tensor-copy engine staged it; the forward
// takes three where they fit in kFpropThreeStageBytes (three blocks per
// SM), else two.
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
// the bytes: 56-column planes staged as 72 x 60 boxes streamed slower than
// as 64 x 60 boxes (a copy-only kernel of the same pattern), and a
// 112-column plane
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
         wgrad_smem_bytes(p) <= max_block_smem_bytes(sm) - kWgradStaticSmemBytes;
}

// wgrad on tensor cores for wide tiles (few_channels/wgrad_tc.cu): a
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
inline int64_t wgrad_tc_smem_bytes(const ConvParams& p, bool tf32x3) {
  const int64_t halo_floats = wgrad_tc_halo(p).floats;
  if (halo_floats > kMaxSmemBytes) return INT64_MAX;  // a halo too large to stage
  const int64_t stages =
      (tf32x3 ? 3 : 2) * wgrad_tc_buffer_floats(p.in_channels_per_group(), halo_floats);
  // The warps' accumulators meet through the same memory at the end.
  const int64_t sums = int64_t(kThreads) * (kWgradTcCo / 16) * kWgradTcWarpN * 4;
  return 1024 + 4 * std::max(stages, sums);
}
inline bool wgrad_tc_fits(const ConvParams& p, bool tf32x3) {
  return p.in_channels_per_group() <= kMaxChannels && !narrow(p) &&
         wgrad_tc_smem_bytes(p, tf32x3) <= kMaxSmemBytes;
}

// The forward on tensor cores for wide tiles (few_channels/fprop_tc.cu):
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
inline FpropTcLayout fprop_tc_layout(const ConvParams& p, bool tf32x3) {
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
  l.smem_bytes = 128 + 4 * ((tf32x3 ? 2 : 1) * int64_t(l.weight_floats) + l.table_floats +
                            (tf32x3 ? 4 : 2) * int64_t(l.buffer_floats));
  return l;
}
// wgmma (Hopper) reads the weights as [k8 step][64 channels][8], without
// the pitch that keeps ldmatrix off bank conflicts.
constexpr int fprop_tc_weight_floats(const FpropTcLayout& l, bool sm90) {
  return sm90 ? l.k_steps * 8 * kFpropTcCo : l.weight_floats;
}
inline int64_t fprop_tc_smem_bytes(const FpropTcLayout& l, bool tf32x3, bool sm90) {
  return l.smem_bytes -
         4 * int64_t(tf32x3 ? 2 : 1) * (l.weight_floats - fprop_tc_weight_floats(l, sm90));
}
// The kernel's static shared memory (its copy barriers).
constexpr int64_t kFpropTcStaticSmemBytes = 16;
inline bool fprop_tc_fits(const ConvParams& p, bool tf32x3, int sm) {
  const int64_t co_tiles = (p.out_channels_per_group() + kFpropTcCo - 1) / kFpropTcCo;
  return p.in_channels_per_group() <= kMaxChannels &&
         p.out_channels_per_group() >= kFpropTcMinCo &&
         p.groups * co_tiles <= 65535 &&  // (group, channel tile) is the grid's y
         fprop_tc_layout(p, tf32x3).smem_bytes <=
             max_block_smem_bytes(sm) - kFpropTcStaticSmemBytes;
}

// dgrad on tensor cores for wide tiles (few_channels/dgrad_tc.cu): every
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

// ---- Which kernel runs -----------------------------------------------------
// One choice per pass: the launchers take it, and the plan reports it
// (conv2d_ext::kernel_variant, the _kernel op). `compiled_size`: the kernel
// size is on CONV2D_EXT_FOR_EACH_FEW_CHANNELS_KERNEL_SIZE; `vec`: rows are
// 16-byte aligned (can_vectorise).

// The forward's tile: wide (64 output channels), narrow (at most 4), or
// tall narrow; for tall tiles, column pairs and the staged columns' lead
// parity.
struct FpropVariant {
  bool narrow;    // at most 4 output channels per group (fprop_narrow)
  bool tall;      // narrow, kTallRows rows a thread (fprop_tall)
  bool pairs;     // tall, two columns a thread
  bool odd_lead;  // pairs: the staged columns start one before the tile's
};

// Column pairs on tall tiles where the register window runs (unit stride
// and dilation, a compiled kernel size). 16-byte copies and the tensor
// copy (whose boxes start 16-byte aligned) stage from the 4-aligned column
// at or before the tile's first (HaloCols): an odd lead where the left
// padding is odd.
inline FpropVariant choose_fprop_variant(const ConvParams& p, bool vec, bool compiled_size) {
  FpropVariant v{};
  v.narrow = fprop_narrow(p);
  v.tall = v.narrow && fprop_tall(p);
  v.pairs = v.tall && compiled_size && p.stride_h == 1 && p.stride_w == 1 &&
            p.dilation_h == 1 && p.dilation_w == 1;
  v.odd_lead = v.pairs && vec && p.pad_w % 2 != 0;
  return v;
}

// The taps of one kernel dimension that reach dgrad's stride phase `ph`:
// tap k reaches it when (ph + pad - k * dil) % stride == 0. Returns the
// first such tap (or kernel when none), the step between them and the
// offset of the first.
struct PhaseTaps {
  int first, step, count;
  int off_first;  // grad_output offset of tap `first`; later taps are lower
  int off_step;   // offset decrease per step
};

C10_HOST_DEVICE inline PhaseTaps phase_taps(int ph, int pad, int kernel, int stride, int dil) {
  PhaseTaps t{kernel, 1, 0, 0, 0};
  for (int k = 0; k < kernel && k < stride; ++k) {
    const int num = ph + pad - k * dil;
    if (((num % stride) + stride) % stride == 0) {
      t.first = k;
      break;
    }
  }
  if (t.first == kernel) return t;
  // Taps that reach a phase repeat every stride / gcd(stride, dil).
  int a = stride, b = dil;
  while (b != 0) {
    const int r = a % b;
    a = b;
    b = r;
  }
  t.step = stride / a;
  t.count = (kernel - 1 - t.first) / t.step + 1;
  t.off_first = (ph + pad - t.first * dil) / stride;  // exact
  t.off_step = t.step * dil / stride;                 // exact
  return t;
}

// Whether a dgrad phase of count_h x count_w taps takes two columns a
// thread (accumulate_pairs): a compiled kernel size (`kernel_h` > 0) and
// at least 2 input channels, with the taps' weights and window in registers.
C10_HOST_DEVICE constexpr bool dgrad_pair_phase(int kernel_h, int ci, int count_h, int count_w) {
  return kernel_h > 0 && ci >= 2 && count_h > 0 && count_w > 0 &&
         ci * (count_h * count_w + 16) <= 96;
}

// The gather dgrad's tiles: the specialised kernel at the fixed pitch, or
// the generic one (a size not compiled, or a halo wider than kDgradPitch);
// wide tiles where every phase takes column pairs. Which phases pair is
// decided per block in the kernel; `pairs` says whether any does.
struct DgradVariant {
  bool fixed_pitch;  // the specialised kernel (kDgradPitch)
  bool pairs;        // some phase takes column pairs
  bool wide;         // kDgradWideRows x kDgradWideCols tiles (every phase pairs)
};

// Wide tiles: every phase on the pair path (stride 2, unit dilation), phases
// of 65 to 112 columns, whose 64-column tiles would leave warps idle, and
// the wide halo within the pitch and two stages within the bound.
inline DgradVariant choose_dgrad_variant(const ConvParams& p, bool compiled_size) {
  DgradVariant v{};
  v.fixed_pitch = compiled_size && dgrad_halo(p).pitch == kDgradPitch;
  if (!v.fixed_pitch || !option(Option::kFewChannelsDgradPairs) || p.stride_h != 2 ||
      p.stride_w != 2 || p.dilation_h != 1 || p.dilation_w != 1)
    return v;
  const int kh = static_cast<int>(p.kernel_h), kw = static_cast<int>(p.kernel_w);
  const int ci = static_cast<int>(p.in_channels_per_group());
  int paired = 0;
  for (int ph = 0; ph < 2; ++ph)
    for (int pw = 0; pw < 2; ++pw) {
      const PhaseTaps th = phase_taps(ph, static_cast<int>(p.pad_h), kh, 2, 1);
      const PhaseTaps tw = phase_taps(pw, static_cast<int>(p.pad_w), kw, 2, 1);
      paired += dgrad_pair_phase(kh, ci, th.count, tw.count);
    }
  v.pairs = paired > 0;
  const int64_t cols = (p.in_w + 1) / 2;
  if (paired < 4 || !option(Option::kFewChannelsDgradWide) || cols <= kTileCols ||
      cols > kDgradWideCols)
    return v;
  const Halo h = dgrad_wide_halo(p);
  v.wide = h.pitch == kDgradWidePitch && dgrad_stages(p, h) == 2;
  return v;
}

// wgrad on FFMA: narrow tiles (at most kNarrowMaxCo output channels per
// group) or wide ones; on tensor cores, TF32 or 3xTF32, the latter's
// stage on wgmma where `sm90` (few_channels_wgrad_sm90).
struct WgradVariant {
  bool narrow;
};
inline WgradVariant choose_wgrad_variant(const ConvParams& p) { return {narrow(p)}; }
struct WgradTcVariant {
  bool tf32x3, sm90;
};
inline WgradTcVariant choose_wgrad_tc_variant(bool tf32x3, bool sm90) {
  return {tf32x3, tf32x3 && sm90};
}

}  // namespace few_channels
}  // namespace conv2d_ext
