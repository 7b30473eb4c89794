// The few-channel dgrad's 3xTF32 chunk on Hopper (IEEE mode, sm_90a code
// only), for the kernel in dgrad_small_channels_tc.cu, which stages each
// chunk's grad_output halo (split into [big, small] pairs) and arranged
// weights; TF32 mode runs mma.sync there. 3xTF32 on mma.sync measured
// slower than the FFMA gather (three mma.sync per k8 step at half of
// wgmma's rate).
//
// The GEMM turned around, as in the few-channel forward's wgmma stage: M =
// the phase grid's positions, a warpgroup's two rows of the stage as two
// m64 tiles (warp wq of it positions 16wq to 16wq + 15), A gathered from the
// halo pairs into registers; N = the 16 (phase, input channel) rows, B =
// the arranged weights by descriptor ([k8 step][8-row block][k half][row]
// [k], wgmma_desc_k8), big and small parts; K = the chunk's (output
// channel, window offset) in groups of kDgradTcStepGroup k8 steps. A
// group's A fragments are all loaded before its wgmmas, which then issue
// back to back into one temporary per tile (small products first in each
// step); the group retires before the next starts (nothing in flight
// across the loop's back edge), and FADDs add the temporaries up.
#pragma once

#include <cstdint>

#include "../tile_config.h"
#include "mma.cuh"
#include "small_channels.cuh"

namespace conv2d_ext {
namespace cuda {
namespace dgrad_tc {

namespace sc = conv2d_ext::small_channels;

constexpr int kGroup = sc::kDgradTcStepGroup;
constexpr int kStepFloats = 8 * sc::kDgradTcN;  // B of one k8 step

// Where the arranged weight of row r (of N) and k goes for wgmma_desc_k8.
__host__ __device__ constexpr int b_index(int r, int k) {
  return (k >> 3) * kStepFloats + (r >> 3) * 64 + ((k >> 2) & 1) * 32 + (r & 7) * 4 + (k & 3);
}

// One chunk's products into `part` (two tiles, accumulators as wgmma lays
// them out: row gq (+ 8 for r >= 2) of the warp's 16, column 8j + 2tq (+ 1
// for odd r)). `xa`: the pairs at this thread's position of the warpgroup's
// first row (its column gq; gq + 8 is 64 bytes on), `row_bytes` to its
// second row; `w_big`, `w_small`: the chunk's B parts; K at or past
// `k_valid` has zero A (the halo of channels past the chunk may hold Inf).
__device__ __forceinline__ void dgrad_chunk_wgmma(float (&part)[2][2][4], const int* k_table,
                                                  int k_steps, int k_valid, uint32_t xa,
                                                  uint32_t row_bytes, uint32_t w_big,
                                                  uint32_t w_small) {
  const int tq = threadIdx.x % 4;
  constexpr uint32_t kElem = 8;  // a [big, small] pair
  float tmp[2][2][4];
  for (int t0 = 0; t0 < k_steps; t0 += kGroup) {
    uint32_t ab[kGroup][2][4], as[kGroup][2][4];
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const int t = t0 + i;
      const int2 ko = small_channels::k8_offsets(k_table, t, tq);
      const bool keep0 = t * 8 + tq < k_valid, keep1 = t * 8 + tq + 4 < k_valid;
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        // (position gq, k tq), (gq + 8, tq), (gq, tq + 4), (gq + 8, tq + 4)
        const uint32_t p0 = xa + m * row_bytes + kElem * ko.x;
        const uint32_t p1 = xa + m * row_bytes + kElem * ko.y;
        lds_u32x2(p0, ab[i][m][0], as[i][m][0]);
        lds_u32x2(p0 + 8 * kElem, ab[i][m][1], as[i][m][1]);
        lds_u32x2(p1, ab[i][m][2], as[i][m][2]);
        lds_u32x2(p1 + 8 * kElem, ab[i][m][3], as[i][m][3]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (!(e < 2 ? keep0 : keep1)) ab[i][m][e] = as[i][m][e] = 0u;
        }
      }
    }
    wgmma_fence();
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const uint32_t step = 4u * kStepFloats * (t0 + i);
      const uint64_t big = wgmma_desc_k8(w_big + step), small = wgmma_desc_k8(w_small + step);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        wgmma_m64k8_3xtf32(tmp[m], ab[i][m], as[i][m], big, small, i > 0);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int m = 0; m < 2; ++m) wgmma_add_temporary(part[m], tmp[m]);
  }
#pragma unroll
  for (int m = 0; m < 2; ++m) wgmma_fence_operands(part[m]);
}

}  // namespace dgrad_tc
}  // namespace cuda
}  // namespace conv2d_ext
