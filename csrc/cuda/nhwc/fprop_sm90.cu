// fprop over channels_last activations on wgmma (sm_90a), TF32 mode.
//
// The GEMM, tiles and K-tile gather of fprop.cu (gather.cuh), with the
// math on warpgroup MMAs: the block's 128 rows are two warpgroups' 64, and
// each k8 step of a staged K tile is one wgmma per warpgroup that reads A
// and B from shared memory through 128-byte-swizzle descriptors, so no
// fragment passes through registers. Every thread still copies: cp.async
// writes through the generic proxy, so each thread fences its copies to
// the async proxy before the barrier that hands a stage to wgmma. The
// tensor cores would truncate operands to TF32; as everywhere in TF32
// mode, each thread first rounds the chunks it copied to nearest, in
// place (the option nhwc_tf32_truncate leaves them to the tensor cores).
// A K tile's wgmmas are issued before the copies of a later tile and the
// rounding of the next, so both run while the tensor cores work.
// Where config.h's choose_fprop splits K, grid.y is the slice: each slice
// writes its partial sums to a workspace [slice][M][N], and a second
// kernel adds them in slice order, with the bias, into y.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <cstdint>

#include "../common.cuh"
#include "../mma.cuh"
#include "config.h"
#include "gather.cuh"
#include "nhwc.h"

namespace conv2d_ext {
namespace cuda {
namespace {

namespace cfg = igemm_nhwc;
constexpr int kBM = 128;  // two warpgroups of 64 rows

template <int BN>
struct WgmmaTraits {
  static constexpr int kFrags = BN / 8;  // a warp's n8 accumulator fragments
  static constexpr int kARows = kBM * nhwc::kChunks / cfg::kThreads;  // rows a thread copies
  static constexpr int kBRows = BN * nhwc::kChunks / cfg::kThreads;
  static constexpr int kStageFloats = (kBM + BN) * cfg::kBlockK;
  static constexpr int kStages = cfg::stages(kBM, BN);
  static constexpr int kBlocksPerSm = cfg::blocks_per_sm(kBM, BN);
  static_assert(cfg::kThreads == 256, "two warpgroups");
};

// The chunks this thread copied into a stage (load_stage's rows), rounded
// to nearest TF32 in place.
template <typename T>
__device__ __forceinline__ void round_own_chunks(float* stage, int row0, int chunk) {
  auto round4 = [](float* at) {
    float4 v = *reinterpret_cast<float4*>(at);
    v.x = __uint_as_float(tf32_operand(v.x));
    v.y = __uint_as_float(tf32_operand(v.y));
    v.z = __uint_as_float(tf32_operand(v.z));
    v.w = __uint_as_float(tf32_operand(v.w));
    *reinterpret_cast<float4*>(at) = v;
  };
  constexpr int kRowStep = cfg::kThreads / nhwc::kChunks;
#pragma unroll
  for (int i = 0; i < T::kARows; ++i) round4(stage + nhwc::swizzled(row0 + i * kRowStep, chunk));
  float* const sb = stage + kBM * cfg::kBlockK;
#pragma unroll
  for (int i = 0; i < T::kBRows; ++i) round4(sb + nhwc::swizzled(row0 + i * kRowStep, chunk));
}

// Warpgroup wg's products over one staged K tile: its 64 A rows against
// all BN B rows, k8 step kk 32 bytes into the swizzled 128-byte rows.
// Issued only: the caller overlaps them with the next tile's copies and
// retires them (wgmma_wait) before the barrier that frees the stage.
template <typename T>
__device__ __forceinline__ void issue_stage(float (&acc)[T::kFrags][4], const float* stage,
                                            int wg) {
  const uint32_t a = smem_addr(stage) + wg * 64 * cfg::kBlockK * 4;
  const uint32_t b = smem_addr(stage + kBM * cfg::kBlockK);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < cfg::kBlockK / 8; ++kk)
    wgmma_tf32_ss(acc, wgmma_desc_sw128(a + 32 * kk), wgmma_desc_sw128(b + 32 * kk), true);
  wgmma_commit();
}

// This thread's copies of a stage landed, rounded if asked, and handed to
// the async proxy; a barrier must still follow before wgmma reads it.
template <typename T>
__device__ __forceinline__ void ready_own_chunks(float* stage, int row0, int chunk, bool round) {
  cp_async_wait<T::kStages - 2>();
  if (round) round_own_chunks<T>(stage, row0, chunk);
  fence_proxy_async_smem();
}

// The accumulators (+ bias) to y, [pixel][output channel]. Warp w holds
// rows 16 w + g and 16 w + g + 8 of the tile (warpgroup w / 4's 64 rows,
// 16 per warp), fragment j columns 8 j + 2 t and + 1: 8-byte stores.
template <typename T>
__device__ __forceinline__ void store_tile(const float (&acc)[T::kFrags][4], const ConvParams& p,
                                           const cfg::OutMap& out,
                                           const float* __restrict__ bias,
                                           float* __restrict__ y, int m0, int n0, int warp,
                                           int lane) {
  const int g = lane >> 2, t = lane & 3;
  const int64_t M = p.gemm_m(), N = p.out_channels;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t m = int64_t(m0) + warp * 16 + g + 8 * h;
    if (m >= M) continue;
    float* const row = y + nhwc::out_offset(out, p, m);
#pragma unroll
    for (int j = 0; j < T::kFrags; ++j) {
      const int n = n0 + 8 * j + 2 * t;
      if (n >= N) continue;
      const float b0 = bias ? bias[n] : 0.f, b1 = bias ? bias[n + 1] : 0.f;
      *reinterpret_cast<float2*>(row + n) =
          make_float2(acc[j][2 * h] + b0, acc[j][2 * h + 1] + b1);
    }
  }
}

template <int BN>
__global__ void __launch_bounds__(cfg::kThreads, WgmmaTraits<BN>::kBlocksPerSm)
    fprop_nhwc_wgmma_kernel(const ConvParams p, const cfg::OutMap out, const float* __restrict__ x,
                            const float* __restrict__ w, const float* __restrict__ bias,
                            float* __restrict__ y, int n_tiles, int c_tiles, int k_tiles,
                            int tiles_per_split, int64_t split_floats, bool round) {
  using T = WgmmaTraits<BN>;
  extern __shared__ __align__(128) float smem_base[];
  float* const smem =
      smem_base + ((cfg::kWgmmaAlign - (smem_addr(smem_base) & (cfg::kWgmmaAlign - 1))) &
                   (cfg::kWgmmaAlign - 1)) / 4;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // Output-channel tiles vary fastest, as in fprop.cu.
  const int m0 = static_cast<int>(blockIdx.x / n_tiles) * kBM;
  const int n0 = static_cast<int>(blockIdx.x % n_tiles) * BN;
  const int row0 = threadIdx.x / nhwc::kChunks, chunk = threadIdx.x % nhwc::kChunks;
  const nhwc::ARows<T> a(p, m0, row0);
  // This block's slice of the K tiles (all of them where K is not split).
  const int kt0 = static_cast<int>(blockIdx.y) * tiles_per_split;
  const int kts = min(k_tiles - kt0, tiles_per_split);
  y += blockIdx.y * split_floats;
  auto load = [&](int kt) {
    if (kt < kts)
      nhwc::load_stage<T, kBM, BN>(smem + (kt % T::kStages) * T::kStageFloats, p, a, x, w, n0,
                                   nhwc::k_tile(p, c_tiles, kt0 + kt), row0, chunk);
    cp_async_commit();  // empty groups too: the wait below counts groups
  };

  float acc[T::kFrags][4];
#pragma unroll
  for (int j = 0; j < T::kFrags; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;
#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s) load(s);
  auto stage = [&](int kt) { return smem + (kt % T::kStages) * T::kStageFloats; };
  ready_own_chunks<T>(stage(0), row0, chunk, round);
  __syncthreads();
  for (int kt = 0; kt < kts; ++kt) {
    issue_stage<T>(acc, stage(kt), warp >> 2);
    // While the tensor cores work on tile kt: refill the stage tile kt - 1
    // used (retired before the last barrier) and ready tile kt + 1.
    load(kt + T::kStages - 1);
    ready_own_chunks<T>(stage(kt + 1), row0, chunk, round && kt + 1 < kts);
    wgmma_wait<0>();
    wgmma_fence_operands(acc);
    // Tile kt + 1 is visible to wgmma, and both warpgroups have retired
    // tile kt's, whose stage the next iteration's copy overwrites.
    __syncthreads();
  }
  store_tile<T>(acc, p, out, bias, y, m0, n0, warp, lane);
}

// y (through `out`) = the slices' partial sums [slice][M][N], added in
// slice order, + bias.
__global__ void __launch_bounds__(kThreads)
    add_slices_kernel(const ConvParams p, const cfg::OutMap out,
                      const float* __restrict__ partial, int splits,
                      const float* __restrict__ bias, float* __restrict__ y) {
  const int64_t n_count = p.out_channels, mn = p.gemm_m() * n_count;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < mn;
       i += int64_t(gridDim.x) * kThreads) {
    const int64_t m = i / n_count, n = i - m * n_count;
    float sum = 0.f;
    for (int s = 0; s < splits; ++s) sum += partial[s * mn + i];
    y[nhwc::out_offset(out, p, m) + n] = sum + (bias ? bias[n] : 0.f);
  }
}

template <int BN>
void launch(const ConvParams& p, const cfg::OutMap& out, const float* x, const float* w,
            const float* bias, float* y, const cfg::FpropKernel& k) {
  const NhwcGrid g = nhwc_fprop_grid(p, {kBM, BN});
  TORCH_CHECK(k.splits >= 1 && k.splits * k.tiles_per_split >= g.k_tiles &&
                  (k.splits - 1) * k.tiles_per_split < g.k_tiles,
              "conv2d_ext: internal error: K slices do not cover the K tiles");
  auto kernel = fprop_nhwc_wgmma_kernel<BN>;
  const size_t smem = static_cast<size_t>(cfg::wgmma_smem_bytes({kBM, BN}));
  ensure_dynamic_smem(kernel, smem);
  const dim3 grid(static_cast<unsigned>(g.m_tiles * g.n_tiles), static_cast<unsigned>(k.splits));
  const auto stream = at::cuda::getCurrentCUDAStream();
  if (k.splits == 1) {
    kernel<<<grid, cfg::kThreads, smem, stream>>>(
        p, out, x, w, bias, y, static_cast<int>(g.n_tiles), static_cast<int>(g.c_tiles),
        static_cast<int>(g.k_tiles), static_cast<int>(g.k_tiles), 0, k.round);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  // Each slice's partial sums, dense [M][N], no bias; then their sum.
  const int64_t mn = p.gemm_m() * p.out_channels;
  const at::Tensor partial = at::empty(
      {k.splits, mn}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, c10::cuda::current_device()));
  kernel<<<grid, cfg::kThreads, smem, stream>>>(
      p, cfg::dense_out(p), x, w, nullptr, partial.data_ptr<float>(),
      static_cast<int>(g.n_tiles), static_cast<int>(g.c_tiles), static_cast<int>(g.k_tiles),
      static_cast<int>(k.tiles_per_split), mn, k.round);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const int blocks = static_cast<int>(std::min<int64_t>(ceil_div(mn, kThreads), 65535));
  add_slices_kernel<<<blocks, kThreads, 0, stream>>>(p, out, partial.data_ptr<float>(), k.splits,
                                                     bias, y);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void launch_fprop_nhwc_wgmma(const ConvParams& p, const igemm_nhwc::OutMap& out, const float* x,
                             const float* w, const float* bias, float* y,
                             const igemm_nhwc::FpropKernel& k) {
  TORCH_CHECK(k.tile.m == kBM && (k.tile.n == 256 || k.tile.n == 128 || k.tile.n == 64),
              "conv2d_ext: internal error: no wgmma forward for a ", k.tile.m, " x ", k.tile.n,
              " tile");
  if (k.tile.n == 256) {
    launch<256>(p, out, x, w, bias, y, k);
  } else if (k.tile.n == 128) {
    launch<128>(p, out, x, w, bias, y, k);
  } else {
    launch<64>(p, out, x, w, bias, y, k);
  }
}

}  // namespace cuda
}  // namespace conv2d_ext
