// fprop over channels_last activations on wgmma (sm_90a): float32 operands
// in TF32 mode, or float16 / bfloat16 ones (E), float32 accumulators.
//
// The GEMM, tiles and K-tile gather of fprop.cu (gather.cuh), with the
// math on warpgroup MMAs: the block's 128 rows are two warpgroups' 64, and
// each k step of a staged K tile (k8 for TF32, k16 for 16-bit operands:
// both 32 bytes of a 128-byte row) is one wgmma per warpgroup that reads A
// and B from shared memory through 128-byte-swizzle descriptors, so no
// fragment passes through registers. Every thread still copies: cp.async
// writes through the generic proxy, so each thread fences its copies to
// the async proxy before the barrier that hands a stage to wgmma. The
// tensor cores would truncate float32 operands to TF32; as everywhere in
// TF32 mode, each thread first rounds the chunks it copied to nearest, in
// place (the option nhwc_tf32_truncate leaves them to the tensor cores).
// 16-bit operands are exact as they are.
// A K tile's wgmmas are issued before the copies of a later tile and the
// rounding of the next, so both run while the tensor cores work.
// Where config.h's choose_fprop splits K, grid.y is the slice: each slice
// writes its float32 partial sums to a workspace [slice][M][N], and a
// second kernel adds them in slice order, with the bias, into y.
// 3xTF32 (IEEE mode, kX3): each thread splits the chunks it copied into
// their big TF32 parts, in place, and small ones, in the stage's second
// half; a K tile's big*small and small*big products, then its big*big, go
// into a partial sum that the accumulators take with FADDs once the
// wgmmas retire, so that the tensor cores' truncating sums run over one
// K tile's 32 channels at most, the rest as FP32 sums.
//
// Instantiated per element type in its own file (fprop_sm90_*.cu), so the
// three compile in parallel.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../common.cuh"
#include "../mma.cuh"
#include "config.h"
#include "gather.cuh"
#include "nhwc.h"

namespace conv2d_ext {
namespace cuda {
namespace nhwc_sm90 {

namespace cfg = igemm_nhwc;
constexpr int kBM = 128;  // two warpgroups of 64 rows

template <int BN, typename E, bool kX3_ = false>
struct WgmmaTraits {
  static constexpr bool kX3 = kX3_;
  static constexpr int kFrags = BN / 8;  // a warp's n8 accumulator fragments
  static constexpr int kARows = kBM * nhwc::kChunks / cfg::kThreads;  // rows a thread copies
  static constexpr int kBRows = BN * nhwc::kChunks / cfg::kThreads;
  // A staged K tile; with kX3 its small parts follow (same swizzle: the
  // offset is a whole number of 1024-byte atoms).
  static constexpr int kHalfElems = (kBM + BN) * nhwc::kRowElems<E>;
  static constexpr int kStageElems = kHalfElems * (kX3 ? 2 : 1);
  static constexpr int kStages = kX3 ? cfg::tf32x3_stages(BN) : cfg::stages(kBM, BN);
  static constexpr int kBlocksPerSm = kX3 ? 1 : cfg::blocks_per_sm(kBM, BN);
  static_assert(cfg::kThreads == 256, "two warpgroups");
  static_assert(!kX3 || std::is_same_v<E, float>, "3xTF32 splits float32 operands");
  static_assert(kHalfElems * sizeof(E) % cfg::kWgmmaAlign == 0, "small parts on whole atoms");
};

// fn(address) for each 16-byte chunk this thread copied into a float32
// stage (load_stage's rows: A's, then B's).
template <typename T, typename Fn>
__device__ __forceinline__ void for_own_chunks(float* stage, int row0, int chunk, Fn&& fn) {
  constexpr int kRowStep = cfg::kThreads / nhwc::kChunks;
#pragma unroll
  for (int i = 0; i < T::kARows; ++i) fn(stage + nhwc::swizzled(row0 + i * kRowStep, chunk));
  float* const sb = stage + kBM * cfg::kBlockK;
#pragma unroll
  for (int i = 0; i < T::kBRows; ++i) fn(sb + nhwc::swizzled(row0 + i * kRowStep, chunk));
}

// The chunks this thread copied, rounded to nearest TF32 in place.
template <typename T>
__device__ __forceinline__ void round_own_chunks(float* stage, int row0, int chunk) {
  for_own_chunks<T>(stage, row0, chunk, [](float* at) {
    float4 v = *reinterpret_cast<float4*>(at);
    v.x = __uint_as_float(tf32_operand(v.x));
    v.y = __uint_as_float(tf32_operand(v.y));
    v.z = __uint_as_float(tf32_operand(v.z));
    v.w = __uint_as_float(tf32_operand(v.w));
    *reinterpret_cast<float4*>(at) = v;
  });
}

// 3xTF32: the chunks this thread copied split into big (rounded to nearest
// TF32, in place) and small (the rest, rounded) parts, the small ones at
// the same place of the stage's second half. Rounding both leaves each
// product's error at most about 2^-22 of it (mma.cuh, tf32_split).
template <typename T>
__device__ __forceinline__ void split_own_chunks(float* stage, int row0, int chunk) {
  for_own_chunks<T>(stage, row0, chunk, [](float* at) {
    uint32_t big[4], small[4];
    tf32_split4<true, true>(*reinterpret_cast<const float4*>(at), big, small);
    *reinterpret_cast<uint4*>(at) = make_uint4(big[0], big[1], big[2], big[3]);
    *reinterpret_cast<uint4*>(at + T::kHalfElems) = make_uint4(small[0], small[1], small[2], small[3]);
  });
}

// One k step's wgmma in E's type: TF32 k8, or 16-bit k16.
template <typename E, int kFrags>
__device__ __forceinline__ void wgmma_step(float (&acc)[kFrags][4], uint64_t a, uint64_t b) {
  if constexpr (std::is_same_v<E, float>) {
    wgmma_tf32_ss(acc, a, b, true);
  } else {
    wgmma_16bit_ss<kFrags, std::is_same_v<E, __nv_bfloat16>>(acc, a, b, true);
  }
}

// Warpgroup wg's products over one staged K tile: its 64 A rows against
// all BN B rows, k step kk 32 bytes into the swizzled 128-byte rows.
// Issued only: the caller overlaps them with the next tile's copies and
// retires them (wgmma_wait) before the barrier that frees the stage.
template <typename T, typename E>
__device__ __forceinline__ void issue_stage(float (&acc)[T::kFrags][4], const E* stage, int wg) {
  const uint32_t a = smem_addr(stage) + wg * 64 * cfg::kRowBytes;
  const uint32_t b = smem_addr(stage + kBM * nhwc::kRowElems<E>);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < cfg::kRowBytes / 32; ++kk)
    wgmma_step<E>(acc, wgmma_desc_sw128(a + 32 * kk), wgmma_desc_sw128(b + 32 * kk));
  wgmma_commit();
}

// 3xTF32: warpgroup wg's products over k steps kFirst .. kFirst + kSteps - 1
// of one staged K tile into `part` (overwritten): every step's big*small
// and small*big, then big*big, so that the small products are summed
// before the large ones join. Issued only, as issue_stage.
template <typename T, int kFirst = 0, int kSteps = cfg::kRowBytes / 32>
__device__ __forceinline__ void issue_stage_x3(float (&part)[T::kFrags][4], const float* stage,
                                               int wg) {
  const uint32_t a = smem_addr(stage) + wg * 64 * cfg::kRowBytes;
  const uint32_t b = smem_addr(stage + kBM * cfg::kBlockK);
  constexpr uint32_t kSmall = T::kHalfElems * sizeof(float);
  wgmma_fence();
#pragma unroll
  for (int kk = kFirst; kk < kFirst + kSteps; ++kk) {
    wgmma_tf32_ss(part, wgmma_desc_sw128(a + 32 * kk), wgmma_desc_sw128(b + kSmall + 32 * kk),
                  kk > kFirst);
    wgmma_tf32_ss(part, wgmma_desc_sw128(a + kSmall + 32 * kk), wgmma_desc_sw128(b + 32 * kk),
                  true);
  }
#pragma unroll
  for (int kk = kFirst; kk < kFirst + kSteps; ++kk)
    wgmma_tf32_ss(part, wgmma_desc_sw128(a + 32 * kk), wgmma_desc_sw128(b + 32 * kk), true);
  wgmma_commit();
}

// part's sums into the accumulators, once its wgmmas have retired.
template <typename T>
__device__ __forceinline__ void add_part(float (&acc)[T::kFrags][4], float (&part)[T::kFrags][4]) {
  wgmma_fence_operands(part);
#pragma unroll
  for (int j = 0; j < T::kFrags; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] += part[j][i];
}

// This thread's copies of a stage landed, rounded (float32, if `convert`)
// or split (3xTF32), and handed to the async proxy; a barrier must still
// follow before wgmma reads it. kPending: the copy groups committed after
// the stage's, which may still be in flight.
template <typename T, typename E, int kPending = T::kStages - 2>
__device__ __forceinline__ void ready_own_chunks(E* stage, int row0, int chunk, bool convert) {
  cp_async_wait<kPending>();
  if constexpr (T::kX3) {
    if (convert) split_own_chunks<T>(stage, row0, chunk);
  } else if constexpr (std::is_same_v<E, float>) {
    if (convert) round_own_chunks<T>(stage, row0, chunk);
  }
  fence_proxy_async_smem();
}

// Conversions between float32 and E, rounding to nearest, and two
// adjacent results of type O in one store.
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename O>
__device__ __forceinline__ O from_float(float v) {
  if constexpr (std::is_same_v<O, __half>) {
    return __float2half_rn(v);
  } else if constexpr (std::is_same_v<O, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return v;
  }
}
__device__ __forceinline__ void store_pair(float* at, float a, float b) {
  *reinterpret_cast<float2*>(at) = make_float2(a, b);
}
__device__ __forceinline__ void store_pair(__half* at, float a, float b) {
  *reinterpret_cast<__half2*>(at) = __floats2half2_rn(a, b);
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* at, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(at) = __floats2bfloat162_rn(a, b);
}

// The accumulators (+ bias) to y, [pixel][output channel]. Warp w holds
// rows 16 w + g and 16 w + g + 8 of the tile (warpgroup w / 4's 64 rows,
// 16 per warp), fragment j columns 8 j + 2 t and + 1: one store a pair.
template <typename T, typename O>
__device__ __forceinline__ void store_tile(const float (&acc)[T::kFrags][4], const ConvParams& p,
                                           const cfg::OutMap& out, const O* __restrict__ bias,
                                           O* __restrict__ y, int m0, int n0, int warp,
                                           int lane) {
  const int g = lane >> 2, t = lane & 3;
  const int64_t M = p.gemm_m(), N = p.out_channels;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t m = int64_t(m0) + warp * 16 + g + 8 * h;
    if (m >= M) continue;
    O* const row = y + nhwc::out_offset(out, p, m);
#pragma unroll
    for (int j = 0; j < T::kFrags; ++j) {
      const int n = n0 + 8 * j + 2 * t;
      if (n >= N) continue;
      const float b0 = bias ? to_float(bias[n]) : 0.f, b1 = bias ? to_float(bias[n + 1]) : 0.f;
      store_pair(row + n, acc[j][2 * h] + b0, acc[j][2 * h + 1] + b1);
    }
  }
}

// Operands of type E; results of type O: E itself, or float32 partial sums
// of a K slice. kX3: 3xTF32 (E float32), a partial sum every kPartSteps
// k steps (4: one a K tile; 2: two, the first retired and added before
// the second is issued, for a shorter chain in the tensor cores at the
// cost of a drain). kPipelined (not with kX3): tile
// kt's wgmmas stay in flight while tile kt + 1 is readied and the barrier
// passes, and tile kt - 1's retire first (wgmma_wait<1>), so the tensor
// cores need not drain at every barrier; the copy into tile kt - 1's stage
// then waits until after the barrier, one step later than otherwise.
template <int BN, typename E, typename O, bool kX3 = false, bool kPipelined = false,
          int kPartSteps = 4>
__global__ void __launch_bounds__(cfg::kThreads, WgmmaTraits<BN, E, kX3>::kBlocksPerSm)
    fprop_nhwc_wgmma_kernel(const ConvParams p, const cfg::OutMap out, const E* __restrict__ x,
                            const E* __restrict__ w, const O* __restrict__ bias,
                            O* __restrict__ y, int n_tiles, int c_tiles, int k_tiles,
                            int tiles_per_split, int64_t split_elems, bool round) {
  using T = WgmmaTraits<BN, E, kX3>;
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  E* const smem = reinterpret_cast<E*>(
      smem_bytes + ((cfg::kWgmmaAlign - (smem_addr(smem_bytes) & (cfg::kWgmmaAlign - 1))) &
                    (cfg::kWgmmaAlign - 1)));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // Output-channel tiles vary fastest, as in fprop.cu.
  const int m0 = static_cast<int>(blockIdx.x / n_tiles) * kBM;
  const int n0 = static_cast<int>(blockIdx.x % n_tiles) * BN;
  const int row0 = threadIdx.x / nhwc::kChunks, chunk = threadIdx.x % nhwc::kChunks;
  const nhwc::ARows<T> a(p, m0, row0);
  // This block's slice of the K tiles (all of them where K is not split).
  const int kt0 = static_cast<int>(blockIdx.y) * tiles_per_split;
  const int kts = min(k_tiles - kt0, tiles_per_split);
  y += blockIdx.y * split_elems;
  auto stage = [&](int kt) { return smem + (kt % T::kStages) * T::kStageElems; };
  auto load = [&](int kt) {
    if (kt < kts)
      nhwc::load_stage<T, kBM, BN>(stage(kt), p, a, x, w, n0,
                                   nhwc::k_tile<E>(p, c_tiles, kt0 + kt), row0, chunk);
    cp_async_commit();  // empty groups too: the wait below counts groups
  };

  float acc[T::kFrags][4];
  float part[T::kFrags][4];  // 3xTF32: a K tile's products
#pragma unroll
  for (int j = 0; j < T::kFrags; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;
  const bool convert = kX3 || round;  // 3xTF32 always splits
#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s) load(s);
  ready_own_chunks<T>(stage(0), row0, chunk, convert);
  __syncthreads();
  if constexpr (kPipelined) {
    static_assert(!kX3 && T::kStages >= 3, "a stage in flight, one ready, one refilling");
    for (int kt = 0; kt < kts; ++kt) {
      issue_stage<T>(acc, stage(kt), warp >> 2);
      wgmma_wait<1>();  // tile kt - 1's retire; tile kt's run on
      // The copies committed after tile kt + 1's (kStages - 3 groups: this
      // iteration's comes after the barrier) may still be in flight.
      ready_own_chunks<T, E, T::kStages - 3>(stage(kt + 1), row0, chunk,
                                             convert && kt + 1 < kts);
      // Both warpgroups have retired tile kt - 1, whose stage the copy below
      // refills, and tile kt + 1 is visible to wgmma.
      __syncthreads();
      load(kt + T::kStages - 1);
    }
    wgmma_wait<0>();
    wgmma_fence_operands(acc);
  } else {
    for (int kt = 0; kt < kts; ++kt) {
      if constexpr (kX3 && kPartSteps == 2) {
        issue_stage_x3<T, 0, 2>(part, stage(kt), warp >> 2);
        wgmma_wait<0>();
        add_part<T>(acc, part);
        issue_stage_x3<T, 2, 2>(part, stage(kt), warp >> 2);
      } else if constexpr (kX3) {
        static_assert(kPartSteps == cfg::kRowBytes / 32, "a part is a K tile or half of one");
        issue_stage_x3<T>(part, stage(kt), warp >> 2);
      } else {
        issue_stage<T>(acc, stage(kt), warp >> 2);
      }
      // While the tensor cores work on tile kt: refill the stage tile kt - 1
      // used (retired before the last barrier) and ready tile kt + 1.
      load(kt + T::kStages - 1);
      ready_own_chunks<T>(stage(kt + 1), row0, chunk, convert && kt + 1 < kts);
      wgmma_wait<0>();
      if constexpr (kX3) {
        add_part<T>(acc, part);
      } else {
        wgmma_fence_operands(acc);
      }
      // Tile kt + 1 is visible to wgmma, and both warpgroups have retired
      // tile kt's, whose stage the next iteration's copy overwrites.
      __syncthreads();
    }
  }
  store_tile<T>(acc, p, out, bias, y, m0, n0, warp, lane);
}

// y (through `out`) = the slices' partial sums [slice][M][N], added in
// slice order, + bias.
template <typename O>
__global__ void __launch_bounds__(kThreads)
    add_slices_kernel(const ConvParams p, const cfg::OutMap out,
                      const float* __restrict__ partial, int splits,
                      const O* __restrict__ bias, O* __restrict__ y) {
  const int64_t n_count = p.out_channels, mn = p.gemm_m() * n_count;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < mn;
       i += int64_t(gridDim.x) * kThreads) {
    const int64_t m = i / n_count, n = i - m * n_count;
    float sum = 0.f;
    for (int s = 0; s < splits; ++s) sum += partial[s * mn + i];
    y[nhwc::out_offset(out, p, m) + n] = from_float<O>(sum + (bias ? to_float(bias[n]) : 0.f));
  }
}

// The kernel of k's variant (pipelined, 3xTF32 parts) with results of type O.
template <int BN, typename E, typename O, bool kX3>
auto wgmma_kernel(const cfg::FpropKernel& k) {
  if (!kX3 && k.pipelined) return fprop_nhwc_wgmma_kernel<BN, E, O, kX3, !kX3>;
  if (kX3 && k.half_parts) return fprop_nhwc_wgmma_kernel<BN, E, O, kX3, false, kX3 ? 2 : 4>;
  return fprop_nhwc_wgmma_kernel<BN, E, O, kX3>;
}

template <int BN, typename E, bool kX3>
void launch(const ConvParams& p, const cfg::OutMap& out, const E* x, const E* w, const E* bias,
            E* y, const cfg::FpropKernel& k) {
  const NhwcGrid g = nhwc_fprop_grid(p, {kBM, BN}, int(sizeof(E)));
  TORCH_CHECK(k.splits >= 1 && k.splits * k.tiles_per_split >= g.k_tiles &&
                  (k.splits - 1) * k.tiles_per_split < g.k_tiles,
              "conv2d_ext: internal error: K slices do not cover the K tiles");
  const size_t smem = static_cast<size_t>(kX3 ? cfg::tf32x3_smem_bytes({kBM, BN})
                                              : cfg::wgmma_smem_bytes({kBM, BN}));
  const dim3 grid(static_cast<unsigned>(g.m_tiles * g.n_tiles), static_cast<unsigned>(k.splits));
  const auto stream = current_stream();
  if (k.splits == 1) {
    auto kernel = wgmma_kernel<BN, E, E, kX3>(k);
    ensure_dynamic_smem(kernel, smem);
    kernel<<<grid, cfg::kThreads, smem, stream>>>(
        p, out, x, w, bias, y, static_cast<int>(g.n_tiles), static_cast<int>(g.c_tiles),
        static_cast<int>(g.k_tiles), static_cast<int>(g.k_tiles), 0, k.round);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  // choose_fprop splits K on 128 x 128 and 128 x 64 tiles only.
  if constexpr (BN != 256) {
    // Each slice's partial sums, dense [M][N], no bias; then their sum.
    auto kernel = wgmma_kernel<BN, E, float, kX3>(k);
    ensure_dynamic_smem(kernel, smem);
    const int64_t mn = p.gemm_m() * p.out_channels;
    const at::TensorBase partial = scratch({k.splits, mn}, at::kFloat);
    kernel<<<grid, cfg::kThreads, smem, stream>>>(
        p, cfg::dense_out(p), x, w, nullptr, partial.data_ptr<float>(),
        static_cast<int>(g.n_tiles), static_cast<int>(g.c_tiles), static_cast<int>(g.k_tiles),
        static_cast<int>(k.tiles_per_split), mn, k.round);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const int blocks = static_cast<int>(std::min<int64_t>(ceil_div(mn, kThreads), 65535));
    add_slices_kernel<E><<<blocks, kThreads, 0, stream>>>(p, out, partial.data_ptr<float>(),
                                                          k.splits, bias, y);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  } else {
    TORCH_CHECK(false, "conv2d_ext: internal error: no K split on 128 x 256 tiles");
  }
}

// The kernel of k's math: 3xTF32 for float32 operands in IEEE mode (128 x
// 128 and 128 x 64 tiles), else E's own.
template <int BN, typename E>
void launch_math(const ConvParams& p, const cfg::OutMap& out, const E* x, const E* w,
                 const E* bias, E* y, const cfg::FpropKernel& k) {
  if constexpr (std::is_same_v<E, float> && BN != 256) {
    if (k.tf32x3) return launch<BN, E, true>(p, out, x, w, bias, y, k);
  }
  TORCH_CHECK(!k.tf32x3, "conv2d_ext: internal error: no 3xTF32 wgmma forward for these tiles "
              "or operands");
  launch<BN, E, false>(p, out, x, w, bias, y, k);
}

}  // namespace nhwc_sm90

template <typename E>
void launch_fprop_nhwc_wgmma(const ConvParams& p, const igemm_nhwc::OutMap& out, const E* x,
                             const E* w, const E* bias, E* y, const igemm_nhwc::FpropKernel& k) {
  using nhwc_sm90::kBM;
  using nhwc_sm90::launch_math;
  TORCH_CHECK(k.tile.m == kBM && (k.tile.n == 256 || k.tile.n == 128 || k.tile.n == 64),
              "conv2d_ext: internal error: no wgmma forward for a ", k.tile.m, " x ", k.tile.n,
              " tile");
  if (k.tile.n == 256) {
    launch_math<256>(p, out, x, w, bias, y, k);
  } else if (k.tile.n == 128) {
    launch_math<128>(p, out, x, w, bias, y, k);
  } else {
    launch_math<64>(p, out, x, w, bias, y, k);
  }
}

}  // namespace cuda
}  // namespace conv2d_ext
