// The few-channel forward's stage on Hopper (sm_90a code only), for the
// kernel in few_channels/fprop_tc.cu: that kernel stages the halo and the
// weights for this stage and for the mma.sync one of other GPUs.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "../../conv_params.h"
#include "../common.cuh"
#include "../kernel_sizes.cuh"
#include "../mma.cuh"
#include "config.h"
#include "few_channels.cuh"

namespace conv2d_ext {
namespace cuda {
namespace fprop_tc {

namespace fc = conv2d_ext::few_channels;

constexpr int kCo = fc::kFpropTcCo;
// The output box the tensor-copy engine writes: 32 columns x 2 rows x 64
// channels.
constexpr int kOutBoxFloats = 32 * 2 * kCo;

// One stage on Hopper's warpgroup MMA, with the GEMM turned around: M =
// the stage's pixels (A, gathered from the halo into registers), N = the
// 64 output channels (B, the weights in shared memory, laid out for
// wgmma_desc_k8: [k8 step][8-channel block][k half][channel][k]). mma.sync
// issues TF32 at half of wgmma's rate on Hopper, which left 3xTF32 bound by
// its tensor work; wgmma also runs asynchronously to the FADDs that add the
// 3xTF32 temporaries up, and to the gathers of the next A.
//
// Warpgroup wg takes output rows 2wg and 2wg + 1 (an m64 tile of 64
// columns each); warp wq of it columns 16wq to 16wq + 15. A's rows are
// permuted so that a thread's two rows (gq and gq + 8) are neighbouring
// columns 2gq and 2gq + 1: its accumulators then hold column pairs of one
// channel.
//
// 3xTF32: a temporary takes kPer k8 steps of one tile, all small products
// first, then the big ones (one truncation per step at the size of the big
// products, as with a temporary per step, and half the FADDs); FADDs add
// the temporaries to the sums, the first one to the bias. The two tiles'
// groups alternate: while one's wgmmas run, the other's temporary is added
// and its next A gathered. A's registers and a temporary are rewritten only
// after the wait that ends the wgmmas reading them.
template <bool kTf32x3, int kSW>
__device__ __forceinline__ void fprop_stage_sm90(
    const ConvParams& p, const fc::FpropTcLayout& L, const int* k_table, const float* bias_s,
    uint32_t x_stage, uint32_t w_big, float* __restrict__ y, int n, int g, int co0, int co_here,
    int oh0, int ow0, int lead, bool vec_out, const CUtensorMap* y_map, float* out_stage) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gq = lane >> 2, tq = lane & 3;
  const int wg = warp / 4, wq = warp % 4;
  const int Ho = p.out_h, Wo = p.out_w, sh = p.stride_h, sw = kSW > 0 ? kSW : p.stride_w;
  const int oh_a = oh0 + 2 * wg;
  // Warpgroup-uniform. A warpgroup past the last row still meets the block's
  // barriers of the stores by tensor copy.
  const bool active = oh_a < Ho;
  if (!active && y_map == nullptr) return;
  const int n_total = p.in_channels_per_group() * p.kernel_h * p.kernel_w;
  constexpr int kPer = kTf32x3 ? 2 : 1;  // k8 steps per group of wgmmas
  constexpr uint32_t kElem = kTf32x3 ? 8 : 4;  // a staged element: [big, small] for 3xTF32
  const uint32_t xa = x_stage + kElem * ((2 * wg) * sh * L.pitch + lead + (16 * wq + 2 * gq) * sw);
  const uint32_t row_bytes = kElem * sh * L.pitch;  // to the warpgroup's second row
  const uint32_t col_bytes = kElem * sw;            // to A's row gq + 8: the next column
  [[maybe_unused]] const uint32_t w_small = w_big + 4u * fc::fprop_tc_weight_floats(L, true);
  constexpr uint32_t kStepBytes = 4 * 8 * kCo;

  uint32_t ab[2][kPer][4];
  [[maybe_unused]] uint32_t as[kTf32x3 ? 2 : 1][kPer][4];
  float acc[2][8][4];
  [[maybe_unused]] float tmp[kTf32x3 ? 2 : 1][8][4];
  // This thread's channels 8j + 2tq and the next.
  auto bias_of = [&](int j, int h) { return bias_s[8 * j + 2 * tq + h]; };
  if constexpr (!kTf32x3) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float b = bias_of(j, h);
        acc[0][j][h] = acc[0][j][h + 2] = acc[1][j][h] = acc[1][j][h + 2] = b;
      }
  }

  // A of tile m at k8 step t into slot i: (column 2gq, k 8t + tq), (2gq + 1,
  // same k), then both at k + 4; zero at K past the group's pairs (Inf
  // input times a zero weight would be NaN).
  auto load_a = [&](int t, int m, int i) {
    const int2 ko = few_channels::k8_offsets(k_table, t, tq);
    const uint32_t p0 = xa + m * row_bytes + kElem * ko.x, p1 = xa + m * row_bytes + kElem * ko.y;
    uint32_t(&b)[4] = ab[m][i];
    if constexpr (kTf32x3) {
      uint32_t(&sm)[4] = as[m][i];
      lds_u32x2(p0, b[0], sm[0]);
      lds_u32x2(p0 + col_bytes, b[1], sm[1]);
      lds_u32x2(p1, b[2], sm[2]);
      lds_u32x2(p1 + col_bytes, b[3], sm[3]);
    } else {
      b[0] = __float_as_uint(lds_f32(p0));
      b[1] = __float_as_uint(lds_f32(p0 + col_bytes));
      b[2] = __float_as_uint(lds_f32(p1));
      b[3] = __float_as_uint(lds_f32(p1 + col_bytes));
    }
    if (t == L.k_steps - 1) {
      const bool keep0 = t * 8 + tq < n_total, keep1 = t * 8 + tq + 4 < n_total;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (!(e < 2 ? keep0 : keep1)) {
          b[e] = 0u;
          if constexpr (kTf32x3) as[m][i][e] = 0u;
        }
      }
    }
  };
  // Steps t .. t + count - 1 of tile m as one group.
  auto issue = [&](int t, int m, auto count) {
    constexpr int kCount = decltype(count)::value;
    wgmma_fence();
    if constexpr (kTf32x3) {
#pragma unroll
      for (int i = 0; i < kCount; ++i) {
        const uint64_t big = wgmma_desc_k8(w_big + kStepBytes * (t + i));
        const uint64_t small = wgmma_desc_k8(w_small + kStepBytes * (t + i));
        wgmma_m64n64k8_tf32(tmp[m], as[m][i], big, i > 0);
        wgmma_m64n64k8_tf32(tmp[m], ab[m][i], small, true);
      }
#pragma unroll
      for (int i = 0; i < kCount; ++i) {
        wgmma_m64n64k8_tf32(tmp[m], ab[m][i], wgmma_desc_k8(w_big + kStepBytes * (t + i)), true);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kCount; ++i) {
        wgmma_m64n64k8_tf32(acc[m], ab[m][i], wgmma_desc_k8(w_big + kStepBytes * (t + i)), true);
      }
    }
    wgmma_commit();
  };
  auto add = [&](int m, bool first) {  // `first` folds away: the chains are unrolled
    if constexpr (kTf32x3) {
      wgmma_fence_operands(tmp[m]);
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          if (first) {
            acc[m][j][r] = bias_of(j, r & 1) + tmp[m][j][r];
          } else {
            acc[m][j][r] += tmp[m][j][r];
          }
        }
    }
  };
  // kGroups groups of kCount steps per tile from step t, tiles alternating;
  // each group's wait retires the one two before it, and every group is
  // retired by the end: ptxas serialises all wgmmas when one may be in
  // flight across a loop's back edge or a branch.
  auto chain = [&](int t, auto groups, auto count, auto first) {
    constexpr int kGroups = 2 * decltype(groups)::value;
    constexpr int kCount = decltype(count)::value;
    constexpr bool kFirst = decltype(first)::value;
#pragma unroll
    for (int q = 0; q < kGroups; ++q) {
      if (q >= 2) {
        wgmma_wait<1>();
        add(q & 1, kFirst && q < 4);
      }
#pragma unroll
      for (int i = 0; i < kCount; ++i) load_a(t + (q / 2) * kCount + i, q & 1, i);
      issue(t + (q / 2) * kCount, q & 1, count);
    }
    wgmma_wait<1>();
    add(0, kFirst && kGroups == 2);
    wgmma_wait<0>();
    add(1, kFirst && kGroups == 2);
  };
  // Two groups of kPer steps per tile an iteration; then what is left.
  constexpr int kIter = 2 * kPer;
  auto run = [&](auto first) {
    int t = 0;
    if constexpr (decltype(first)::value) {
      if (L.k_steps >= kIter) {
        chain(0, Int<2>{}, Int<kPer>{}, first);
        t = kIter;
      } else if (kPer == 2 && L.k_steps >= 2) {
        chain(0, Int<1>{}, Int<kPer>{}, first);
        t = 2;
      } else {
        chain(0, Int<1>{}, Int<1>{}, first);
        t = 1;
      }
    }
    constexpr std::false_type kLater{};
#pragma unroll 1
    for (; t + kIter <= L.k_steps; t += kIter) chain(t, Int<2>{}, Int<kPer>{}, kLater);
    if (kPer == 2 && t + 2 <= L.k_steps) {
      chain(t, Int<1>{}, Int<kPer>{}, kLater);
      t += 2;
    }
    if (t < L.k_steps) chain(t, Int<1>{}, Int<1>{}, kLater);
  };
  if (active) {
    run(std::bool_constant<kTf32x3>{});  // 3xTF32 adds the bias with the first temporaries
    if constexpr (!kTf32x3) {
      wgmma_fence_operands(acc[0]);
      wgmma_fence_operands(acc[1]);
    }
  }

  // Accumulator (m, j, r): row oh_a + m, channel 8j + 2tq + (r & 1),
  // column 16wq + 2gq (+ 1 for r >= 2).
  if (y_map != nullptr) {
    // Through shared memory and the tensor-copy engine, which writes the
    // stage's rows while the next stage computes. Per warpgroup two boxes
    // of 32 columns, each [row][channel][column]: 128-byte lines in the
    // 128-byte swizzle (16-byte chunk c of line l at c ^ (l % 8)), so the
    // four channels a store's lanes write (2tq + h) fall in four chunks of a
    // bank row. Block-wide barriers: the warpgroups meet at the next stage's
    // anyway.
    float* const boxes = out_stage + wg * 2 * kOutBoxFloats;
    if (threadIdx.x == 0) bulk_wait<0, /*kRead=*/true>();  // the last stage's boxes are read
    __syncthreads();
    if (active) {
      const int col = 16 * (wq & 1) + 2 * gq;
      const uint32_t box = smem_addr(boxes) + (wq >> 1) * 4 * kOutBoxFloats + (col & 3) * 4;
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int line = m * kCo + 8 * j + 2 * tq + h;
            sts_f32x2(box + line * 128 + (((col >> 2) ^ (line & 7)) << 4), acc[m][j][h],
                      acc[m][j][2 + h]);
          }
      fence_proxy_async_smem();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const int c = g * p.out_channels_per_group() + co0;
      for (int i = 0; i < 2 && oh0 + 2 * i < Ho; ++i) {
        tma_store_4d(y_map, out_stage + i * 2 * kOutBoxFloats, ow0, c, oh0 + 2 * i, n);
        tma_store_4d(y_map, out_stage + (i * 2 + 1) * kOutBoxFloats, ow0 + 32, c, oh0 + 2 * i,
                     n);
      }
      bulk_commit();
    }
    return;
  }
  const int64_t out_plane = int64_t(Ho) * Wo;
  const int ow = ow0 + 16 * wq + 2 * gq;
  if (ow >= Wo) return;
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    if (oh_a + m >= Ho) continue;
    float* const y_row = y + plane_offset(n, p.out_channels, g * p.out_channels_per_group() + co0,
                                          out_plane) +
                         int64_t(oh_a + m) * Wo + ow;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int co = 8 * j + 2 * tq + h;
        if (co >= co_here) continue;
        float* const y_co = y_row + co * out_plane;
        const float v0 = acc[m][j][h], v1 = acc[m][j][2 + h];
        if (vec_out) {  // Wo even: ow + 1 < Wo too
          *reinterpret_cast<float2*>(y_co) = make_float2(v0, v1);
        } else {
          y_co[0] = v0;
          if (ow + 1 < Wo) y_co[1] = v1;
        }
      }
  }
}

}  // namespace fprop_tc
}  // namespace cuda
}  // namespace conv2d_ext
