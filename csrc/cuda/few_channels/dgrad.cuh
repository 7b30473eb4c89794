// The few-channel gather dgrad's kernel and launch templates (see
// dgrad.cu for the design), shared by the files that instantiate them, one
// (kernel size, input channels) launch each (few_channels/instantiations/).
#pragma once


#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../../plan.h"
#include "../kernel_sizes.cuh"
#include "../tensor_map.h"
#include "few_channels.cuh"
#include "few_channels.h"

namespace conv2d_ext {
namespace cuda {
namespace few_channels_dgrad {


namespace fc = conv2d_ext::few_channels;
using few_channels::HaloCols;

constexpr int kRows = fc::kNarrowRows;
constexpr int kTileRows = kRows * fc::kSlots;
constexpr int kChunk = fc::kDgradCoChunk;

using fc::PhaseTaps;
using fc::phase_taps;

// One kernel column of one grad_output channel, for phases whose taps along
// the height read consecutive grad_output rows (unit dilation at any
// stride, or dilation equal to the stride): tap q of the phase, counted
// from the last, reads rows q .. q + kRows - 1 of the thread's column. So
// the column's kRows + kCount - 1 rows are loaded once into registers and
// every tap reads them there. The tap count and the pitch are compile-time
// so that the loads are one base register plus immediates, unpredicated,
// and no tap is branched around (a run-time count costs many more
// instructions per column: address arithmetic and predicates). `w` holds
// the column's taps' weights, tap q's 4 at w + 4q.
template <int kCount, int kCi, int kPitch>
__device__ __forceinline__ void accumulate_column(const float* s, const float* w,
                                                  float (&acc)[kRows][kCi]) {
  float win[kRows + kCount - 1];
#pragma unroll
  for (int i = 0; i < kRows + kCount - 1; ++i) win[i] = s[i * kPitch];
#pragma unroll
  for (int q = 0; q < kCount; ++q) {
    float wv[4];
    load_tile(w + 4 * q, wv);
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int ci = 0; ci < kCi; ++ci) acc[r][ci] = fmaf(win[q + r], wv[ci], acc[r][ci]);
  }
}

// Two columns a thread, for phases at stride 2 and unit dilation: the
// thread's columns j, j + 1 read grad_output columns that overlap in all but
// one, so a window row is ceil((kCw + 2) / 2) 8-byte loads for every tap
// of the row and both columns. Per channel of a stem phase of 4 x 4 taps
// that is 21 window and 16 weight loads for 384 FFMA, where one column a
// thread (accumulate_column) spends 60 loads on the same FFMA, and fewer
// instructions a channel in all. `s` points at row 0 of the
// window (tap q = 0, the phase's last kernel row, for the thread's row 0)
// at the even column at or before the thread's first; kOdd says whether
// that is one column before. `w` holds the channel's taps, tap (q, b) at w
// + 4 (b kCh + q). part[2 r + c] is row r, column c. Each sum takes its
// products in accumulate_column's order, so both paths give the same bits.
constexpr int kPairRows = 4;  // 8 warps of 32 column pairs: a 32 x 64 tile
static_assert(2 * kPairRows == kRows && fc::kThreads == 8 * 32 && fc::kTileCols == 64,
              "the pair path covers the one-column path's tile and sums");
template <int kCh, int kCw, int kCi, int kPitch, int kOdd>
__device__ __forceinline__ void accumulate_pairs(const float* s, const float* w,
                                                 float (&part)[2 * kPairRows][kCi]) {
  constexpr int kLoads = (kOdd + kCw + 2) / 2;  // pairs covering kOdd + kCw + 1 columns
  constexpr int kWinRows = kPairRows + kCh - 1;
  // The whole window first (its loads in flight together), then tap by
  // tap, the next tap's weights loaded before this tap's products: with
  // the weights loaded where they are used, each tap waited for its load.
  float v[kWinRows][2 * kLoads];
#pragma unroll
  for (int i = 0; i < kWinRows; ++i)
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const float2 t = *reinterpret_cast<const float2*>(s + i * kPitch + 2 * k);
      v[i][2 * k] = t.x;
      v[i][2 * k + 1] = t.y;
    }
  float wv[2][4];
  load_tile(w, wv[0]);
#pragma unroll
  for (int t = 0; t < kCh * kCw; ++t) {
    const int b = t / kCh, q = t % kCh;  // the arranged order: tap (q, b) at w + 4 (b kCh + q)
    if (t + 1 < kCh * kCw) load_tile(w + 4 * (t + 1), wv[(t + 1) & 1]);
#pragma unroll
    for (int r = 0; r < kPairRows; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int ci = 0; ci < kCi; ++ci)
          part[2 * r + c][ci] =
              fmaf(v[r + q][kOdd + c + kCw - 1 - b], wv[t & 1][ci], part[2 * r + c][ci]);
  }
}

// The phases the pair path is compiled for. At stride 2 and unit dilation
// a dimension of K taps gives its phases K / 2 or (K + 1) / 2 of them. The
// weights (kCi x taps) and the two levels of sums (2 x 8 x kCi) must stay
// within 128 registers. Layers of 2 to 4 input channels per group only:
// each variant compiles the whole chunk loop again, and depthwise layers
// (one input channel) were not shown to gain.
template <int KH, int kCi>
__host__ __device__ constexpr bool pair_variant(int count_h, int count_w) {
  return fc::dgrad_pair_phase(KH, kCi, count_h, count_w);
}

// fn(Int<count_h>{}, Int<count_w>{}, Int<odd>{}) for the phases the pair
// path is compiled for (K / 2 or (K + 1) / 2 taps a dimension, where
// pair_variant holds); nothing for the others.
template <int KH, int KW, int kCi, typename Fn>
__device__ __forceinline__ void with_pair_taps(int count_h, int count_w, int odd, Fn&& fn) {
  if constexpr (KH > 0) {
    auto per_w = [&](auto ch) {
      constexpr int kCh = decltype(ch)::value;
      auto per_odd = [&](auto cw) {
        constexpr int kCw = decltype(cw)::value;
        if constexpr (pair_variant<KH, kCi>(kCh, kCw)) {
          if (odd) {
            fn(Int<kCh>{}, Int<kCw>{}, Int<1>{});
          } else {
            fn(Int<kCh>{}, Int<kCw>{}, Int<0>{});
          }
        }
      };
      if (count_w == KW / 2) {
        per_odd(Int<KW / 2>{});
      } else if (count_w == (KW + 1) / 2) {
        per_odd(Int<(KW + 1) / 2>{});
      }
    };
    if (count_h == KH / 2) {
      per_w(Int<KH / 2>{});
    } else if (count_h == (KH + 1) / 2) {
      per_w(Int<(KH + 1) / 2>{});
    }
  }
}

// fn(Int<count>{}) for count in 1 .. kMax.
template <int kMax, typename Fn>
__device__ __forceinline__ void with_count(int count, Fn&& fn) {
  if constexpr (kMax > 0) {
    if (count == kMax) {
      fn(Int<kMax>{});
      return;
    }
    with_count<kMax - 1>(count, fn);
  }
}

// Window phases' weights, prearranged once per call (dgrad.cu).
void launch_arrange_phase_weights(dim3 grid, cudaStream_t stream, const ConvParams& p,
                                  const float* w, float* out, int co_pad, int phase_floats);

// A block's (phase, tile) index t as the grid numbers them (phase-major;
// the tile grid is sized for the largest phase, phase 0) and where the
// tile lies: shared by the kernel and the host's block order.
struct BlockTile {
  int ph, pw;                  // the phase: rows ph + sh * i, columns pw + sw * j
  int i0, j0;                  // the tile's first row and column in the phase
  int rows_phase, cols_phase;  // the phase's rows and columns
};
__host__ __device__ __forceinline__ BlockTile block_tile(int t, unsigned tiles, int tiles_w,
                                                         int tile_rows, int tile_cols, int sh,
                                                         int sw, int H, int W) {
  // Unsigned: t and tiles are not negative, and the division is shorter.
  const int tile = t % tiles, phase = t / tiles;
  BlockTile b;
  b.ph = phase / sw;
  b.pw = phase % sw;
  b.i0 = (tile / tiles_w) * tile_rows;
  b.j0 = (tile % tiles_w) * tile_cols;
  b.rows_phase = (H - b.ph + sh - 1) / sh;
  b.cols_phase = (W - b.pw + sw - 1) / sw;
  return b;
}

// The order blocks start in. A phase's tiles differ in work (pixels times
// the phase's taps: a stem's heaviest block does several times its
// lightest's), and in the grid's order every image's blocks ended on its
// heaviest phase, so the last wave's longest blocks ran on a GPU going
// idle. So blocks take their
// (phase, tile) heaviest first within groups of items (group, image) of
// at most one wave: the blocks in flight read about as few images as in the
// grid's order, which keeps their grad_output in L2.
constexpr int kBlocksPerSm = 2;
constexpr int kMaxOrdered = 256;  // (phase, tile) pairs; more keep the grid's order
struct BlockOrder {
  int items;                         // items per group; 0: the grid's order
  uint16_t tile_phase[kMaxOrdered];  // rank -> (phase, tile) as the grid numbers them
};

// kWide: the 16 x 112 tiles of choose_dgrad_variant(), pair path only, at their own
// pitch (a separate instantiation: as a run-time branch of one kernel the
// two pitches' pair variants made ptxas spill in the chunk loop, and both
// tilings ran much slower).
template <int KH_T, int KW_T, int kCi, bool kWide>
__global__ void __launch_bounds__(fc::kThreads, kBlocksPerSm)
    dgrad_few_channels_kernel(const __grid_constant__ CUtensorMap go_map, const ConvParams p,
                                const float* __restrict__ grad_out,
                                const float* __restrict__ w,
                                const float* __restrict__ w_phase, int phase_floats,
                                float* __restrict__ grad_in, bool vec, bool tma, int halo_rows,
                                int pitch_arg, int tiles_w, int tile_rows, int tile_cols,
                                int stages, int stage_floats,
                                bool pairs_allowed, const BlockOrder order) {
  // Specialised sizes stage at a fixed pitch (the launch checks it fits).
  // Wide tiles (pairs only) stage at their own fixed pitch.
  constexpr int kPitch = kWide ? fc::kDgradWidePitch : KH_T > 0 ? fc::kDgradPitch : 0;
  const int pitch = static_or<kPitch>(pitch_arg);
  extern __shared__ __align__(128) float4 smem4[];  // the tensor copy writes 128-byte aligned
  __shared__ uint64_t staged[2];
  few_channels::CopyRing<2> ring(staged, tma);
  // `stages` buffers (two where they fit: the next chunk's copies fly while
  // this one computes), each grad_output [kChunk][halo_rows][pitch], then
  // the weights: [kChunk][kh][kw][4 ci]; window phases: [kChunk][kw tap
  // b][kh tap q][4 ci].
  auto s_go = [&](int b) { return reinterpret_cast<float*>(smem4) + b * stage_floats; };
  auto s_w = [&](int b) { return s_go(b) + kChunk * halo_rows * pitch; };
  const int cin_g = p.in_channels_per_group();
  const int cout_g = p.out_channels_per_group();
  const int KH = static_or<KH_T>(p.kernel_h), KW = static_or<KW_T>(p.kernel_w);
  const int H = p.in_h, W = p.in_w, Ho = p.out_h, Wo = p.out_w;
  const int sh = p.stride_h, sw = p.stride_w;

  // The block's (phase, tile) index t and its first item. The hardware
  // starts blocks in the order of (x, y, z), x fastest: position `at`, in
  // groups of order.items items of gridDim.x blocks, rank-major in a group.
  int t = blockIdx.x, g_first = blockIdx.y, n_first = blockIdx.z;
  if (order.items > 0) {
    const int64_t X = gridDim.x, items = int64_t(gridDim.y) * gridDim.z;
    const int64_t at = blockIdx.x + X * (blockIdx.y + int64_t(gridDim.y) * blockIdx.z);
    const int64_t first = at / (X * order.items) * order.items;
    const int64_t in_group = min(int64_t(order.items), items - first);
    const int64_t r = at - first * X;
    t = order.tile_phase[r / in_group];
    const int64_t item = first + r % in_group;
    g_first = static_cast<int>(item % gridDim.y);
    n_first = static_cast<int>(item / gridDim.y);
  }
  const BlockTile bt =
      block_tile(t, gridDim.x / (sh * sw), tiles_w, tile_rows, tile_cols, sh, sw, H, W);
  const int ph = bt.ph, pw = bt.pw, i0 = bt.i0, j0 = bt.j0;
  const int rows_phase = bt.rows_phase, cols_phase = bt.cols_phase;

  const PhaseTaps th = phase_taps(ph, p.pad_h, KH, sh, p.dilation_h);
  const PhaseTaps tw = phase_taps(pw, p.pad_w, KW, sw, p.dilation_w);
  // grad_output rows a tile needs: i + off for off in [off_first - (count-1)*off_step, off_first].
  const int off_h_min = th.off_first - (th.count - 1) * th.off_step;
  const int off_w_min = tw.off_first - (tw.count - 1) * tw.off_step;
  const int rows_needed = tile_rows + (th.count - 1) * th.off_step;
  const int cols_needed = tile_cols + (tw.count - 1) * tw.off_step;
  const HaloCols hc = few_channels::halo_cols(j0 + off_w_min, vec);

  const bool any_tap = th.count > 0 && tw.count > 0;
  // Window phases (the launch arranged their weights: dilation divides the
  // stride, so th.off_step == 1).
  const bool window = KH_T > 0 && w_phase != nullptr;
  const int taps_phase = th.count * tw.count;
  // Two columns of kPairRows rows a thread (block-uniform): the tile's
  // column pairs inside the phase (`tile_pairs`, 32 but at the right edge)
  // times its 8 row groups, in that order over the threads, so that a
  // partial tile idles whole warps rather than lanes (a stem's 112-column
  // phase ends in a tile of 24 pairs: 6 busy warps, not 8 three-quarters
  // busy). Threads past the 8 row groups compute row group 0 again and
  // store nothing. Otherwise a column of kRows rows: 64-thread slots stack
  // the rows.
  bool pairs = false;
  if (pairs_allowed && window && sh == 2 && sw == 2 && p.dilation_h == 1 && p.dilation_w == 1)
    with_pair_taps<KH_T, KW_T, kCi>(th.count, tw.count, 0, [&](auto, auto, auto) { pairs = true; });
  const int tile_pairs = min(tile_cols / 2, max(1, (cols_phase - j0 + 1) / 2));
  const int group = threadIdx.x / tile_pairs;  // the thread's row group (pairs)
  const bool live = !pairs || group < tile_rows / kPairRows;
  const int col = pairs ? (live ? 2 * (threadIdx.x - group * tile_pairs) : 0)
                        : threadIdx.x % fc::kTileCols;
  const int r0 = pairs ? (live ? group : 0) * kPairRows : (threadIdx.x / fc::kTileCols) * kRows;
  // The first row of the warp's first thread, and its first column: a warp
  // wholly past the phase (or past the row groups) skips the taps.
  const int warp_r0 = pairs ? (threadIdx.x & ~31) / tile_pairs * kPairRows : r0;
  const int warp_col0 = pairs ? 0 : col & ~31;
  const int j = j0 + col;

  // Every item (group, image) of the block: chunks of kChunk grad_output
  // channels staged in turn, each chunk's products summed by
  // `products(sgo_b, sw_b, chunk, part)`. Called once per block with the
  // phase's variant, so that a chunk's code holds no dispatch.
  auto items = [&](auto&& products) {
    for (int g = g_first; g < p.groups; g += gridDim.y) {
      for (int n = n_first; n < p.batch; n += gridDim.z) {
        float acc[kRows][kCi];
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int c = 0; c < kCi; ++c) acc[r][c] = 0.f;

        // Copies of chunk co0's halo and weights into buffer b.
        auto stage = [&](int co0, int b) {
          const int chunk = min(kChunk, cout_g - co0);
          // The chunk's arranged weights (window phases): 4 channels' taps.
          const float* w_chunk =
              window ? w_phase + (int64_t(g) * sh * sw + ph * sw + pw) * phase_floats +
                           co0 * taps_phase * 4
                     : nullptr;
          const int w_vecs = kChunk * taps_phase;  // 16-byte pieces
          if (tma) {
            // The box holds kChunk channels; past the chunk's they are never read.
            if (threadIdx.x == 0) {
              mbarrier_arrive_expect_tx(
                  &ring.barrier[b], 4u * (kChunk * halo_rows * pitch + (window ? 4 * w_vecs : 0)));
              tma_load_4d(s_go(b), &go_map, hc.first - hc.lead, i0 + off_h_min,
                          g * cout_g + co0, n, &ring.barrier[b]);
              if (window) {
                grid_dependency_wait();  // the arrangement kernel has written w_phase
                bulk_copy_to_smem(s_w(b), w_chunk, 16u * w_vecs, &ring.barrier[b]);
              }
            }
          } else {
            few_channels::stage_halo(
                s_go(b), grad_out + plane_offset(n, p.out_channels, g * cout_g + co0, Ho * Wo),
                chunk, Ho, Wo, i0 + off_h_min, rows_needed, hc, cols_needed, pitch,
                halo_rows * pitch, vec);
            if (window) {
              grid_dependency_wait();  // the arrangement kernel has written w_phase
              for (int e = threadIdx.x; e < w_vecs; e += fc::kThreads)
                cp_async_16(s_w(b) + 4 * e, w_chunk + 4 * e);
            }
          }
          cp_async_commit();
          if (!window) {
            for (int e = threadIdx.x; e < kChunk * KH * KW * 4; e += fc::kThreads) {
              const int ci = e % 4;
              const int tap = (e / 4) % (KH * KW);
              const int co = co0 + e / (4 * KH * KW);
              s_w(b)[e] = weight_or_zero(p, w, WeightOrder::kFprop, g, co, ci, tap / KW, tap % KW);
            }
          }
        };

        __syncthreads();  // the previous item is consumed
        if (any_tap) stage(0, 0);
        for (int co0 = 0, q = 0; any_tap && co0 < cout_g; co0 += kChunk, ++q) {
          const int chunk = min(kChunk, cout_g - co0);
          const int b = stages == 2 ? q & 1 : 0;
          if (stages == 1 && q > 0) {
            __syncthreads();  // the previous chunk is consumed
            stage(co0, 0);
          }
          cp_async_wait<0>();
          if (tma) ring.wait(b);
          __syncthreads();  // chunk q has landed; every warp is done with the previous one
          if (stages == 2 && co0 + kChunk < cout_g) stage(co0 + kChunk, b ^ 1);
          // Warps whose rows or columns lie wholly past the phase (a stem's
          // 112-row phases fill three and a half 32-row tiles) stage their
          // share and skip the taps, leaving the issue slots to the other
          // block on the SM.
          if (i0 + warp_r0 >= rows_phase || warp_r0 >= tile_rows || j0 + warp_col0 >= cols_phase)
            continue;  // warp-uniform
          // Two levels of sums: each chunk's products (at most 4 channels x
          // the phase's taps) into `part`, the chunks' sums into `acc`. One
          // chain over every output channel and tap (hundreds of products
          // for an RGB stem) had several times cuDNN's relative error.
          float part[kRows][kCi];
#pragma unroll
          for (int r = 0; r < kRows; ++r)
#pragma unroll
            for (int ci = 0; ci < kCi; ++ci) part[r][ci] = 0.f;
          products(s_go(b), s_w(b), chunk, part);
#pragma unroll
          for (int r = 0; r < kRows; ++r)
#pragma unroll
            for (int ci = 0; ci < kCi; ++ci) acc[r][ci] += part[r][ci];
        }
        // Sum e of a thread: row r0 + e of its column, or with pairs row r0
        // + e / 2 of column col + e % 2.
#pragma unroll
        for (int ci = 0; ci < kCi; ++ci) {
          if (ci >= cin_g || !live) continue;
          float* gi = grad_in + plane_offset(n, p.in_channels, g * cin_g + ci, H * W) + pw;
#pragma unroll
          for (int e = 0; e < kRows; ++e) {
            const int i = i0 + r0 + (pairs ? e / 2 : e), jj = j + (pairs ? e % 2 : 0);
            if (i < rows_phase && jj < cols_phase) gi[(ph + sh * i) * W + sw * jj] = acc[e][ci];
          }
        }
      }
    }
  };

  if constexpr (KH_T > 0) {
    if (pairs) {
      // Columns of tap b of the phase's last kernel row: col + lead + kCw -
      // 1 - b for the thread's first column (off_step == 1).
      with_pair_taps<KH_T, KW_T, kCi>(th.count, tw.count, hc.lead & 1, [&](auto ch, auto cw,
                                                                            auto odd) {
        constexpr int kCh = decltype(ch)::value, kCw = decltype(cw)::value;
        items([&](const float* sgo_b, const float* sw_b, int chunk, float (&part)[kRows][kCi]) {
          const float* sgo = sgo_b + r0 * kPitch + (hc.lead & ~1) + col;
          for (int c = 0; c < chunk; ++c) {
            accumulate_pairs<kCh, kCw, kCi, kPitch, decltype(odd)::value>(
                sgo + c * halo_rows * kPitch, sw_b + c * taps_phase * 4, part);
          }
        });
      });
      return;
    }
  }
  if constexpr (kWide) {
    __trap();  // the launch takes wide tiles only where every phase pairs
  } else {
  if constexpr (KH_T > 0) {
    if (window) {
      items([&](const float* sgo_b, const float* sw_b, int chunk, float (&part)[kRows][kCi]) {
        with_count<KH_T>(th.count, [&](auto count_tag) {
          constexpr int kCount = decltype(count_tag)::value;
          for (int c = 0; c < chunk; ++c) {
            // Tap q = 0 is the phase's last kernel row; its window starts at row r0.
            const float* sgo = sgo_b + c * halo_rows * kPitch + hc.lead + r0 * kPitch + col +
                               (tw.off_first - off_w_min);
            const float* swc = sw_b + c * taps_phase * 4;
            for (int b = 0; b < tw.count; ++b)
              accumulate_column<kCount, kCi, kPitch>(sgo - b * tw.off_step, swc + b * kCount * 4,
                                                     part);
          }
        });
      });
      return;
    }
  }
  items([&](const float* sgo_b, const float* sw_b, int chunk, float (&part)[kRows][kCi]) {
    for (int c = 0; c < chunk; ++c) {
      const float* sgo = sgo_b + c * halo_rows * pitch + hc.lead;
      const float* swc = sw_b + c * KH * KW * 4;
      for (int a = 0; a < th.count; ++a) {
        const int kh = th.first + a * th.step;
        // Row of tap kh for tile row 0: i0 + off(kh) - (i0 + off_h_min).
        const int row = th.off_first - a * th.off_step - off_h_min + r0;
        for (int b = 0; b < tw.count; ++b) {
          const int kw = tw.first + b * tw.step;
          const int cc = tw.off_first - b * tw.off_step - off_w_min + col;
          float wv[4];
          load_tile(swc + (kh * KW + kw) * 4, wv);
          const float* s = sgo + row * pitch + cc;
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            const float v = s[r * pitch];
#pragma unroll
            for (int ci = 0; ci < kCi; ++ci) part[r][ci] = fmaf(v, wv[ci], part[r][ci]);
          }
        }
      }
    }
  });
  }
}

// The blocks' order (see BlockOrder): (phase, tile) by work, heaviest
// first (ties in the grid's order), in groups of items of at most a wave.
inline BlockOrder block_order(const ConvParams& p, int64_t tiles, int64_t tiles_w, int64_t tile_rows,
                       int64_t tile_cols, dim3 grid) {
  BlockOrder order{};
  const int64_t phases = p.stride_h * p.stride_w, pairs = tiles * phases;
  if (!option(Option::kFewChannelsDgradOrder) || pairs > kMaxOrdered) return order;
  int64_t taps[kMaxOrdered];  // per phase (phases <= pairs)
  for (int64_t phase = 0; phase < phases; ++phase) {
    const int ph = static_cast<int>(phase / p.stride_w), pw = static_cast<int>(phase % p.stride_w);
    taps[phase] =
        int64_t(phase_taps(ph, static_cast<int>(p.pad_h), static_cast<int>(p.kernel_h),
                           static_cast<int>(p.stride_h), static_cast<int>(p.dilation_h))
                    .count) *
        phase_taps(pw, static_cast<int>(p.pad_w), static_cast<int>(p.kernel_w),
                   static_cast<int>(p.stride_w), static_cast<int>(p.dilation_w))
            .count;
  }
  int64_t work[kMaxOrdered];
  for (int e = 0; e < pairs; ++e) {  // blockIdx.x's numbering
    const BlockTile b = block_tile(
        e, static_cast<unsigned>(tiles), static_cast<int>(tiles_w), static_cast<int>(tile_rows),
        static_cast<int>(tile_cols), static_cast<int>(p.stride_h), static_cast<int>(p.stride_w),
        static_cast<int>(p.in_h), static_cast<int>(p.in_w));
    work[e] = std::clamp<int64_t>(b.rows_phase - b.i0, 0, tile_rows) *
              std::clamp<int64_t>(b.cols_phase - b.j0, 0, tile_cols) *
              taps[b.ph * p.stride_w + b.pw];
    order.tile_phase[e] = static_cast<uint16_t>(e);
  }
  std::stable_sort(order.tile_phase, order.tile_phase + pairs,
                   [&](uint16_t a, uint16_t b) { return work[a] > work[b]; });
  // Groups of equal size, each at most a wave: sizes near a wave's worth
  // of images did as well as any tried, and better than the grid's order or
  // one group without locality (docs/kernels.md, "Few channels on FFMA").
  const int64_t items = int64_t(grid.y) * grid.z;
  const int64_t wave =
      int64_t(kBlocksPerSm) * device_properties()->multiProcessorCount;
  const int64_t groups = std::max<int64_t>(1, ceil_div(pairs * items, wave));
  order.items = static_cast<int>(std::min<int64_t>(ceil_div(items, groups), INT32_MAX));
  return order;
}

template <int KH, int KW, int kCi>
void launch(const ConvParams& p, const at::TensorBase& grad_out, const float* w, float* gi,
            bool vec) {
  const fc::DgradVariant v = fc::choose_dgrad_variant(p, KH > 0);
  if constexpr (KH > 0) {
    // Strides and dilations whose halo is wider than the fixed pitch.
    if (!v.fixed_pitch) {
      return launch<0, 0, kCi>(p, grad_out, w, gi, vec);
    }
  }
  // One tile geometry, its halo and stages (choose_dgrad_variant checked
  // that two fit wide tiles).
  const bool wide = v.wide;
  const fc::Halo h = wide ? fc::dgrad_wide_halo(p) : fc::dgrad_halo(p);
  const int64_t tile_rows = wide ? fc::kDgradWideRows : kTileRows;
  const int64_t tile_cols = wide ? fc::kDgradWideCols : fc::kTileCols;
  const int stages = fc::dgrad_stages(p, h);
  const int64_t stage_floats = fc::dgrad_stage_floats(p, h);
  const size_t smem =
      static_cast<size_t>(stages == 2 ? 2 * 4 * stage_floats : fc::dgrad_smem_bytes(p, h));
  const int64_t tiles_w = ceil_div(ceil_div(p.in_w, p.stride_w), tile_cols);
  const int64_t tiles = ceil_div(ceil_div(p.in_h, p.stride_h), tile_rows) * tiles_w;
  const int64_t phases = p.stride_h * p.stride_w;
  const int64_t blocks = tiles * phases;
  TORCH_CHECK(blocks < (int64_t(1) << 31), "conv2d_ext: input too large for the few-channel dgrad");
  auto stream = current_stream();

  // Window phases read their weights prearranged (see the kernel); strides
  // past 8 (mostly phases no tap reaches) stage them from the weight itself.
  at::TensorBase w_phase;
  int phase_floats = 0;
  if (KH > 0 && p.stride_h % p.dilation_h == 0 && phases <= 64) {
    const int64_t co_pad = ceil_div(p.out_channels_per_group(), kChunk) * kChunk;
    const int64_t floats = co_pad * p.kernel_h * p.kernel_w * 4;
    TORCH_CHECK(floats < (int64_t(1) << 31) && phases < (int64_t(1) << 31),
                "conv2d_ext: weight too large for the few-channel dgrad");
    phase_floats = static_cast<int>(floats);
    w_phase = scratch({p.groups * phases * floats}, grad_out.scalar_type());
    const dim3 grid(static_cast<unsigned>(ceil_div(floats, 256)),
                    static_cast<unsigned>(std::min(phases, kMaxGridYZ)),
                    static_cast<unsigned>(std::min(p.groups, kMaxGridYZ)));
    launch_arrange_phase_weights(grid, stream, p, w, w_phase.data_ptr<float>(),
                                 static_cast<int>(co_pad), phase_floats);
  }

  const bool tma = few_channels::tma_stages(vec, h);
  CUtensorMap go_map{};  // not read without tma
  if (tma) {
    go_map = nchw_tensor_map(grad_out, static_cast<uint32_t>(h.pitch),
                             static_cast<uint32_t>(h.rows), kChunk, 1);
  }
  const dim3 grid(blocks, std::min(p.groups, kMaxGridYZ), std::min(p.batch, kMaxGridYZ));
  const BlockOrder order = block_order(p, tiles, tiles_w, tile_rows, tile_cols, grid);
  auto kernel = dgrad_few_channels_kernel<KH, KW, kCi, false>;
  if constexpr (KH > 0 && kCi >= 2) {
    if (wide) kernel = dgrad_few_channels_kernel<KH, KW, kCi, true>;
  }
  ensure_dynamic_smem(kernel, smem);
  // After the arrangement kernel, a programmatic dependent launch (sm_90):
  // the blocks start and copy their first grad_output while it runs. With
  // the Hopper code switched off, the plain launch other GPUs take.
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(fc::kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (w_phase.defined() && hopper_kernels(current_sm())) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  C10_CUDA_CHECK(cudaLaunchKernelEx(
      &config, kernel, go_map, p, grad_out.data_ptr<float>(), w,
      w_phase.defined() ? w_phase.data_ptr<float>() : nullptr, phase_floats, gi, vec, tma, h.rows,
      h.pitch, static_cast<int>(tiles_w), static_cast<int>(tile_rows),
      static_cast<int>(tile_cols), stages, static_cast<int>(stage_floats),
      option(Option::kFewChannelsDgradPairs), order));
}

// One kernel size's launches, over the group's input channels. Each
// (size, input channels) launch is instantiated in its own file
// (few_channels/instantiations/), so that the build compiles them in
// parallel; here they are only declared.
#define CONV2D_EXT_EXTERN_DGRAD_CI(H, W)                                                    \
  extern template void launch<H, W, 1>(const ConvParams&, const at::TensorBase&, const float*, \
                                       float*, bool);                                      \
  extern template void launch<H, W, 2>(const ConvParams&, const at::TensorBase&, const float*, \
                                       float*, bool);                                      \
  extern template void launch<H, W, 3>(const ConvParams&, const at::TensorBase&, const float*, \
                                       float*, bool);                                      \
  extern template void launch<H, W, 4>(const ConvParams&, const at::TensorBase&, const float*, \
                                       float*, bool);
CONV2D_EXT_FOR_EACH_FEW_CHANNELS_KERNEL_SIZE(CONV2D_EXT_EXTERN_DGRAD_CI)
CONV2D_EXT_EXTERN_DGRAD_CI(0, 0)
#undef CONV2D_EXT_EXTERN_DGRAD_CI

template <int KH, int KW>
void launch_size(const ConvParams& p, const at::TensorBase& grad_out, const float* w, float* gi,
                 bool vec) {
  switch (p.in_channels_per_group()) {
    case 1:
      return launch<KH, KW, 1>(p, grad_out, w, gi, vec);
    case 2:
      return launch<KH, KW, 2>(p, grad_out, w, gi, vec);
    case 3:
      return launch<KH, KW, 3>(p, grad_out, w, gi, vec);
    default:
      return launch<KH, KW, 4>(p, grad_out, w, gi, vec);
  }
}

}  // namespace few_channels_dgrad
}  // namespace cuda
}  // namespace conv2d_ext
