// fprop over channels_last activations on mma.sync (sm_80+), TF32 mode.
//
// Implicit GEMM over the whole batch (config.h): a block owns an M x N
// tile of (pixels of any images) x (output channels) and walks K one tap's
// 32 channels at a time, so a 7x7 plane fills tiles as well as a 224x224
// one. Both operands are K-major in memory (NHWC input rows of C channels,
// KRSC weight rows), so a K tile is a 16-byte-chunk gather per row: one
// 16-byte async copy per 4 channels, zeros where the tap falls in the
// padding or past C. Rows are stored 128 bytes wide with 16-byte chunk c
// of row r at c ^ (r % 8) (the 128-byte swizzle): the copies of a row and
// ldmatrix's reads of 8 rows at one chunk both hit 8 distinct bank groups.
// cfg::stages() K tiles are in flight; one barrier per K tile.
#include <c10/cuda/CUDAException.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "../../options.h"
#include "../../plan.h"
#include "../common.cuh"
#include "../mma.cuh"
#include "config.h"
#include "gather.cuh"
#include "nhwc.h"

namespace conv2d_ext {
namespace cuda {
namespace {

namespace cfg = igemm_nhwc;
using nhwc::ARows;
using nhwc::k_tile;
using nhwc::kChunks;
using nhwc::load_stage;
using nhwc::swizzled;

// A BM x BN tile over kWarpsM x kWarpsN warps, each kMT m16 by kNT n8
// mma tiles.
template <int BM, int BN, int kWarpsM_>
struct Traits {
  static constexpr int kWarpsM = kWarpsM_, kWarpsN = 8 / kWarpsM_;
  static constexpr int kWarpM = BM / kWarpsM, kWarpN = BN / kWarpsN;
  static constexpr int kMT = kWarpM / 16, kNT = kWarpN / 8;
  static constexpr int kARows = BM * kChunks / cfg::kThreads;  // rows a thread copies
  static constexpr int kBRows = BN * kChunks / cfg::kThreads;
  static constexpr int kStageFloats = (BM + BN) * cfg::kBlockK;
  static constexpr int kStages = cfg::stages(BM, BN);
  static_assert(kNT % 2 == 0, "B fragments load in pairs of n8 tiles");
  static_assert(kARows >= 1 && kBRows >= 1, "every thread copies a row of each");
};

// A fragment register as the tensor cores read it: rounded to TF32.
__device__ __forceinline__ void round_tf32(uint32_t& r) { r = tf32_operand(__uint_as_float(r)); }

// The warp's products over one staged K tile: 4 k8 steps of kMT x kNT
// m16n8k8 tiles, fragments by ldmatrix (rows 0-7 / 8-15 x the step's two
// 4-channel halves).
template <typename T, int BM>
__device__ __forceinline__ void mma_stage(float (&acc)[T::kMT][T::kNT][4], const float* stage,
                                          int warp_m, int warp_n, int lane) {
  const uint32_t sa = smem_addr(stage), sb = smem_addr(stage + BM * cfg::kBlockK);
  const int quad = lane >> 3, lrow = lane & 7;
#pragma unroll
  for (int kk = 0; kk < cfg::kBlockK / 8; ++kk) {
    uint32_t a[T::kMT][4], b[T::kNT][2];
#pragma unroll
    for (int mt = 0; mt < T::kMT; ++mt) {
      const int row = warp_m * T::kWarpM + mt * 16 + lrow + ((quad & 1) << 3);
      ldmatrix_x4(a[mt], sa + 4 * swizzled(row, 2 * kk + (quad >> 1)));
#pragma unroll
      for (int i = 0; i < 4; ++i) round_tf32(a[mt][i]);
    }
#pragma unroll
    for (int nt = 0; nt < T::kNT; nt += 2) {
      const int row = warp_n * T::kWarpN + nt * 8 + lrow + ((quad >> 1) << 3);
      uint32_t r[4];
      ldmatrix_x4(r, sb + 4 * swizzled(row, 2 * kk + (quad & 1)));
#pragma unroll
      for (int i = 0; i < 4; ++i) round_tf32(r[i]);
      b[nt][0] = r[0];
      b[nt][1] = r[1];
      b[nt + 1][0] = r[2];
      b[nt + 1][1] = r[3];
    }
#pragma unroll
    for (int mt = 0; mt < T::kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < T::kNT; ++nt) mma_tf32(acc[mt][nt], a[mt], b[nt]);
  }
}

// The accumulators (+ bias) to y, [pixel][output channel]: each fragment's
// two column pairs as 8-byte stores.
template <typename T>
__device__ __forceinline__ void store_tile(const float (&acc)[T::kMT][T::kNT][4],
                                           const ConvParams& p, const cfg::OutMap& out,
                                           const float* __restrict__ bias,
                                           float* __restrict__ y, int m0, int n0, int warp_m,
                                           int warp_n, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const int64_t M = p.gemm_m(), N = p.out_channels;
#pragma unroll
  for (int mt = 0; mt < T::kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = int64_t(m0) + warp_m * T::kWarpM + mt * 16 + g + 8 * h;
      if (m >= M) continue;
      float* const row = y + nhwc::out_offset(out, p, m);
#pragma unroll
      for (int nt = 0; nt < T::kNT; ++nt) {
        const int n = n0 + warp_n * T::kWarpN + nt * 8 + 2 * t;
        if (n >= N) continue;
        const float b0 = bias ? bias[n] : 0.f, b1 = bias ? bias[n + 1] : 0.f;
        *reinterpret_cast<float2*>(row + n) =
            make_float2(acc[mt][nt][2 * h] + b0, acc[mt][nt][2 * h + 1] + b1);
      }
    }
}

template <int BM, int BN, int kWarpsM>
__global__ void __launch_bounds__(cfg::kThreads, cfg::kBlocksPerSm)
    fprop_nhwc_kernel(const ConvParams p, const cfg::OutMap out, const float* __restrict__ x,
                      const float* __restrict__ w, const float* __restrict__ bias,
                      float* __restrict__ y, int n_tiles, int c_tiles, int k_tiles) {
  using T = Traits<BM, BN, kWarpsM>;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int warp_m = warp % T::kWarpsM, warp_n = warp / T::kWarpsM;
  // Output-channel tiles vary fastest: neighbouring blocks share their
  // pixels' input rows, read while they are still in L2.
  const int m0 = static_cast<int>(blockIdx.x / n_tiles) * BM;
  const int n0 = static_cast<int>(blockIdx.x % n_tiles) * BN;
  const int row0 = threadIdx.x / kChunks, chunk = threadIdx.x % kChunks;
  const ARows<T> a(p, m0, row0);
  auto load = [&](int kt) {
    if (kt < k_tiles)
      load_stage<T, BM, BN>(smem + (kt % T::kStages) * T::kStageFloats, p, a, x, w, n0,
                            k_tile(p, c_tiles, kt), row0, chunk);
    cp_async_commit();  // empty groups too: the wait below counts groups
  };

  float acc[T::kMT][T::kNT][4];
  zero_fragments(acc);
#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s) load(s);
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<T::kStages - 2>();
    // Tile kt has landed for every thread, and every warp is done with the
    // stage the next copy overwrites (tile kt - 1's).
    __syncthreads();
    load(kt + T::kStages - 1);
    mma_stage<T, BM>(acc, smem + (kt % T::kStages) * T::kStageFloats, warp_m, warp_n, lane);
  }
  store_tile<T>(acc, p, out, bias, y, m0, n0, warp_m, warp_n, lane);
}

template <int BM, int BN, int kWarpsM>
void launch(const ConvParams& p, const cfg::OutMap& out, const float* x, const float* w,
            const float* bias, float* y) {
  const NhwcGrid g = nhwc_fprop_grid(p, {BM, BN});
  auto kernel = fprop_nhwc_kernel<BM, BN, kWarpsM>;
  const size_t smem = static_cast<size_t>(cfg::smem_bytes({BM, BN}));
  ensure_dynamic_smem(kernel, smem);
  kernel<<<static_cast<unsigned>(g.m_tiles * g.n_tiles), cfg::kThreads, smem,
           current_stream()>>>(p, out, x, w, bias, y,
                                               static_cast<int>(g.n_tiles),
                                               static_cast<int>(g.c_tiles),
                                               static_cast<int>(g.k_tiles));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void launch_fprop_nhwc(const ConvParams& p, const at::TensorBase& x, const at::TensorBase& w_nrsc,
                       const at::TensorBase& bias, at::TensorBase& y) {
  launch_fprop_nhwc(p, cfg::dense_out(p), x, w_nrsc, bias, y);
}

namespace {

// 16-bit operands, as CUDA's types, on the wgmma forward (the plan takes
// them to the engine only on Hopper).
template <typename E>
void launch_16bit(const ConvParams& p, const cfg::OutMap& out, const at::TensorBase& x,
                  const at::TensorBase& w, const at::TensorBase& bias, at::TensorBase& y) {
  const int sm = current_sm();
  TORCH_CHECK(nhwc_wgmma(sm), "conv2d_ext: internal error: 16-bit operands reached the "
              "channels_last engine without its wgmma forward");
  cfg::FpropKernel k =
      cfg::choose_fprop(p, device_properties()->multiProcessorCount,
                        /*hopper=*/true, nhwc_split_k(sm), nhwc_wide_tiles(sm), /*elem_bytes=*/2);
  k.pipelined = option(Option::kNhwcWgmmaPipelined);
  auto ptr = [](const at::TensorBase& t) { return reinterpret_cast<const E*>(t.data_ptr()); };
  launch_fprop_nhwc_wgmma<E>(p, out, ptr(x), ptr(w), bias.defined() ? ptr(bias) : nullptr,
                             reinterpret_cast<E*>(y.data_ptr()), k);
}

}  // namespace

void launch_fprop_nhwc(const ConvParams& p, const cfg::OutMap& out, const at::TensorBase& x,
                       const at::TensorBase& w_nrsc, const at::TensorBase& bias,
                       at::TensorBase& y) {
  const at::ScalarType t = x.scalar_type();
  const int elem_bytes = static_cast<int>(x.element_size());
  TORCH_CHECK((t == at::kFloat || is_16bit(t)) && w_nrsc.scalar_type() == t &&
                  y.scalar_type() == t && (!bias.defined() || bias.scalar_type() == t) &&
                  cfg::fits(p, elem_bytes) && x.is_contiguous(at::MemoryFormat::ChannelsLast) &&
                  y.is_contiguous(at::MemoryFormat::ChannelsLast) && w_nrsc.is_contiguous() &&
                  y.size(1) == p.out_channels,
              "conv2d_ext: internal error: the channels_last engine got operands it does not "
              "take");
  const at::TensorBase xa = aligned_16(x, at::MemoryFormat::ChannelsLast);
  const at::TensorBase wa = aligned_16(w_nrsc, at::MemoryFormat::Contiguous);
  if (t == at::kHalf) {
    launch_16bit<__half>(p, out, xa, wa, bias, y);
    return;
  }
  if (t == at::kBFloat16) {
    launch_16bit<__nv_bfloat16>(p, out, xa, wa, bias, y);
    return;
  }
  const float* xp = xa.data_ptr<float>();
  const float* wp = wa.data_ptr<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const int sm = current_sm();
  // IEEE mode reaches the engine only through the plan's nhwc_tf32x3.
  const bool tf32x3 = math_mode(at::kFloat) == MathMode::kIEEE;
  TORCH_CHECK(!tf32x3 || nhwc_tf32x3(sm), "conv2d_ext: internal error: an IEEE-mode forward "
              "reached the channels_last engine without its 3xTF32 kernel");
  cfg::FpropKernel k =
      cfg::choose_fprop(p, device_properties()->multiProcessorCount, nhwc_wgmma(sm),
                        nhwc_split_k(sm), nhwc_wide_tiles(sm), /*elem_bytes=*/4, tf32x3);
  k.round = !option(Option::kNhwcTf32Truncate);
  k.tf32x3 = tf32x3;
  k.pipelined = option(Option::kNhwcWgmmaPipelined);
  k.half_parts = option(Option::kNhwcIeeeHalfParts);
  TORCH_CHECK(!tf32x3 || k.wgmma, "conv2d_ext: internal error: 3xTF32 off wgmma");
  const cfg::Tile tile = k.tile;
  if (k.wgmma) {
    launch_fprop_nhwc_wgmma<float>(p, out, xp, wp, bp, yp, k);
  } else if (tile.m == 128 && tile.n == 128) {
    launch<128, 128, 2>(p, out, xp, wp, bp, yp);
  } else if (tile.m == 128) {
    launch<128, 64, 4>(p, out, xp, wp, bp, yp);
  } else {
    launch<64, 64, 2>(p, out, xp, wp, bp, yp);
  }
}

}  // namespace cuda
}  // namespace conv2d_ext
