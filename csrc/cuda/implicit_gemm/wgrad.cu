// Backward-weight pass (wgrad) on tensor cores: implicit GEMM with mma.sync
// TF32, split over K and reduced in a fixed order.
//
// GEMM view per group: M = Cout/groups, N = Cin/groups*KH*KW, K = N*Ho*Wo
// (every output pixel). K dwarfs M and N, so a block owns a 64-channel M
// tile and a set of N units (an n8 fragment: 8 input channels at one tap)
// for one slice of K, and its partial sums land in a workspace that
// split_reduce.cuh sums in slice order: no atomics, bitwise reproducible.
//
// A K tile is 4 output rows x 32 columns of one image. Its grad_output (A,
// 64 channels x 128 pixels) and the input halo those pixels reach (B) are
// staged in shared memory together, double-buffered with cp.async. A
// fragment is the same for every unit, so a warp loads it once per k8 step
// and feeds it to the 4 m16 MMAs of each of its units; a unit's B fragment
// is the halo read at the unit's tap offset. Tap offsets are arbitrary
// shifts, which 4-byte shared loads take and wgmma's 16-byte-aligned
// descriptors would not: this loop is mma.sync on every GPU for now.
//
// The taps are N units rather than compile-time loops, so one
// instantiation per precision serves every kernel size.
//
// The tensor cores' accumulation truncates, so in 3xTF32 mode (which must
// be FP32-accurate) the accumulators are added to FP32 sums in shared
// memory and restarted after every output row of a tile (config.h,
// Layout::sum_floats). The sums in turn are stored and restarted every few
// K tiles (sum_chunking), each chunk into a workspace slot of its own, so
// that no FP32 chain runs the length of a slice; the slots are summed in
// double in a fixed order, like the slices.
//
// Pixels past the output's right edge have zero grad_output, but the halo
// they read may hold Inf or NaN that no real product meets: their B values
// are zeroed too (0 * Inf would be NaN).

#include "../common.cuh"
#include "../mma.cuh"
#include "../split_reduce.cuh"
#include "config.h"
#include "implicit_gemm.h"

namespace conv2d_ext {
namespace cuda {
namespace {

namespace cfg = igemm_wgrad;

// Position of one element of a block's halo copy, [channel][row][column],
// stepped by a fixed element count without divisions.
struct HaloCursor {
  int ci, row, col;
  __device__ __forceinline__ void advance(int dci, int drow, int dcol, int rows, int cols) {
    col += dcol;
    row += drow;
    if (col >= cols) {
      col -= cols;
      ++row;
    }
    ci += dci;
    if (row >= rows) {
      row -= rows;
      ++ci;
    }
  }
};

template <MathMode kMath>
__global__ void __launch_bounds__(cfg::kThreads, 1)
    wgrad_igemm_kernel(const ConvParams p, const float* __restrict__ go,
                       const float* __restrict__ x, float* __restrict__ partial,
                       const cfg::Layout L, int64_t tiles_per_split, int64_t tiles_per_chunk,
                       int chunks) {
  extern __shared__ __align__(16) float smem[];
  const int H = p.in_h, W = p.in_w, Ho = p.out_h, Wo = p.out_w;
  const int KW = p.kernel_w, taps = p.kernel_h * p.kernel_w;
  const int cin_g = p.in_channels_per_group(), cout_g = p.out_channels_per_group();
  const int sh = p.stride_h, sw = p.stride_w;

  int bx = blockIdx.x;
  const int tap_group = bx % L.tap_groups;
  bx /= L.tap_groups;
  const int chunk = bx % L.ci_chunks;
  bx /= L.ci_chunks;
  const int co_tile = bx % L.co_tiles;
  const int g = bx / L.co_tiles;
  const int co0 = co_tile * cfg::kCo, ci0 = chunk * L.ci_groups * 8;
  const int64_t kt_begin = blockIdx.y * tiles_per_split;
  const int64_t kt_end = std::min<int64_t>(L.k_tiles, kt_begin + tiles_per_split);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gq = lane >> 2, tq = lane & 3;

  // The warp's units: shared-memory offset of the B fragment row this lane
  // reads (channel gq of the unit's group, at the unit's tap), or -1.
  int b_off[cfg::kUnitsPerWarp];
  int unit_tap[cfg::kUnitsPerWarp], unit_ci[cfg::kUnitsPerWarp];
#pragma unroll
  for (int j = 0; j < cfg::kUnitsPerWarp; ++j) {
    const int u = warp + cfg::kWarps * j;
    const int tap = tap_group * L.taps + u % L.taps;
    const bool ok = u < L.units && tap < taps;
    const int kh = tap / KW, kw = tap % KW;
    unit_tap[j] = tap;
    unit_ci[j] = (u / L.taps) * 8;
    b_off[j] = ok ? (unit_ci[j] + gq) * L.plane + kh * p.dilation_h * L.halo_cols +
                        kw * p.dilation_w
                  : -1;
  }

  float acc[cfg::kUnitsPerWarp][4][4];
  zero_fragments(acc);

  // 3xTF32: this thread's FP32 sums (Layout::sum_floats), a float4 per
  // m16 fragment of each unit, [unit][fragment][lane] so that a warp's
  // 16-byte accesses take the minimum of shared-memory wavefronts.
  constexpr bool kSums = kMath == MathMode::kIEEE;
  float4* sums = reinterpret_cast<float4*>(smem + 2 * L.stage_floats) +
                 warp * L.units_per_warp * 4 * 32 + lane;
  // Adds the accumulators to the sums and restarts them: after every
  // output row of a tile, so that a chain of MMA accumulations is 4 k8
  // steps (12 MMAs) long.
  auto flush = [&] {
#pragma unroll
    for (int j = 0; j < cfg::kUnitsPerWarp; ++j) {
      if (b_off[j] < 0) continue;
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        float4 v = sums[(j * 4 + f) * 32];
        v.x += acc[j][f][0];
        v.y += acc[j][f][1];
        v.z += acc[j][f][2];
        v.w += acc[j][f][3];
        sums[(j * 4 + f) * 32] = v;
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][f][e] = 0.f;
      }
    }
  };

  // Copy assignments, fixed for every tile: grad_output pixel px of rows
  // co = co_first + 2i; halo elements from `first` on, kThreads apart.
  static_assert(cfg::kThreads % cfg::kPixels == 0, "whole pixel rows per copy step");
  constexpr int kCoStep = cfg::kThreads / cfg::kPixels;
  const int px = threadIdx.x % cfg::kPixels, co_first = threadIdx.x / cfg::kPixels;
  const int halo_area = L.halo_rows * L.halo_cols;
  const int halo_total = L.ci_groups * 8 * halo_area;
  HaloCursor first;
  first.ci = threadIdx.x / halo_area;
  first.row = (threadIdx.x % halo_area) / L.halo_cols;
  first.col = threadIdx.x % L.halo_cols;
  const int dci = cfg::kThreads / halo_area;
  const int drow = (cfg::kThreads % halo_area) / L.halo_cols;
  const int dcol = cfg::kThreads % L.halo_cols;
  const int tiles_hw = L.tiles_h * L.tiles_w;

  auto load_tile = [&](int64_t kt, int stage) {
    float* gs = smem + stage * L.stage_floats;
    float* xs = gs + cfg::kCo * cfg::kGoPitch;
    const int n = static_cast<int>(kt / tiles_hw);
    const int t = static_cast<int>(kt % tiles_hw);
    const int oh0 = (t / L.tiles_w) * cfg::kRows, ow0 = (t % L.tiles_w) * cfg::kCols;
    {
      const int oh = oh0 + px / cfg::kCols, ow = ow0 + px % cfg::kCols;
      const bool pixel_ok = oh < Ho && ow < Wo;
      const float* src = go + plane_offset(n, p.out_channels, g * cout_g + co0 + co_first, Ho * Wo) +
                         (pixel_ok ? oh * Wo + ow : 0);
#pragma unroll 4
      for (int co = co_first; co < cfg::kCo; co += kCoStep) {
        cp_async_4(gs + co * cfg::kGoPitch + px, src, pixel_ok && co0 + co < cout_g);
        src += int64_t(kCoStep) * Ho * Wo;
      }
    }
    const int ih0 = oh0 * sh - static_cast<int>(p.pad_h);
    const int iw0 = ow0 * sw - static_cast<int>(p.pad_w);
    const float* x_group = x + plane_offset(n, p.in_channels, g * cin_g + ci0, H * W);
    HaloCursor c = first;
    for (int e = threadIdx.x; e < halo_total; e += cfg::kThreads) {
      const int ih = ih0 + c.row, iw = iw0 + c.col;
      const bool ok = ci0 + c.ci < cin_g && ih >= 0 && ih < H && iw >= 0 && iw < W;
      const float* src = ok ? x_group + int64_t(c.ci) * H * W + ih * W + iw : x;
      cp_async_4(xs + c.ci * L.plane + c.row * L.halo_cols + c.col, src, ok);
      c.advance(dci, drow, dcol, L.halo_rows, L.halo_cols);
    }
    cp_async_commit();
  };

  // One K tile: every k8 step (8 pixels of one row) of rows inside the
  // output. `kMask`: the tile crosses the right edge.
  auto compute_tile = [&](int64_t kt, int stage, auto mask_tag) {
    constexpr bool kMask = decltype(mask_tag)::value;
    const float* gs = smem + stage * L.stage_floats;
    const float* xs = gs + cfg::kCo * cfg::kGoPitch;
    const int t = static_cast<int>(kt % tiles_hw);
    const int oh0 = (t / L.tiles_w) * cfg::kRows, ow0 = (t % L.tiles_w) * cfg::kCols;
    const int rows = Ho - oh0 < cfg::kRows ? Ho - oh0 : cfg::kRows;
    for (int r = 0; r < rows; ++r) {
#pragma unroll
      for (int c0 = 0; c0 < cfg::kCols; c0 += 8) {
        const int p0 = r * cfg::kCols + c0;
        uint32_t a_big[4][4], a_small[4][4];
#pragma unroll
        for (int f = 0; f < 4; ++f) {
          const float* a_src = gs + (f * 16 + gq) * cfg::kGoPitch + p0 + tq;
          const float v[4] = {a_src[0], a_src[8 * cfg::kGoPitch], a_src[4],
                              a_src[8 * cfg::kGoPitch + 4]};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (kMath == MathMode::kTF32) {
              a_big[f][e] = tf32_operand(v[e]);
            } else {
              tf32_split</*kRoundBig=*/true>(v[e], a_big[f][e], a_small[f][e]);
            }
          }
        }
        const int x_row = r * sh * L.halo_cols + (c0 + tq) * sw;
        const bool keep0 = !kMask || ow0 + c0 + tq < Wo;
        const bool keep1 = !kMask || ow0 + c0 + tq + 4 < Wo;
#pragma unroll
        for (int j = 0; j < cfg::kUnitsPerWarp; ++j) {
          if (b_off[j] < 0) continue;  // warp-uniform
          const float* b_src = xs + b_off[j] + x_row;
          const float v0 = keep0 ? b_src[0] : 0.f;
          const float v1 = keep1 ? b_src[4 * sw] : 0.f;
          if (kMath == MathMode::kTF32) {
            const uint32_t b[2] = {tf32_operand(v0), tf32_operand(v1)};
#pragma unroll
            for (int f = 0; f < 4; ++f) mma_tf32(acc[j][f], a_big[f], b);
          } else {
            uint32_t b_big[2], b_small[2];
            tf32_split</*kRoundBig=*/true>(v0, b_big[0], b_small[0]);
            tf32_split</*kRoundBig=*/true>(v1, b_big[1], b_small[1]);
            // Small products first, then big * big (see mma.cuh).
#pragma unroll
            for (int f = 0; f < 4; ++f) {
              mma_tf32(acc[j][f], a_small[f], b_big);
              mma_tf32(acc[j][f], a_big[f], b_small);
              mma_tf32(acc[j][f], a_big[f], b_big);
            }
          }
        }
      }
      if (kSums) flush();
    }
  };

  // Accumulator (j, f, e) holds output channel f*16 + gq (+8 for e >= 2)
  // and input channel 2*tq + (e & 1) of unit j's group, at its tap.
  auto weight_index = [&](int f, int e, int tap, int ci_unit) -> int64_t {
    const int co = co0 + f * 16 + gq + 8 * (e >> 1);
    const int ci = ci0 + ci_unit + 2 * tq + (e & 1);
    if (co >= cout_g || ci >= cin_g) return -1;
    return ((int64_t(g) * cout_g + co) * cin_g + ci) * taps + tap;
  };
  // 3xTF32: the sums to workspace slot `slot`. Called every few K tiles,
  // so its loops stay rolled and recompute each unit's place: unrolled,
  // the compiler hoisted 96 addresses out of the K loop and spilled.
  auto store_sums = [&](int slot) {
    float* out = partial + int64_t(slot) * p.weight_numel();
#pragma unroll 1
    for (int j = 0; j < L.units_per_warp; ++j) {
      const int u = warp + cfg::kWarps * j;
      const int tap = tap_group * L.taps + u % L.taps;
      if (u >= L.units || tap >= taps) continue;
#pragma unroll 1
      for (int f = 0; f < 4; ++f) {
        const float4 v = sums[(j * 4 + f) * 32];
        const float vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t i = weight_index(f, e, tap, (u / L.taps) * 8);
          if (i >= 0) out[i] = vs[e];
        }
      }
    }
  };
  auto clear_sums = [&] {
    for (int i = 0; i < L.units_per_warp * 4; ++i) sums[i * 32] = make_float4(0.f, 0.f, 0.f, 0.f);
  };

  if (kSums) clear_sums();
  if (kt_begin < kt_end) load_tile(kt_begin, 0);
  int stored = 0;  // 3xTF32: chunks of this slice stored so far
  for (int64_t kt = kt_begin; kt < kt_end; ++kt) {
    const int stage = static_cast<int>((kt - kt_begin) & 1);
    if (kt + 1 < kt_end) {
      load_tile(kt + 1, stage ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int ow0 = static_cast<int>(kt % tiles_hw % L.tiles_w) * cfg::kCols;
    if (ow0 + cfg::kCols <= Wo) {
      compute_tile(kt, stage, std::false_type{});
    } else {
      compute_tile(kt, stage, std::true_type{});
    }
    __syncthreads();
    // Each thread owns its sums, so no barrier around their store.
    if (kSums && ((kt - kt_begin + 1) % tiles_per_chunk == 0 || kt + 1 == kt_end)) {
      store_sums(blockIdx.y * chunks + stored++);
      clear_sums();
    }
  }
  if (kSums) {
    // A short last slice leaves chunk slots unused: zeros, which the fixed-
    // order reduction adds like any other slot.
    while (stored < chunks) store_sums(blockIdx.y * chunks + stored++);
    return;
  }
  float* out = partial + blockIdx.y * p.weight_numel();
#pragma unroll
  for (int j = 0; j < cfg::kUnitsPerWarp; ++j) {
    if (b_off[j] < 0) continue;
#pragma unroll
    for (int f = 0; f < 4; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t i = weight_index(f, e, unit_tap[j], unit_ci[j]);
        if (i >= 0) out[i] = acc[j][f][e];
      }
  }
}

}  // namespace

void launch_wgrad_implicit_gemm(const ConvParams& p, const at::TensorBase& grad_out,
                                const at::TensorBase& x, at::TensorBase& grad_w, MathMode math) {
  const cfg::Layout L = cfg::choose_layout(p, math == MathMode::kIEEE, current_sm());
  TORCH_CHECK(L.smem_bytes != INT64_MAX, "conv2d_ext: internal error: the plan picked the "
              "tensor-core wgrad for a problem it does not fit");
  auto kernel = math == MathMode::kTF32 ? wgrad_igemm_kernel<MathMode::kTF32>
                                        : wgrad_igemm_kernel<MathMode::kIEEE>;
  ensure_dynamic_smem(kernel, L.smem_bytes);

  // One wave: as many K slices as fill every SM at the kernel's occupancy.
  // The count depends only on the shape and the GPU, so results repeat.
  const int64_t tiles = p.groups * int64_t(L.co_tiles) * L.ci_chunks * L.tap_groups;
  TORCH_CHECK(tiles <= std::numeric_limits<int32_t>::max(),
              "conv2d_ext: weight gradient too large");
  const int per_sm = max_blocks_per_sm(kernel, cfg::kThreads, static_cast<size_t>(L.smem_bytes));
  const KSplit k = one_wave_k_split(tiles, L.k_tiles, per_sm);
  const int64_t splits = k.splits, tiles_per_split = k.tiles_per_split;
  const cfg::SumChunks c = math == MathMode::kIEEE
                               ? cfg::sum_chunking(tiles_per_split, splits, p.weight_numel())
                               : cfg::SumChunks{tiles_per_split, 1};
  const int64_t chunks = c.chunks;

  auto stream = current_stream();
  const int64_t slots = splits * chunks;
  at::TensorBase partial =
      slots == 1 ? grad_w : scratch({slots, p.weight_numel()}, grad_w.scalar_type());
  kernel<<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)), cfg::kThreads,
           L.smem_bytes, stream>>>(p, grad_out.data_ptr<float>(), x.data_ptr<float>(),
                                   partial.data_ptr<float>(), L, tiles_per_split,
                                   c.tiles_per_chunk, static_cast<int>(chunks));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (slots > 1) reduce_splits<float>(partial, grad_w, p.weight_numel(), static_cast<int>(slots));
}

}  // namespace cuda
}  // namespace conv2d_ext
