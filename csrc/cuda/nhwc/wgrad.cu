// wgrad over channels_last operands on mma.sync (sm_80+): float32 in TF32
// mode, or float16 / bfloat16 (E) on m16n8k16 MMAs; float32 in IEEE mode on
// FFMA (wgrad_nhwc_ffma_kernel: the short reductions 3xTF32 cannot serve).
//
// Implicit GEMM with the batch's pixels as K (config.h): M = K output
// channels, N = one tap's input channels (a block's N tile never spans
// taps, so its B rows are runs of channels of one input pixel), K = N*P*Q
// pixels in tiles of 32. Both operands arrive pixel-major (grad_output
// rows of K channels, input rows of C channels): 16-byte async copies of
// whole rows, stored [pixel][channel] with rows padded to 8 mod 32 floats,
// so that a fragment's scalar loads (lane (g, t) reads pixel t, channel g)
// hit 32 distinct banks; ldmatrix's transpose moves 16-bit halves and
// cannot transpose TF32. 16-bit rows are padded by 16 bytes, and there
// ldmatrix.trans reads the fragments (rows of pixels give A's and B's k).
// K is split over grid.y slices where the M x N
// tiles leave SMs idle; the slices' partial sums are added in slice order
// (reduce_splits), so the result repeats bitwise.
#include <c10/cuda/CUDAException.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "../../plan.h"
#include "../common.cuh"
#include "../mma.cuh"
#include "../limits.h"
#include "../split_reduce.cuh"
#include "config.h"
#include "nhwc.h"

namespace conv2d_ext {
namespace cuda {
namespace {

namespace cfg = igemm_nhwc;
constexpr int kPixels = cfg::kBlockK;  // pixels of a K tile

template <int BM, int BN, typename E = float>
struct WgradTraits {
  static constexpr int kWarpsM = (BM == 128 && BN == 64) ? 4 : 2, kWarpsN = 8 / kWarpsM;
  static constexpr int kWarpM = BM / kWarpsM, kWarpN = BN / kWarpsN;
  static constexpr int kMT = kWarpM / 16, kNT = kWarpN / 8;
  // Rows padded by 8 elements: floats 8 mod 32 (conflict-free scalar
  // fragment loads), 16-bit rows 16 bytes (conflict-free ldmatrix rows).
  static constexpr int kLdA = BM + 8, kLdB = BN + 8;
  static constexpr int kStageElems = kPixels * (kLdA + kLdB);
  static constexpr int kStages = 3;
  static constexpr int kChunkElems = 16 / int(sizeof(E));
  static constexpr int kAChunks = BM / kChunkElems, kBChunks = BN / kChunkElems;  // of a row
  static constexpr int kARows = kPixels * kAChunks / cfg::kThreads;
  static constexpr int kBRows = kPixels * kBChunks / cfg::kThreads;
  static_assert(kMT >= 1 && kNT >= 1 && kARows >= 1 && kBRows >= 1, "tile too small");
  static_assert(kNT % 2 == 0 || sizeof(E) == 4, "16-bit B fragments load in pairs of n8 tiles");
};

template <int BM, int BN, typename E = float>
constexpr int64_t wgrad_smem_bytes() {
  using T = WgradTraits<BM, BN, E>;
  return int64_t(T::kStages) * T::kStageElems * int64_t(sizeof(E));
}

// A block's place: output channels m0.., tap (r, s), input channels c0..,
// and its slice of the pixels' K tiles.
struct WgradBlock {
  int m0, r, s, c0, kt_begin, kt_end;
};
__device__ __forceinline__ WgradBlock wgrad_block(const ConvParams& p, int bm, int bn,
                                                  int c_tiles, int tiles_per_split,
                                                  int k_tiles) {
  const int m_tiles = static_cast<int>((p.out_channels + bm - 1) / bm);
  const int m_tile = static_cast<int>(blockIdx.x % m_tiles), n_tile = blockIdx.x / m_tiles;
  const int tap = n_tile / c_tiles;
  WgradBlock b;
  b.m0 = m_tile * bm;
  b.r = tap / static_cast<int>(p.kernel_w);
  b.s = tap - b.r * static_cast<int>(p.kernel_w);
  b.c0 = (n_tile - tap * c_tiles) * bn;
  b.kt_begin = blockIdx.y * tiles_per_split;
  b.kt_end = min(k_tiles, b.kt_begin + tiles_per_split);
  return b;
}

// One K tile's copies: grad_output rows (pixel j, channels m0..) and the
// input rows each pixel's tap reads (channels c0..).
template <typename T, typename E>
__device__ __forceinline__ void wgrad_load(E* stage, const ConvParams& p,
                                           const E* __restrict__ go, const E* __restrict__ x,
                                           const WgradBlock& b, int kt) {
  const int64_t pixels = p.gemm_m();
  const int64_t j0 = int64_t(kt) * kPixels;
#pragma unroll
  for (int i = 0; i < T::kARows; ++i) {
    const int e = threadIdx.x + i * cfg::kThreads;
    const int row = e / T::kAChunks, chunk = e % T::kAChunks;
    const int64_t j = j0 + row;
    const int k = b.m0 + T::kChunkElems * chunk;
    const bool live = j < pixels && k < p.out_channels;
    cp_async_16_or_zero(stage + row * T::kLdA + T::kChunkElems * chunk,
                        live ? go + j * p.out_channels + k : go, live);
  }
  E* const sb = stage + kPixels * T::kLdA;
  const int pq = static_cast<int>(p.out_h * p.out_w), Q = static_cast<int>(p.out_w);
  const int H = static_cast<int>(p.in_h), W = static_cast<int>(p.in_w);
#pragma unroll
  for (int i = 0; i < T::kBRows; ++i) {
    const int e = threadIdx.x + i * cfg::kThreads;
    const int row = e / T::kBChunks, chunk = e % T::kBChunks;
    const int64_t j = j0 + row;
    const int c = b.c0 + T::kChunkElems * chunk;
    bool live = j < pixels && c < p.in_channels;
    const int img = live ? static_cast<int>(j / pq) : 0;
    const int rest = live ? static_cast<int>(j - int64_t(img) * pq) : 0;
    const int oh = rest / Q, ow = rest - oh * Q;
    const int ih = oh * static_cast<int>(p.stride_h) - static_cast<int>(p.pad_h) +
                   b.r * static_cast<int>(p.dilation_h);
    const int iw = ow * static_cast<int>(p.stride_w) - static_cast<int>(p.pad_w) +
                   b.s * static_cast<int>(p.dilation_w);
    live = live && ih >= 0 && ih < H && iw >= 0 && iw < W;
    const E* src = live ? x + ((int64_t(img) * H + ih) * W + iw) * p.in_channels + c : x;
    cp_async_16_or_zero(sb + row * T::kLdB + T::kChunkElems * chunk, src, live);
  }
}

__device__ __forceinline__ uint32_t tf32_at(const float* s) { return tf32_operand(*s); }

// The warp's products over one staged K tile: 4 k8 steps; fragments by
// scalar shared loads from the [pixel][channel] rows.
template <typename T>
__device__ __forceinline__ void wgrad_mma_stage(float (&acc)[T::kMT][T::kNT][4],
                                                const float* stage, int warp_m, int warp_n,
                                                int lane) {
  const float* sa = stage;
  const float* sb = stage + kPixels * T::kLdA;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int kk = 0; kk < kPixels / 8; ++kk) {
    const float* a_lo = sa + (kk * 8 + t) * T::kLdA + warp_m * T::kWarpM + g;
    const float* a_hi = a_lo + 4 * T::kLdA;
    const float* b_lo = sb + (kk * 8 + t) * T::kLdB + warp_n * T::kWarpN + g;
    const float* b_hi = b_lo + 4 * T::kLdB;
    uint32_t a[T::kMT][4], b[T::kNT][2];
#pragma unroll
    for (int mt = 0; mt < T::kMT; ++mt) {
      a[mt][0] = tf32_at(a_lo + mt * 16);
      a[mt][1] = tf32_at(a_lo + mt * 16 + 8);
      a[mt][2] = tf32_at(a_hi + mt * 16);
      a[mt][3] = tf32_at(a_hi + mt * 16 + 8);
    }
#pragma unroll
    for (int nt = 0; nt < T::kNT; ++nt) {
      b[nt][0] = tf32_at(b_lo + nt * 8);
      b[nt][1] = tf32_at(b_hi + nt * 8);
    }
#pragma unroll
    for (int mt = 0; mt < T::kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < T::kNT; ++nt) mma_tf32(acc[mt][nt], a[mt], b[nt]);
  }
}

// The same for 16-bit operands: 2 k16 steps, each warp's A (m16 x k16)
// and B (k16 x two n8) fragments by ldmatrix.trans from the [pixel]
// [channel] rows: matrix i of an A load is rows (pixels) 8 (i / 2) on at
// channel offset 8 (i % 2); of a B load pixels 8 (i % 2) on at 8 (i / 2).
template <typename T, typename E>
__device__ __forceinline__ void wgrad_mma_stage_16bit(float (&acc)[T::kMT][T::kNT][4],
                                                      const E* stage, int warp_m, int warp_n,
                                                      int lane) {
  const uint32_t sa = smem_addr(stage), sb = smem_addr(stage + kPixels * T::kLdA);
  const int mat = lane >> 3, row = lane & 7;
  constexpr int kBytes = int(sizeof(E));
#pragma unroll
  for (int kk = 0; kk < kPixels / 16; ++kk) {
    uint32_t a[T::kMT][4], b[T::kNT][2];
#pragma unroll
    for (int mt = 0; mt < T::kMT; ++mt) {
      const int pixel = kk * 16 + row + 8 * (mat >> 1);
      const int m = warp_m * T::kWarpM + mt * 16 + 8 * (mat & 1);
      ldmatrix_x4_trans(a[mt], sa + kBytes * (pixel * T::kLdA + m));
    }
#pragma unroll
    for (int nt = 0; nt < T::kNT; nt += 2) {
      const int pixel = kk * 16 + row + 8 * (mat & 1);
      const int n = warp_n * T::kWarpN + nt * 8 + 8 * (mat >> 1);
      uint32_t r[4];
      ldmatrix_x4_trans(r, sb + kBytes * (pixel * T::kLdB + n));
      b[nt][0] = r[0];
      b[nt][1] = r[1];
      b[nt + 1][0] = r[2];
      b[nt + 1][1] = r[3];
    }
#pragma unroll
    for (int mt = 0; mt < T::kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < T::kNT; ++nt)
        mma_16bit<std::is_same_v<E, __nv_bfloat16>>(acc[mt][nt], a[mt], b[nt]);
  }
}

// The block's sums to its slice of `out`, [slice][K][R][S][C] (a
// channels_last weight's memory per slice).
template <typename T>
__device__ __forceinline__ void wgrad_store(const float (&acc)[T::kMT][T::kNT][4],
                                            const ConvParams& p, const WgradBlock& b,
                                            float* __restrict__ out, int warp_m, int warp_n,
                                            int lane) {
  const int g = lane >> 2, t = lane & 3;
  const int64_t row_len = p.taps() * p.in_channels;  // R*S*C
  float* slice = out + int64_t(blockIdx.y) * p.out_channels * row_len +
                 (int64_t(b.r) * p.kernel_w + b.s) * p.in_channels;
#pragma unroll
  for (int nt = 0; nt < T::kNT; ++nt) {
    const int c = b.c0 + warp_n * T::kWarpN + nt * 8 + 2 * t;
    if (c >= p.in_channels) continue;
#pragma unroll
    for (int mt = 0; mt < T::kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int k = b.m0 + warp_m * T::kWarpM + mt * 16 + g + 8 * h;
        if (k >= p.out_channels) continue;
        *reinterpret_cast<float2*>(slice + int64_t(k) * row_len + c) =
            make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
      }
  }
}

// Block b's K tiles through T::kStages shared-memory stages: the copies of
// later tiles in flight while `consume(stage)` computes on the landed one.
template <typename T, typename E, typename Consume>
__device__ __forceinline__ void wgrad_mainloop(const ConvParams& p, const E* __restrict__ go,
                                               const E* __restrict__ x, const WgradBlock& b,
                                               E* smem, Consume&& consume) {
  const int tiles = b.kt_end - b.kt_begin;
  auto load = [&](int i) {
    if (i < tiles)
      wgrad_load<T>(smem + (i % T::kStages) * T::kStageElems, p, go, x, b, b.kt_begin + i);
    cp_async_commit();  // empty groups too: the wait below counts groups
  };
#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s) load(s);
  for (int i = 0; i < tiles; ++i) {
    cp_async_wait<T::kStages - 2>();
    __syncthreads();  // tile i landed; every warp is done with tile i - 1's stage
    load(i + T::kStages - 1);
    consume(static_cast<const E*>(smem + (i % T::kStages) * T::kStageElems));
  }
}

// Operands of type E; float32 sums in `out`.
template <int BM, int BN, typename E>
__global__ void __launch_bounds__(cfg::kThreads, cfg::kBlocksPerSm)
    wgrad_nhwc_kernel(const ConvParams p, const E* __restrict__ go, const E* __restrict__ x,
                      float* __restrict__ out, int c_tiles, int tiles_per_split, int k_tiles) {
  using T = WgradTraits<BM, BN, E>;
  extern __shared__ float4 smem4[];
  E* smem = reinterpret_cast<E*>(smem4);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int warp_m = warp % T::kWarpsM, warp_n = warp / T::kWarpsM;
  const WgradBlock b = wgrad_block(p, BM, BN, c_tiles, tiles_per_split, k_tiles);
  float acc[T::kMT][T::kNT][4];
  zero_fragments(acc);
  wgrad_mainloop<T>(p, go, x, b, smem, [&](const E* stage) {
    if constexpr (std::is_same_v<E, float>) {
      wgrad_mma_stage<T>(acc, stage, warp_m, warp_n, lane);
    } else {
      wgrad_mma_stage_16bit<T>(acc, stage, warp_m, warp_n, lane);
    }
  });
  wgrad_store<T>(acc, p, b, out, warp_m, warp_n, lane);
}

// IEEE mode's wgrad on FFMA (option nhwc_ieee_wgrad): the short
// reductions that 3xTF32 cannot serve (plan.cpp, short_wgrad), with the
// tensor-core kernel's tiles, copies and slices. The 256 threads are 16 x 16,
// each summing a kTM x kTN block of (output channel, input channel)
// weights: rows tm*4 .. tm*4+3 of every 64-row half of the M tile, columns
// likewise in N, so that a k step's operands are float4 reads of the
// staged [pixel][channel] rows, 16 distinct per warp (broadcast to the
// rest). Products are exact (FFMA). A thread sums its products in runs of
// `run` pixels from zero, each added to its total; slices end there and
// reduce_splits adds them in double. The error of such a two-level sum
// grows like run + (the slice's pixels / run), so the launcher caps a
// slice's K tiles and picks the run from them (ffma_k_split, ffma_run).
template <int BM, int BN>
struct FfmaTraits : WgradTraits<BM, BN, float> {
  static constexpr int kTM = BM / 16, kTN = BN / 16;
  static_assert(kTM % 4 == 0 && kTN % 4 == 0, "float4 groups of rows and columns");
};

// kTM (kTN) consecutive-by-fours operands of one staged row: groups of four
// 64 apart from `at`.
template <int kCount>
__device__ __forceinline__ void load_fours(float (&v)[kCount], const float* at) {
#pragma unroll
  for (int h = 0; h < kCount / 4; ++h) {
    const float4 q = *reinterpret_cast<const float4*>(at + 64 * h);
    v[4 * h] = q.x;
    v[4 * h + 1] = q.y;
    v[4 * h + 2] = q.z;
    v[4 * h + 3] = q.w;
  }
}

template <typename T>
__device__ __forceinline__ void wgrad_ffma_stage(float (&total)[T::kTM][T::kTN],
                                                 const float* stage, int tm, int tn, int run) {
  const float* sa = stage + 4 * tm;
  const float* sb = stage + kPixels * T::kLdA + 4 * tn;
  for (int k0 = 0; k0 < kPixels; k0 += run) {
    float acc[T::kTM][T::kTN];
#pragma unroll
    for (int i = 0; i < T::kTM; ++i)
#pragma unroll
      for (int j = 0; j < T::kTN; ++j) acc[i][j] = 0.f;
#pragma unroll 4
    for (int kk = k0; kk < k0 + run; ++kk) {
      float a[T::kTM], b[T::kTN];
      load_fours(a, sa + kk * T::kLdA);
      load_fours(b, sb + kk * T::kLdB);
#pragma unroll
      for (int i = 0; i < T::kTM; ++i)
#pragma unroll
        for (int j = 0; j < T::kTN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
#pragma unroll
    for (int i = 0; i < T::kTM; ++i)
#pragma unroll
      for (int j = 0; j < T::kTN; ++j) total[i][j] += acc[i][j];
  }
}

// The thread's sums to its slice of `out` (as wgrad_store), four input
// channels a store: C is a multiple of 4 (wgrad_fits) and so is every
// column group's first.
template <typename T>
__device__ __forceinline__ void wgrad_ffma_store(const float (&total)[T::kTM][T::kTN],
                                                 const ConvParams& p, const WgradBlock& b,
                                                 float* __restrict__ out, int tm, int tn) {
  const int64_t row_len = p.taps() * p.in_channels;  // R*S*C
  float* slice = out + int64_t(blockIdx.y) * p.out_channels * row_len +
                 (int64_t(b.r) * p.kernel_w + b.s) * p.in_channels;
#pragma unroll
  for (int i = 0; i < T::kTM; ++i) {
    const int k = b.m0 + 64 * (i / 4) + 4 * tm + i % 4;
    if (k >= p.out_channels) continue;
#pragma unroll
    for (int h = 0; h < T::kTN / 4; ++h) {
      const int c = b.c0 + 64 * h + 4 * tn;
      if (c >= p.in_channels) continue;
      *reinterpret_cast<float4*>(slice + int64_t(k) * row_len + c) =
          make_float4(total[i][4 * h], total[i][4 * h + 1], total[i][4 * h + 2],
                      total[i][4 * h + 3]);
    }
  }
}

template <int BM, int BN>
__global__ void __launch_bounds__(cfg::kThreads, 1)
    wgrad_nhwc_ffma_kernel(const ConvParams p, const float* __restrict__ go,
                           const float* __restrict__ x, float* __restrict__ out, int c_tiles,
                           int tiles_per_split, int k_tiles, int run) {
  using T = FfmaTraits<BM, BN>;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int tm = threadIdx.x % 16, tn = threadIdx.x / 16;
  const WgradBlock b = wgrad_block(p, BM, BN, c_tiles, tiles_per_split, k_tiles);
  float total[T::kTM][T::kTN];
#pragma unroll
  for (int i = 0; i < T::kTM; ++i)
#pragma unroll
    for (int j = 0; j < T::kTN; ++j) total[i][j] = 0.f;
  wgrad_mainloop<T>(p, go, x, b, smem,
                    [&](const float* stage) { wgrad_ffma_stage<T>(total, stage, tm, tn, run); });
  wgrad_ffma_store<T>(total, p, b, out, tm, tn);
}

// The FFMA wgrad's K split. Slices of at most kFfmaMaxSliceTiles K tiles
// keep the float32 sums short (reduce_splits adds the slices in double);
// beyond that, the count of slices whose time is least: waves of blocks
// (one a SM; a partial last wave costs a whole one) times a slice's tiles,
// plus the partial sums written and read back, where a K tile step of a
// block takes about as long as kPartialFloatsPerStep floats of them. More
// slices than the cap needs stop at kFfmaMaxPartials floats of partial
// sums; the cap itself does not (at most eight slices' worth: short
// reductions have fewer than 8192 pixels).
constexpr int64_t kFfmaMaxSliceTiles = 32;
constexpr int64_t kFfmaMaxPartials = int64_t(1) << 25;
constexpr double kPartialFloatsPerStep = double(1 << 21);
inline KSplit ffma_k_split(int64_t tiles, int64_t k_tiles, int64_t numel) {
  const KSplit wave = one_wave_k_split(tiles, k_tiles, 1);
  const int64_t slots = device_properties()->multiProcessorCount;
  const int64_t first = std::max(wave.splits, ceil_div(k_tiles, kFfmaMaxSliceTiles));
  const int64_t last =
      std::min({first + 64, k_tiles, std::max(first, kFfmaMaxPartials / numel), kMaxGridYZ});
  KSplit best = wave;
  double best_cost = -1;
  for (int64_t s = first; s <= last; ++s) {
    KSplit k;
    k.tiles_per_split = ceil_div(k_tiles, s);
    k.splits = ceil_div(k_tiles, k.tiles_per_split);
    const double steps = double(ceil_div(tiles * k.splits, slots) * k.tiles_per_split);
    const double cost = steps + (k.splits > 1 ? k.splits * numel / kPartialFloatsPerStep : 0.0);
    if (best_cost < 0 || cost < best_cost) best = k, best_cost = cost;
  }
  return best;
}
// A thread's run of pixels summed from zero: with t K tiles of kPixels in
// its slice, the float32 error grows like run + t * kPixels / run, least
// near run = sqrt(t * kPixels): 8 for at most three tiles, then 16, and a
// whole tile from sixteen.
inline int ffma_run(int64_t tiles_per_split) {
  return tiles_per_split <= 3 ? 8 : tiles_per_split < 16 ? 16 : kPixels;
}

// grad_w (float32, or 16-bit: then the sums land in a float32 copy of its
// layout and are rounded once into it).
template <int BM, int BN, typename E, bool kFfma = false>
void launch_wgrad(const ConvParams& p, const E* go, const E* x, at::TensorBase& grad_w) {
  const int64_t m_tiles = ceil_div(p.out_channels, BM);
  const int64_t c_tiles = ceil_div(p.in_channels, BN);
  const int64_t tiles = m_tiles * p.taps() * c_tiles;
  const int64_t k_tiles = ceil_div(p.gemm_m(), kPixels);
  TORCH_CHECK(tiles < (int64_t(1) << 31) && k_tiles < (int64_t(1) << 31),
              "conv2d_ext: problem too large for the channels_last wgrad");
  const int64_t numel = p.weight_numel();
  const KSplit k = kFfma ? ffma_k_split(tiles, k_tiles, numel)
                         : one_wave_k_split(tiles, k_tiles, cfg::kBlocksPerSm);
  const at::TensorOptions f32 = grad_w.options().dtype(at::kFloat);
  // (grad_w's strides: channels_last, as the entry checked; poisoned as
  // outputs are, where the option asks.)
  at::TensorBase sums = grad_w.scalar_type() == at::kFloat
                        ? grad_w
                        : empty_output(grad_w.sizes(), f32, at::MemoryFormat::ChannelsLast);
  // One slice writes the sums itself; more write partial sums, added after.
  at::TensorBase partial = k.splits > 1 ? scratch({k.splits * numel}, at::kFloat) : sums;
  const size_t smem = static_cast<size_t>(wgrad_smem_bytes<BM, BN, E>());
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(k.splits));
  const auto stream = current_stream();
  const int ct = static_cast<int>(c_tiles), tps = static_cast<int>(k.tiles_per_split),
            kt = static_cast<int>(k_tiles);
  if constexpr (kFfma) {
    ensure_dynamic_smem(wgrad_nhwc_ffma_kernel<BM, BN>, smem);
    wgrad_nhwc_ffma_kernel<BM, BN><<<grid, cfg::kThreads, smem, stream>>>(
        p, go, x, partial.data_ptr<float>(), ct, tps, kt, ffma_run(k.tiles_per_split));
  } else {
    ensure_dynamic_smem(wgrad_nhwc_kernel<BM, BN, E>, smem);
    wgrad_nhwc_kernel<BM, BN, E><<<grid, cfg::kThreads, smem, stream>>>(
        p, go, x, partial.data_ptr<float>(), ct, tps, kt);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (k.splits > 1) reduce_splits<float>(partial, sums, numel, static_cast<int>(k.splits));
  if (!sums.is_same(grad_w)) copy_into(grad_w, sums);
}

template <typename E, bool kFfma = false>
void launch_wgrad_tiles(const ConvParams& p, const E* go, const E* x, at::TensorBase& grad_w) {
  const bool wide_m = p.out_channels >= 128, wide_n = p.in_channels >= 128;
  // 128 x 128 tiles need more shared memory than sm_86/89/120 give a block.
  const bool fits_128 = wgrad_smem_bytes<128, 128, E>() <= max_block_smem_bytes(current_sm());
  if (wide_m && wide_n && fits_128) {
    launch_wgrad<128, 128, E, kFfma>(p, go, x, grad_w);
  } else if (wide_m) {
    launch_wgrad<128, 64, E, kFfma>(p, go, x, grad_w);
  } else if (wide_n) {
    launch_wgrad<64, 128, E, kFfma>(p, go, x, grad_w);
  } else {
    launch_wgrad<64, 64, E, kFfma>(p, go, x, grad_w);
  }
}

}  // namespace

void launch_wgrad_nhwc(const ConvParams& p, const at::TensorBase& grad_out, const at::TensorBase& x,
                       at::TensorBase& grad_w) {
  constexpr auto kCl = at::MemoryFormat::ChannelsLast;
  const at::ScalarType t = grad_out.scalar_type();
  TORCH_CHECK((t == at::kFloat || is_16bit(t)) && x.scalar_type() == t &&
                  grad_w.scalar_type() == t &&
                  cfg::wgrad_fits(p, static_cast<int>(grad_out.element_size())) &&
                  grad_out.is_contiguous(kCl) && x.is_contiguous(kCl) &&
                  grad_w.is_contiguous(kCl),
              "conv2d_ext: internal error: the channels_last wgrad got operands it does not "
              "take");
  const at::TensorBase goa = aligned_16(grad_out, kCl), xa = aligned_16(x, kCl);
  auto run = [&](auto* type) {
    using E = std::remove_pointer_t<decltype(type)>;
    launch_wgrad_tiles<E>(p, reinterpret_cast<const E*>(goa.data_ptr()),
                          reinterpret_cast<const E*>(xa.data_ptr()), grad_w);
  };
  if (t == at::kHalf) {
    run(static_cast<__half*>(nullptr));
  } else if (t == at::kBFloat16) {
    run(static_cast<__nv_bfloat16*>(nullptr));
  } else if (math_mode(t) == MathMode::kIEEE) {  // never TF32 products in IEEE mode
    launch_wgrad_tiles<float, /*kFfma=*/true>(p, goa.data_ptr<float>(), xa.data_ptr<float>(),
                                              grad_w);
  } else {
    run(static_cast<float*>(nullptr));
  }
}

}  // namespace cuda
}  // namespace conv2d_ext
