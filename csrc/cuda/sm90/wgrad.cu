// Backward-weight pass (wgrad) on Hopper's wgmma, unit stride.
//
// GEMM view per block: M = (input channel, tap) rows, N = 64 output
// channels, K = output positions of the block's slice of the batch. The
// mma.sync kernel (implicit_gemm/wgrad.cu) explains why K is split and how
// the slices are reduced in a fixed order; this one changes the inner loop.
//
// wgmma reads TF32 operands from shared memory only K-major in 16-byte
// aligned pieces, and a tap shifts K (positions) by any number of floats.
// So the shifted operand comes from registers: A, the input at each row's
// tap, is loaded with 4-byte shared loads from a plain NCHW halo (a plane
// pitch of 4 mod 8 floats puts the 8 channels x 4 positions of a load in 32
// different banks) and rounded or split as loaded. B, grad_output, has no
// shift: a TMA box of 32 positions x 64 channels lands as K-major 128-byte
// rows in the 128-byte swizzle, which wgmma reads as it is; the threads
// only round it (or split it into big and small halves) in place.
//
// A unit is 8 input channels at one tap; a warp's 16 rows are two units
// (rows gq and gq + 8 of the m16 layout: the lane's channel at each unit's
// tap), an m64 tile 8 units. A block holds `MT` tiles of consecutive units
// ((channel group, tap) order), so its halo covers a few channel groups, or
// one where the layout keeps a block's units in one group.
//
// Per K tile (rows x 64 output columns of one image, rows of one dilation
// phase): the halo box and B arrive by TMA (B by cp.async where grad_output's
// rows are not 16-byte multiples), both double-buffered. The next K tile's B
// is rounded or split under this one's wgmmas, two 16-byte pieces per thread
// in each of a row's last four k8 steps (its copy, started when the tile
// before ended, has had half a row to land). Each k8 step loads A for every
// tile, then issues the tiles' wgmmas as one group; a step's group retires
// one step later, so its A registers come in two sets.
//
// 3xTF32 (IEEE mode): small*big + big*small + big*big of each step go into a
// per-tile temporary that is restarted every 4 steps and then added to the
// accumulators with FADDs: the tensor cores truncate as they accumulate,
// and over a slice's K a single chain loses TF32-like accuracy.
//
// Positions past the output's right edge have zero grad_output, but the
// input they reach may hold Inf or NaN that no real product meets: their A
// values are zeroed (0 * Inf would be NaN).
#include <cuda.h>

#include "../../plan.h"
#include "../common.cuh"
#include "../mma.cuh"
#include "../split_reduce.cuh"
#include "../tensor_map.h"
#include "config.h"
#include "sm90.h"

namespace conv2d_ext {
namespace cuda {
namespace {

namespace cfg = igemm_wgrad_sm90;

template <int N>
using Steps = std::integral_constant<int, N>;

// The 3xTF32 split of both operands: big rounded (long reductions need
// the margin against cuDNN's FP32), small left to the tensor cores'
// truncation (two instructions fewer; mma.cuh has the error bounds).
__device__ __forceinline__ void split3(float x, uint32_t& big, uint32_t& small) {
  tf32_split</*kRoundBig=*/true, /*kRoundSmall=*/false>(x, big, small);
}

// A block's share of the weight gradient: group g, output channels co0 ..
// co0 + 63, MT m64 tiles of units (8 input channels at one tap), and its
// split's K tiles.
struct BlockWork {
  int unit_block, co_tile, g, co0;
  int64_t kt_begin, kt_end;
  int u0, block_group, tap0;
};

__device__ __forceinline__ BlockWork block_work(const cfg::Layout& L, int64_t tiles_per_split,
                                                int per_block) {
  BlockWork w;
  int bx = blockIdx.x;
  w.unit_block = bx % L.unit_blocks;
  bx /= L.unit_blocks;
  w.co_tile = bx % L.co_tiles;
  w.g = bx / L.co_tiles;
  w.co0 = w.co_tile * cfg::kCo;
  w.kt_begin = blockIdx.y * tiles_per_split;
  w.kt_end = std::min<int64_t>(L.k_tiles, w.kt_begin + tiles_per_split);
  w.u0 = w.unit_block * per_block;
  w.block_group = L.group_blocks > 0 ? w.unit_block / L.group_blocks : 0;
  w.tap0 = L.group_blocks > 0 ? (w.unit_block - w.block_group * L.group_blocks) * per_block : 0;
  return w;
}

// Unit i of the block as (channel group, tap); false past the last unit.
// The halo box starts at the block's first channel group.
__device__ __forceinline__ bool unit_at(const cfg::Layout& L, const BlockWork& w, int taps, int i,
                                        int& cg, int& tap) {
  if (L.group_blocks > 0) {
    cg = w.block_group;
    tap = w.tap0 + i;
    return tap < taps;
  }
  const int u = w.u0 + i;
  cg = u / taps;
  tap = u - cg * taps;
  return u < L.units;
}

// Halo offset of this lane's A rows: channel gq of each of its two units
// (per tile), at the unit's tap, plus its position tq. Units past the last
// read the block's first (and are not stored).
template <int MT>
__device__ __forceinline__ void a_offsets(const ConvParams& p, const cfg::Layout& L,
                                          const BlockWork& w, int taps, int group_base, int warp,
                                          int gq, int tq, int (&off)[MT][2]) {
  const int KW = p.kernel_w, dw = p.dilation_w, bc = L.halo_cols;
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int cg, tap;
      if (!unit_at(L, w, taps, cfg::kUnitsPerTile * t + 2 * warp + h, cg, tap)) {
        unit_at(L, w, taps, 0, cg, tap);
      }
      const int kh = tap / KW, kw = tap - kh * KW;
      off[t][h] = ((cg - group_base) * 8 + gq) * L.plane + kh * bc + kw * dw + tq;
    }
}

// K tiles in (image, row tile, column tile) order. A cursor steps through
// them by carries: a tile's coordinates cost three run-time divisions, and
// every thread needs the current tile, thread 0 two more, each K tile. The
// row tile is kept as (tile_h / dh, tile_h % dh) for phase_row0.
struct Cursor {
  int n, thq, thr, tw;
};
struct Tile {
  int n, oh0, ow0;
};
struct TileWalk {
  const cfg::Layout& L;
  int dh, tiles_hq;  // tiles_hq: whole, by phase_row_tiles

  __device__ __forceinline__ Cursor at(int64_t kt) const {
    const int64_t tiles_hw = int64_t(L.tiles_h) * L.tiles_w;
    Cursor c;
    c.n = static_cast<int>(kt / tiles_hw);
    const int rest = static_cast<int>(kt - c.n * tiles_hw);
    const int tile_h = rest / L.tiles_w;
    c.tw = rest - tile_h * L.tiles_w;
    c.thq = tile_h / dh;
    c.thr = tile_h - c.thq * dh;
    return c;
  }
  __device__ __forceinline__ Cursor next(Cursor c) const {
    if (++c.tw == L.tiles_w) {
      c.tw = 0;
      if (++c.thr == dh) {
        c.thr = 0;
        if (++c.thq == tiles_hq) {
          c.thq = 0;
          ++c.n;
        }
      }
    }
    return c;
  }
  // Rows oh0 + dh*r: phase_row0 of row tile thq * dh + thr.
  __device__ __forceinline__ Tile tile(Cursor c, int rows) const {
    return Tile{c.n, c.thq * rows * dh + c.thr, c.tw * cfg::kCols};
  }
};

// The producer side: the halo boxes (TMA, thread 0) and the B tiles (TMA,
// or cp.async where grad_output's rows are not 16-byte multiples), each
// double-buffered, and B's rounding or tf32x3 split in place.
// The members refer to the kernel's own values, as a lambda's captures
// would: copies of them (go's __restrict__ kept or not) changed the code
// the compiler made of the whole kernel.
template <bool kTf32x3>
struct Operands {
  static constexpr uint32_t kRowBytes = 4 * cfg::kRowFloats;
  const CUtensorMap& x_map;
  const CUtensorMap& go_map;
  const ConvParams& p;
  const cfg::Layout& L;
  const float* __restrict__ const& go;
  float* const& smem;   // B's two buffers, 1024-byte aligned for the swizzle
  float* const& halo0;  // then the two halo boxes
  uint64_t (&halo_full)[2];
  uint64_t (&b_full)[2];
  const bool& go_by_tma;
  const int &g, &co0, &cin_g, &cout_g, &group_base, &rows, &bc, &dh, &Ho, &Wo;

  __device__ __forceinline__ float* stage(int s) const { return smem + s * L.stage_floats; }
  // This thread's 16-byte pieces of a B buffer: piece j (0 .. 8*rows - 1)
  // is number j * 128 + tid, so that a warp's pieces are consecutive.
  __device__ __forceinline__ float* piece(int s, int j) const {
    return stage(s) + 4 * (j * cfg::kThreads + threadIdx.x);
  }
  // Thread 0 starts the halo box of tile t into buffer `buf`; it starts on
  // a 16-byte column, up to 3 left of the halo's first.
  __device__ __forceinline__ void start_halo(const Tile& t, int buf) const {
    const int iw0 = t.ow0 - static_cast<int>(p.pad_w);
    const int ih0 = t.oh0 - static_cast<int>(p.pad_h);
    mbarrier_arrive_expect_tx(&halo_full[buf],
                              static_cast<uint32_t>(4 * L.box_channels * L.halo_rows * bc));
    tma_load_4d(halo0 + buf * L.halo_floats, &x_map, iw0 & ~3, ih0,
                g * cin_g + group_base * 8, t.n, &halo_full[buf]);
  }
  // grad_output of tile t into B buffer s: by TMA (thread 0; a box per
  // output row and column half), or by cp.async, each thread copying the
  // pieces it will round (zeros outside the output), so that it waits for
  // its own copies only.
  __device__ __forceinline__ void start_b(const Tile& t, int s) const {
    const int gco0 = g * cout_g + co0;
    if (go_by_tma) {
      if (threadIdx.x == 0) {
        mbarrier_arrive_expect_tx(&b_full[s], rows * kRowBytes);
        for (int r = 0; r < rows; ++r)
          for (int h = 0; h < 2; ++h)
            tma_load_4d(stage(s) + r * cfg::kRowFloats + h * (cfg::kRowFloats / 2), &go_map,
                        t.ow0 + 32 * h, t.oh0 + dh * r, gco0, t.n, &b_full[s]);
      }
      return;
    }
    const float* go_n = go + plane_offset(t.n, p.out_channels, 0, Ho * Wo);
    for (int j = 0; j < 8 * rows; ++j) {
      // Piece number q: row q / 1024, column half (q / 512) % 2, channel
      // (q / 8) % 64, 16-byte chunk q % 8 of the swizzle, holding positions
      // 4 * (chunk ^ channel % 8) .. + 3 of the half.
      const int q = j * cfg::kThreads + threadIdx.x;
      const int r = q >> 10, h = (q >> 9) & 1, co = (q >> 3) & 63;
      const int ow = t.ow0 + 32 * h + 4 * ((q & 7) ^ (co & 7));
      const int oh = t.oh0 + dh * r;
      const bool line_ok = oh < Ho && gco0 + co < p.out_channels;
      const float* src = go_n + (int64_t(gco0 + co) * Ho + oh) * Wo + ow;
      float* dst = piece(s, j);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool ok = line_ok && ow + e < Wo;
        cp_async_4(dst + e, ok ? src + e : go, ok);
      }
    }
    cp_async_commit();
  }
  // The halo box of local tile i (in buffer buf = i % 2) has landed.
  __device__ __forceinline__ void wait_halo(int buf, int64_t i) const {
    mbarrier_wait(&halo_full[buf], static_cast<uint32_t>((i >> 1) & 1));
  }
  // Both copies of tile t into buffer `buf`.
  __device__ __forceinline__ void start(const Tile& t, int buf) const {
    if (threadIdx.x == 0) start_halo(t, buf);
    start_b(t, buf);
  }
  // B of local tile i has landed (this thread's pieces, on the cp.async path).
  __device__ __forceinline__ void wait_b(int64_t i) const {
    if (go_by_tma) {
      mbarrier_wait(&b_full[i & 1], static_cast<uint32_t>((i >> 1) & 1));
    } else {
      cp_async_wait<0>();
    }
  }
  // Piece j of B buffer s rounded (TF32) or split (3xTF32: the small half
  // kept at the same offset of the buffer's second half) in place.
  __device__ __forceinline__ void convert(int s, int j) const {
    float* big = piece(s, j);
    const float4 v = *reinterpret_cast<const float4*>(big);
    if constexpr (kTf32x3) {
      uint32_t b[4], sm[4];
      split3(v.x, b[0], sm[0]);
      split3(v.y, b[1], sm[1]);
      split3(v.z, b[2], sm[2]);
      split3(v.w, b[3], sm[3]);
      st_shared_16(big, b[0], b[1], b[2], b[3]);
      st_shared_16(big + L.b_floats, sm[0], sm[1], sm[2], sm[3]);
    } else {
      st_shared_16(big, tf32_operand(v.x), tf32_operand(v.y), tf32_operand(v.z),
                   tf32_operand(v.w));
    }
  }
};

__device__ __forceinline__ void init_barriers(uint64_t (&halo_full)[2], uint64_t (&b_full)[2]) {
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {
      mbarrier_init(&halo_full[b], 1);
      mbarrier_init(&b_full[b], 1);
    }
    fence_mbarrier_init();
  }
  __syncthreads();
}

// The prologue: the first two K tiles' copies, the first one's B converted.
// `cur` by value: by reference, it changed one kernel's register allocation.
template <bool kTf32x3>
__device__ __forceinline__ void prologue(const Operands<kTf32x3>& ops, const TileWalk& walk,
                                         Cursor cur, const BlockWork& w) {
  const int rows = ops.rows;
  const bool two = w.kt_begin + 1 < w.kt_end;
  if (threadIdx.x == 0) {
    ops.start_halo(walk.tile(cur, rows), 0);
    if (two) ops.start_halo(walk.tile(walk.next(cur), rows), 1);
  }
  ops.start_b(walk.tile(cur, rows), 0);
  if (two) ops.start_b(walk.tile(walk.next(cur), rows), 1);
  ops.wait_b(0);
#pragma unroll 1
  for (int j = 0; j < 8 * rows; ++j) ops.convert(0, j);
  fence_proxy_async_smem();  // wgmma reads what the threads stored
  __syncthreads();
}

// One K tile of the main loop from B buffer `s`: the rows inside the
// output, 8 k8 steps each, with the next tile's B (buffer s ^ 1) converted
// in each row's steps 4..7 (has_next: there is one; its copy is waited for
// first). Each step loads A for every tile (rounded or split as loaded),
// then issues the tiles' wgmmas as one group; a step's group retires one
// step later, so A comes in two register sets.
// kMask: the tile crosses the right edge (`cols` valid columns). Only its
// first kSteps steps reach a column inside it: the rest, whose grad_output
// is zero, issue no wgmma. A compile-time count, as a run-time test between
// the wgmmas of a step and its wait makes ptxas serialise them and spill;
// even, so that a row's last group has A set 1 while the next row's first
// step writes set 0, as in a whole tile. 3xTF32 only: the TF32 kernels'
// registers grew with the variants (the four-tile one spilled), and their
// targets have the margin (docs/kernels.md, "wgrad on wgmma").
template <int MT, bool kTf32x3, bool kMask, int kSteps>
__device__ __forceinline__ void mainloop_tile(const Operands<kTf32x3>& ops, const int (&off)[MT][2],
                                              float (&acc)[MT][8][4],
                                              float (&tmp)[kTf32x3 ? MT : 1][8][4],
                                              uint32_t b_small_bytes, const float* hb, int s,
                                              int64_t i, bool has_next, int valid_rows, int cols,
                                              int tq) {
  static_assert(kSteps % 2 == 0 && kSteps <= cfg::kCols / 8, "whole pairs of k8 steps");
  constexpr uint32_t kRowBytes = Operands<kTf32x3>::kRowBytes;
  constexpr uint32_t kHalfBytes = kRowBytes / 2;  // one TMA box: 32 positions
  const int rows = ops.rows, bc = ops.bc;
  const uint32_t b_addr = smem_addr(ops.stage(s));
  uint32_t a_big[2][MT][4], a_small[kTf32x3 ? 2 : 1][MT][4];
  (void)a_small;
#pragma unroll 1
  for (int r = 0; r < valid_rows; ++r) {
    const float* hr = hb + r * bc;
#pragma unroll
    for (int k = 0; k < cfg::kCols / 8; ++k) {
      const int set = k & 1;
      if (k < kSteps) {
        const bool keep0 = !kMask || 8 * k + tq < cols;
        const bool keep1 = !kMask || 8 * k + tq + 4 < cols;
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          float v[4] = {hr[off[t][0] + 8 * k], hr[off[t][1] + 8 * k], hr[off[t][0] + 8 * k + 4],
                        hr[off[t][1] + 8 * k + 4]};
          if (kMask) {
            v[0] = keep0 ? v[0] : 0.f;
            v[1] = keep0 ? v[1] : 0.f;
            v[2] = keep1 ? v[2] : 0.f;
            v[3] = keep1 ? v[3] : 0.f;
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if constexpr (kTf32x3) {
              split3(v[e], a_big[set][t][e], a_small[set][t][e]);
            } else {
              a_big[set][t][e] = tf32_operand(v[e]);
            }
          }
        }
        // Step k: 32 bytes into the 128-byte rows of column half k / 4.
        const uint32_t step_addr = b_addr + r * kRowBytes + (k / 4) * kHalfBytes + (k % 4) * 32;
        const uint64_t big = wgmma_desc_sw128(step_addr);
        wgmma_fence();
        if constexpr (kTf32x3) {
          const uint64_t small = wgmma_desc_sw128(step_addr + b_small_bytes);
#pragma unroll
          for (int t = 0; t < MT; ++t) {
            // Restarted every 4 steps.
            wgmma_m64n64k8_3xtf32(tmp[t], a_big[set][t], a_small[set][t], big, small, k % 4 != 0);
          }
        } else {
#pragma unroll
          for (int t = 0; t < MT; ++t) wgmma_m64n64k8_tf32(acc[t], a_big[set][t], big, true);
        }
        wgmma_commit();
      }
      if (k >= 4) {
        if (k == 4 && r == 0 && has_next) ops.wait_b(i + 1);
        ops.convert(s ^ 1, 8 * r + 2 * (k - 4));
        ops.convert(s ^ 1, 8 * r + 2 * (k - 4) + 1);
      }
      if (k >= kSteps) continue;
      if constexpr (kTf32x3) {
        if (k % 4 == 3 || k == kSteps - 1) {
          wgmma_wait<0>();
#pragma unroll
          for (int t = 0; t < MT; ++t) wgmma_add_temporary(acc[t], tmp[t]);
        } else {
          wgmma_wait<1>();
        }
      } else {
        wgmma_wait<1>();
      }
    }
  }
  wgmma_wait<0>();
  if constexpr (!kTf32x3) {
#pragma unroll
    for (int t = 0; t < MT; ++t) wgmma_fence_operands(acc[t]);
  }
  // Rows of the next tile past this one's valid rows (at the bottom edge).
#pragma unroll 1
  for (int r = valid_rows; r < rows; ++r)
#pragma unroll
    for (int j = 0; j < 8; ++j) ops.convert(s ^ 1, 8 * r + j);
}

// One K tile in the variant its right edge needs (see mainloop_tile):
// skipped steps in IEEE mode only, where edge_steps allows them.
template <int MT, bool kTf32x3>
__device__ __forceinline__ void k_tile(const Operands<kTf32x3>& ops, const int (&off)[MT][2],
                                       float (&acc)[MT][8][4],
                                       float (&tmp)[kTf32x3 ? MT : 1][8][4],
                                       uint32_t b_small_bytes, const float* hb, int s, int64_t i,
                                       bool has_next, int valid_rows, int cols, int tq,
                                       bool edge_steps) {
  auto tile = [&](auto mask, auto steps) {
    mainloop_tile<MT, kTf32x3, decltype(mask)::value, decltype(steps)::value>(
        ops, off, acc, tmp, b_small_bytes, hb, s, i, has_next, valid_rows, cols, tq);
  };
  if (cols >= cfg::kCols) {
    tile(std::false_type{}, Steps<8>{});
  } else if (!kTf32x3 || !edge_steps || cols > 48) {
    tile(std::true_type{}, Steps<8>{});
  } else if (cols > 32) {
    tile(std::true_type{}, Steps<6>{});
  } else if (cols > 16) {
    tile(std::true_type{}, Steps<4>{});
  } else {
    tile(std::true_type{}, Steps<2>{});
  }
}

// The epilogue: accumulator (t, f, e) is row gq (+8 for e >= 2) of the
// warp's 16 in tile t, i.e. channel gq of unit 2*warp (+1) at its tap;
// column 8f + 2tq (+1 for odd e), output channel co0 + that. Into this
// split's slice of the partial sums.
template <int MT>
__device__ __forceinline__ void store_partials(const ConvParams& p, const cfg::Layout& L,
                                               const BlockWork& w, const float (&acc)[MT][8][4],
                                               float* partial, int taps, int cin_g, int cout_g,
                                               int warp, int gq, int tq) {
  float* out = partial + blockIdx.y * p.weight_numel();
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int cg, tap;
      if (!unit_at(L, w, taps, cfg::kUnitsPerTile * t + 2 * warp + h, cg, tap)) continue;
      const int ci = cg * 8 + gq;
      if (ci >= cin_g) continue;
#pragma unroll
      for (int f = 0; f < 8; ++f)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int co = w.co0 + 8 * f + 2 * tq + e;
          if (co >= cout_g) continue;
          out[((int64_t(w.g) * cout_g + co) * cin_g + ci) * taps + tap] = acc[t][f][2 * h + e];
        }
    }
}

template <int MT, bool kTf32x3>
__global__ void __launch_bounds__(cfg::kThreads, cfg::kBlocksPerSm)
    wgrad_sm90_kernel(const __grid_constant__ CUtensorMap x_map,
                      const __grid_constant__ CUtensorMap go_map, const ConvParams p,
                      const float* __restrict__ go, float* __restrict__ partial,
                      const cfg::Layout L, int64_t tiles_per_split, bool go_by_tma,
                      bool edge_steps) {
  extern __shared__ __align__(128) float smem_base[];
  __shared__ uint64_t halo_full[2], b_full[2];
  const int Ho = p.out_h, Wo = p.out_w;
  const int taps = p.kernel_h * p.kernel_w;
  const int dh = p.dilation_h;
  const int cin_g = p.in_channels_per_group(), cout_g = p.out_channels_per_group();
  const int rows = L.rows, bc = L.halo_cols;

  // Shared memory: B's two buffers [rows][2 halves][64 channels][32
  // positions] (3xTF32: big, then small), 1024-byte aligned for the
  // swizzle; then two halo boxes [box channels][halo rows][halo cols].
  float* const smem =
      smem_base + ((cfg::kAlignSlack - (smem_addr(smem_base) & (cfg::kAlignSlack - 1))) &
                   (cfg::kAlignSlack - 1)) / 4;
  float* const halo0 = smem + 2 * L.stage_floats;

  const BlockWork w = block_work(L, tiles_per_split, cfg::kUnitsPerTile * MT);
  int group_base, first_tap;
  unit_at(L, w, taps, 0, group_base, first_tap);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gq = lane >> 2, tq = lane & 3;

  int off[MT][2];
  a_offsets<MT>(p, L, w, taps, group_base, warp, gq, tq, off);

  const TileWalk walk{L, dh, L.tiles_h / dh};
  const Operands<kTf32x3> ops{x_map, go_map, p,         L,    go,    smem, halo0, halo_full,
                              b_full, go_by_tma, w.g,   w.co0, cin_g, cout_g, group_base,
                              rows,  bc,       dh,       Ho,   Wo};

  init_barriers(halo_full, b_full);

  float acc[MT][8][4];
  zero_fragments(acc);
  float tmp[kTf32x3 ? MT : 1][8][4];
  (void)tmp;
  const uint32_t b_small_bytes = 4 * static_cast<uint32_t>(L.b_floats);

  Cursor cur = walk.at(w.kt_begin);
  if (w.kt_begin < w.kt_end) prologue(ops, walk, cur, w);
  for (int64_t kt = w.kt_begin; kt < w.kt_end; ++kt) {
    const int64_t i = kt - w.kt_begin;
    const int buf = static_cast<int>(i & 1);
    const Tile t = walk.tile(cur, rows);
    const int iw0 = t.ow0 - static_cast<int>(p.pad_w);
    const float* hb = halo0 + buf * L.halo_floats + (iw0 & 3);
    int valid_rows = rows;  // oh0 + dh*r < Ho; a division only at the bottom
    if (t.oh0 + dh * (rows - 1) >= Ho) valid_rows = (Ho - t.oh0 + dh - 1) / dh;
    const int cols = Wo - t.ow0;
    const bool has_next = kt + 1 < w.kt_end;
    ops.wait_halo(buf, i);
    k_tile<MT, kTf32x3>(ops, off, acc, tmp, b_small_bytes, hb, buf, i, has_next, valid_rows, cols,
                        tq, edge_steps);
    fence_proxy_async_smem();  // the next tile's B, stored by the threads
    __syncthreads();  // every lane is done with this halo and B buffer
    if (kt + 2 < w.kt_end) ops.start(walk.tile(walk.next(walk.next(cur)), rows), buf);
    cur = walk.next(cur);
  }

  store_partials<MT>(p, L, w, acc, partial, taps, cin_g, cout_g, warp, gq, tq);
}


template <bool kTf32x3>
void launch(const ConvParams& p, const at::TensorBase& go, const at::TensorBase& x,
            at::TensorBase& grad_w, const cfg::Layout& L) {
  // TMA reads from 16-byte aligned bases (rows are multiples of 16 bytes
  // by the plan for the input; grad_output's are checked here).
  const at::TensorBase xa = aligned_16(x, at::MemoryFormat::Preserve);
  const bool go_by_tma = p.out_w % 4 == 0;
  const at::TensorBase goa = go_by_tma ? aligned_16(go, at::MemoryFormat::Preserve) : go;
  const uint32_t dh = static_cast<uint32_t>(p.dilation_h);
  const CUtensorMap x_map = nchw_tensor_map(xa, L.halo_cols, L.halo_rows * dh, L.box_channels, dh);
  // B: one output row of 32 positions x 64 channels per box, in the
  // 128-byte swizzle wgmma reads. Without TMA for grad_output, the map is
  // never read: any valid one.
  const CUtensorMap go_map =
      go_by_tma ? nchw_tensor_map(goa, cfg::kCols / 2, 1, cfg::kCo, 1, /*swizzle_128b=*/true)
                : x_map;

  const int64_t tiles = p.groups * int64_t(L.co_tiles) * L.unit_blocks;
  TORCH_CHECK(tiles <= std::numeric_limits<int32_t>::max(),
              "conv2d_ext: weight gradient too large");
  const KSplit k = one_wave_k_split(tiles, L.k_tiles, L.blocks_per_sm);
  const int64_t splits = k.splits, tiles_per_split = k.tiles_per_split;

  auto stream = current_stream();
  at::TensorBase partial =
      splits == 1 ? grad_w : scratch({splits, p.weight_numel()}, grad_w.scalar_type());
  auto run = [&](auto kernel) {
    ensure_dynamic_smem(kernel, L.smem_bytes);
    kernel<<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)), cfg::kThreads,
             L.smem_bytes, stream>>>(x_map, go_map, p, goa.data_ptr<float>(),
                                     partial.data_ptr<float>(), L, tiles_per_split, go_by_tma,
                                     option(Option::kWgradEdgeSteps));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  // Tile counts the layout may pick (cfg::max_tiles).
  switch (L.tiles) {
    case 1: run(wgrad_sm90_kernel<1, kTf32x3>); break;
    case 2: run(wgrad_sm90_kernel<2, kTf32x3>); break;
    case 3: if constexpr (!kTf32x3) { run(wgrad_sm90_kernel<3, kTf32x3>); break; } [[fallthrough]];
    case 4: if constexpr (!kTf32x3) { run(wgrad_sm90_kernel<4, kTf32x3>); break; } [[fallthrough]];
    default:
      TORCH_CHECK(false, "conv2d_ext: internal error: no sm_90 wgrad kernel for ", L.tiles,
                  " tiles per block");
  }
  if (splits > 1) reduce_splits<float>(partial, grad_w, p.weight_numel(), static_cast<int>(splits));
}

}  // namespace

void launch_wgrad_sm90(const ConvParams& p, const at::TensorBase& grad_out, const at::TensorBase& x,
                       at::TensorBase& grad_w, MathMode math) {
  const bool tf32x3 = math == MathMode::kIEEE;
  const cfg::Layout L = cfg::choose_layout(p, tf32x3);
  TORCH_CHECK(L.smem_bytes != INT64_MAX, "conv2d_ext: internal error: the plan picked the "
              "sm_90 wgrad for a problem it does not fit");
  if (tf32x3) {
    launch<true>(p, grad_out, x, grad_w, L);
  } else {
    launch<false>(p, grad_out, x, grad_w, L);
  }
}

}  // namespace cuda
}  // namespace conv2d_ext
