// The few-channel wgrad's 3xTF32 stage on Hopper (IEEE mode, sm_90a code
// only), for the kernel in few_channels/wgrad_tc.cu: that kernel stages
// grad_output and the input halo, and splits them, for this stage and for
// the mma.sync one of other GPUs (and of TF32 mode, which stays on
// mma.sync: see the kernel). run_stage_sm90 picks the stage's compile-time
// form (tile count, masking).
//
// The GEMM turned around, as in the sm_90 wgrad (sm90/wgrad.cu): M = the
// group's (input channel, tap) rows in m64 tiles, N = the block's 64 output
// channels, K = the stage's 64 pixels. A, the input at each row's (channel,
// tap) offset and each pixel's column times the stride, is gathered from
// the halo into registers (no 16-byte layout serves the gather); B,
// grad_output, is the stage's tile as it lies: two halves of 32 pixels in
// the 128-byte swizzle, which wgmma reads K-major. mma.sync issues TF32 at
// half of wgmma's rate on Hopper, which bounds a 3xTF32 wgrad on it by its
// tensor work and the waits of its dependent chains.
//
// A block holds up to three m64 tiles (the stem's 147 rows in one block),
// over its two warpgroups: one tile, both take it and split the stage's
// pixels (32 each); two, one each; three, one each and both the third,
// with the pixels split. A warpgroup starts at its own half of the pixels,
// so with three tiles the third one's steps come first and every branch is
// at compile time. Where both warpgroups hold a tile, their sums meet at
// the end in warpgroup order.
//
// small*big + big*small + big*big of each step go into a temporary per
// tile, restarted every kStepsPerTemp steps and added to the accumulators
// with FADDs (the tensor cores truncate as they accumulate).
#pragma once

#include <cstdint>
#include <type_traits>

#include "../kernel_sizes.cuh"
#include "../mma.cuh"
#include "config.h"

namespace conv2d_ext {
namespace cuda {
namespace wgrad_tc {

namespace fc = conv2d_ext::few_channels;

constexpr int kCo = fc::kWgradTcCo;
constexpr int kMaxTiles = 3;       // m64 tiles of (channel, tap) rows per block
// Four steps (twelve products) per temporary, as in the sm_90 wgrad: half
// the flushes and full waits of two, with errors still below cuDNN's
// (docs/kernels.md, "Few channels on tensor cores").
constexpr int kStepsPerTemp = 4;
static_assert(8 % kStepsPerTemp == 0 && 4 % kStepsPerTemp == 0, "whole temporaries a stage");
static_assert(kMaxTiles * 64 == fc::kWgradTcWarpN * 8 * (fc::kThreads / 32),
              "a block's rows: the same parts as the mma.sync kernel's");

// The tiles a warpgroup accumulates: set 0 in every step it takes, set 1
// (three tiles only: the third) in the steps of its own half.
struct Sm90Tiles {
  int tile[2];
  bool shared[2];  // the other warpgroup holds the same tile (sums meet)
};

__device__ __forceinline__ Sm90Tiles wgmma_tiles(int tiles, int wg) {
  Sm90Tiles t;
  t.tile[0] = tiles == 1 ? 0 : wg;
  t.shared[0] = tiles == 1;
  t.tile[1] = 2;
  t.shared[1] = true;
  return t;
}

// One stage: steps of 8 pixels; kTiles tiles in the block (1-3); kMask: the
// stage has `cols` < 64 valid pixels (A is zeroed past them: the input
// there may hold Inf or NaN, and grad_output is zero). `aoff`: this lane's
// A rows (gq and gq + 8 of its warp's 16) in each set, as byte offsets from
// `xbase`, the halo at the stage's first column; `go`: the stage's
// grad_output tile; `small_bytes`: from a big part to its small part (both
// operands).
template <int kTiles, bool kMask>
__device__ __forceinline__ void wgrad_stage_sm90(float (&acc)[2][8][4], float (&tmp)[2][8][4],
                                                  const uint32_t (&aoff)[2][2], uint32_t xbase,
                                                  uint32_t go, uint32_t small_bytes, int sw,
                                                  int cols) {
  constexpr int kSteps = kTiles == 1 ? 4 : 8;  // this warpgroup's steps of the stage
  constexpr int kSets = kTiles == 3 ? 2 : 1;
  const int lane = threadIdx.x % 32, tq = lane & 3;
  const int wg = threadIdx.x / 128;
  constexpr uint32_t kHalfBytes = 4u * kCo * 32;  // a 32-pixel half of the tile

  // A register sets: one per step where a warpgroup takes a single tile's
  // four or eight steps (all its loads go out before the first wgmma waits
  // on them, so later steps find theirs landed); else two, a step's
  // rewritten two steps later, once its group has retired.
  constexpr int kDepth = kSets == 1 ? kSteps : 2;
  uint32_t a_big[kDepth][kSets][4], a_small[kDepth][kSets][4];
  auto step_of = [&](int kk) { return (kk + 4 * wg) & 7; };  // own half first
  auto load_a = [&](int kk) {
    const int k = step_of(kk), set = kk % kDepth;
    const uint32_t px = xbase + 4u * (8 * k + tq) * sw;
    const bool keep0 = !kMask || 8 * k + tq < cols;
    const bool keep1 = !kMask || 8 * k + tq + 4 < cols;
#pragma unroll
    for (int s = 0; s < kSets; ++s) {
      if (s == 1 && kk >= 4) continue;  // with three tiles, set 1 takes steps 0-3 only
      // (row gq, pixel tq), (gq + 8, tq), (gq, tq + 4), (gq + 8, tq + 4)
      const uint32_t addr[4] = {px + aoff[s][0], px + aoff[s][1], px + aoff[s][0] + 16u * sw,
                                px + aoff[s][1] + 16u * sw};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool keep = e < 2 ? keep0 : keep1;
        const uint32_t big = __float_as_uint(lds_f32(addr[e]));
        const uint32_t small = __float_as_uint(lds_f32(addr[e] + small_bytes));
        a_big[set][s][e] = keep ? big : 0u;
        a_small[set][s][e] = keep ? small : 0u;
      }
    }
  };
  if constexpr (kDepth == kSteps) {
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) load_a(kk);
  }
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const int k = step_of(kk), set = kk % kDepth;
    if constexpr (kDepth != kSteps) load_a(kk);
    // Step k: 32 bytes into the 128-byte rows of half k / 4.
    const uint32_t b_addr = go + (k >> 2) * kHalfBytes + (k & 3) * 32u;
    const uint64_t big = wgmma_desc_sw128(b_addr);
    const uint64_t small = wgmma_desc_sw128(b_addr + small_bytes);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kSets; ++s) {
      if (s == 1 && kk >= 4) continue;
      wgmma_m64n64k8_3xtf32(tmp[s], a_big[set][s], a_small[set][s], big, small,
                            kk % kStepsPerTemp != 0);
    }
    wgmma_commit();
    if (kk % kStepsPerTemp == kStepsPerTemp - 1) {
      wgmma_wait<0>();
#pragma unroll
      for (int s = 0; s < kSets; ++s) {
        if (s == 1 && kk >= 4) continue;
        wgmma_add_temporary(acc[s], tmp[s]);
      }
    } else if constexpr (kDepth != kSteps) {
      wgmma_wait<1>();  // the group whose A registers the next step rewrites
    }
  }
  // Nothing in flight past the stage: the next one's barrier recycles its
  // buffers (and ptxas serialises wgmmas in flight across a loop's back edge).
  wgmma_wait<0>();
#pragma unroll
  for (int s = 0; s < kSets; ++s) wgmma_fence_operands(acc[s]);
}

// The stage at the block's tile count `tiles` (1-3), masked where it has
// fewer than 64 valid pixels.
__device__ __forceinline__ void run_stage_sm90(int tiles, float (&acc)[2][8][4],
                                               float (&tmp)[2][8][4], const uint32_t (&aoff)[2][2],
                                               uint32_t xbase, uint32_t go, uint32_t small_bytes,
                                               int sw, int cols) {
  auto run = [&](auto tiles_c) {
    constexpr int kTiles = decltype(tiles_c)::value;
    if (cols == fc::kTileCols) {
      wgrad_stage_sm90<kTiles, false>(acc, tmp, aoff, xbase, go, small_bytes, sw, cols);
    } else {
      wgrad_stage_sm90<kTiles, true>(acc, tmp, aoff, xbase, go, small_bytes, sw, cols);
    }
  };
  switch (tiles) {
    case 1: run(Int<1>{}); break;
    case 2: run(Int<2>{}); break;
    default: run(Int<3>{}); break;
  }
}

}  // namespace wgrad_tc
}  // namespace cuda
}  // namespace conv2d_ext
