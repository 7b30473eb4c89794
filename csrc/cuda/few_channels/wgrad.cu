// wgrad for few input channels per group (at most 4: depthwise layers, RGB
// stems) on FFMA. GEMM view per group: M = Cout/groups, N = Cin/groups*KH*KW,
// K = N*Ho*Wo output pixels; K is split into slices of output tiles over
// blocks, and a second kernel sums the slices in slice order (no atomics:
// bitwise reproducible).
//
// - narrow (at most 4 output channels per group, depthwise): a block takes
//   one (group, input channel), stages that channel's 32 x 64 tile with
//   halo and the matching grad_output tiles per step, in a ring of buffers
//   that keeps the next steps' copies in flight, and each thread sums a
//   column of 8 output rows into all taps of the group's output channels.
// - wide (RGB stems): a block takes 64 output channels and 8-wide groups of
//   the N columns; per 2 x 64 output tile it stages grad_output transposed
//   ([pixel][channel]) and the group's input halo, and each thread
//   accumulates an 8 x 8 tile of M x N (8 + 8 shared reads per 64 FMAs).
//   The plan sends wide tiles to the tensor-core kernel
//   (few_channels/wgrad_tc.cu) and keeps them here for IEEE-mode short
//   reductions, where FP32 products beat 3xTF32's error, and where that
//   kernel's buffers do not fit.
// Pixels outside the output are skipped, never multiplied by zero: an Inf
// input next to the output's edge must not turn into NaN.

#include <algorithm>

#include "../../plan.h"
#include "../kernel_sizes.cuh"
#include "../split_reduce.cuh"
#include "../tensor_map.h"
#include "few_channels.cuh"
#include "few_channels.h"

namespace conv2d_ext {
namespace cuda {
namespace {

namespace fc = conv2d_ext::few_channels;
using few_channels::HaloCols;
using few_channels::Split;
using few_channels::split_stages;

constexpr int kWarps = fc::kThreads / 32;

// ---- narrow -------------------------------------------------------------

constexpr int kRows = fc::kNarrowRows;
constexpr int kTileRows = kRows * fc::kSlots;

// Taps per block: at most 50 accumulators (kCo per tap) with their offsets;
// 7x7 x 2 channels (98) spilled. Over that, the kernel's taps are split
// evenly over blocks (7x7 x 2: 25 and 24). 16 taps or fewer for generic
// sizes.
template <int KH_T, int KW_T, int kCo>
constexpr int narrow_taps() {
  constexpr int cap = (kCo <= 2 ? 25 : 50 / kCo);
  if constexpr (KH_T == 0) {
    return cap < 16 ? cap : 16;
  } else {
    constexpr int taps = KH_T * KW_T;
    constexpr int blocks = (taps + cap - 1) / cap;
    return (taps + blocks - 1) / blocks;
  }
}

template <int KH_T, int KW_T, int kCo>
__global__ void __launch_bounds__(fc::kThreads, 2)
    wgrad_narrow_kernel(const __grid_constant__ CUtensorMap x_map,
                        const __grid_constant__ CUtensorMap go_map, const ConvParams p,
                        const float* __restrict__ grad_out, const float* __restrict__ x,
                        float* __restrict__ partial, bool vec, bool vec_go, bool tma,
                        int halo_rows, int pitch, int halo_cols, int segs,
                        int stages_per_slice) {
  constexpr int kTaps = narrow_taps<KH_T, KW_T, kCo>();
  constexpr int kStages = fc::kHaloStages;
  constexpr int kGoFloats = kTileRows * fc::kTileCols;  // one channel's tile
  // A ring of stage buffers, each the input halo then kCo grad_output
  // tiles (128-byte aligned, as the tensor-copy engine writes): the next
  // tiles' copies fly while one computes.
  extern __shared__ __align__(128) float4 smem4[];
  __shared__ uint64_t staged[kStages];
  float* s_buf = reinterpret_cast<float*>(smem4);
  __shared__ float s_red[kWarps][kCo * kTaps];
  static_assert(sizeof(s_red) + sizeof(staged) <= fc::kWgradStaticSmemBytes,
                "wgrad_fits reserves this much static shared memory");
  const int cin_g = p.in_channels_per_group();
  const int cout_g = p.out_channels_per_group();
  const int KH = static_or<KH_T>(p.kernel_h), KW = static_or<KW_T>(p.kernel_w);
  const int taps = KH * KW;
  const int H = p.in_h, W = p.in_w, Ho = p.out_h, Wo = p.out_w;
  const int sh = p.stride_h, sw = p.stride_w;
  const int pad_h = p.pad_h, pad_w = p.pad_w;  // 32-bit per-step arithmetic
  const bool unit = sh == 1 && sw == 1 && p.dilation_h == 1 && p.dilation_w == 1;

  // blockIdx.x -> (group, input channel, tap segment).
  const int seg = blockIdx.x % segs;
  const int ci = (blockIdx.x / segs) % cin_g;
  const int g = blockIdx.x / segs / cin_g;
  const int tap0 = seg * kTaps;

  const int col = threadIdx.x % fc::kTileCols;
  const int r0 = (threadIdx.x / fc::kTileCols) * kRows;
  int off[kTaps];  // shared-memory offset of each tap
#pragma unroll
  for (int t = 0; t < kTaps; ++t) {
    const int tap = min(tap0 + t, taps - 1);
    off[t] = (tap / KW) * p.dilation_h * pitch + (tap % KW) * p.dilation_w;
  }
  float acc[kCo][kTaps];
#pragma unroll
  for (int c = 0; c < kCo; ++c)
#pragma unroll
    for (int t = 0; t < kTaps; ++t) acc[c][t] = 0.f;

  const int tiles_w = (Wo + fc::kTileCols - 1) / fc::kTileCols;
  const int tiles_h = (Ho + kTileRows - 1) / kTileRows;
  const int tiles = tiles_h * tiles_w;
  const int total = p.batch * tiles;
  const int first = blockIdx.y * stages_per_slice;
  const int last = min(first + stages_per_slice, total);
  const int x_floats = static_cast<int>(fc::aligned_floats(halo_rows * pitch));
  const int buf_floats = x_floats + kCo * kGoFloats;
  // Step s is tile (th, tw) of image n, tw fastest. Cursors step by one
  // tile with carries: divisions per step were a visible share of the
  // depthwise wgrad's instructions (docs/kernels.md, "Few channels on
  // FFMA").
  struct Origin {
    int n, oh0, ow0;
  };
  struct Cursor {
    int tw, th, n;
  };
  auto cursor = [&](int s) {
    const int tile = s % tiles;
    return Cursor{tile % tiles_w, tile / tiles_w, s / tiles};
  };
  auto next = [&](Cursor& c) {
    if (++c.tw == tiles_w) {
      c.tw = 0;
      if (++c.th == tiles_h) {
        c.th = 0;
        ++c.n;
      }
    }
  };
  auto origin = [&](const Cursor& c) {
    return Origin{c.n, c.th * kTileRows, c.tw * fc::kTileCols};
  };
  // With the tensor-copy engine (tma), one thread starts both boxes of a
  // step on its buffer's barrier (zeros outside the image), as in the
  // forward.
  few_channels::CopyRing<kStages> ring(staged, tma);
  const uint32_t step_bytes = 4u * (halo_rows * pitch + kCo * kGoFloats);
  auto stage = [&](const Cursor& c, int b) {
    const auto [n, oh0, ow0] = origin(c);
    float* dst = s_buf + b * buf_floats;
    if (tma) {
      if (threadIdx.x == 0) {
        const HaloCols hc = few_channels::halo_cols(ow0 * sw - pad_w, true);
        mbarrier_arrive_expect_tx(&ring.barrier[b], step_bytes);
        tma_load_4d(dst, &x_map, hc.first - hc.lead, oh0 * sh - pad_h, g * cin_g + ci, n,
                    &ring.barrier[b]);
        tma_load_4d(dst + x_floats, &go_map, ow0, oh0, g * cout_g, n, &ring.barrier[b]);
      }
      return;
    }
    few_channels::stage_halo(dst, x + plane_offset(n, p.in_channels, g * cin_g + ci, H * W),
                               1, H, W, oh0 * sh - pad_h, halo_rows,
                               few_channels::halo_cols(ow0 * sw - pad_w, vec), halo_cols,
                               pitch, x_floats, vec);
    few_channels::stage_halo(dst + x_floats,
                               grad_out + plane_offset(n, p.out_channels, g * cout_g, Ho * Wo),
                               kCo, Ho, Wo, oh0, kTileRows,
                               few_channels::halo_cols(ow0, vec_go), fc::kTileCols,
                               fc::kTileCols, kGoFloats, vec_go);
  };
  // Groups are committed even when empty, so that the wait below counts
  // kStages - 1 groups younger than the current tile's.
  Cursor ahead = cursor(first);
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) {
    if (first + k < last) stage(ahead, k);
    cp_async_commit();
    next(ahead);
  }
  int buf = 0;
  Cursor cur = cursor(first);
  for (int s = first; s < last; ++s, buf = (buf + 1) % kStages, next(cur)) {
    const auto [n, oh0, ow0] = origin(cur);
    (void)n;  // the staged buffers already hold image n
    const HaloCols hc = few_channels::halo_cols(ow0 * sw - pad_w, vec);
    // Refills the buffer consumed in the previous iteration (barrier at its
    // end).
    if (s + kStages - 1 < last) stage(ahead, (buf + kStages - 1) % kStages);
    next(ahead);
    if (tma) {
      ring.wait(buf);
    } else {
      cp_async_commit();
      cp_async_wait<kStages - 1>();
      __syncthreads();
    }
    const int ow = ow0 + col;
    if (ow < Wo) {
      const float* sb = s_buf + buf * buf_floats;
      const float* sx = sb + hc.lead + r0 * sh * pitch + col * sw;
      const float* sg = sb + x_floats + r0 * fc::kTileCols + col;
      const int rows = min(kRows, Ho - oh0 - r0);  // this thread's output rows
      bool windowed = false;
      // Up to 2 channels: with 4 (grouped 4 -> 4) the window's registers
      // made wgrad slower.
      if constexpr (KH_T > 0 && kTaps == KH_T * KW_T && kCo <= 2) {
        if (unit) {
          // Register window: input row i of the column feeds tap (kh, kw)
          // of output row i - kh, so each staged value is read once per
          // kernel column, not once per tap. Per accumulator the rows are
          // still summed in ascending order (the same sums as below).
          float go[kRows][kCo];
#pragma unroll
          for (int r = 0; r < kRows; ++r)
#pragma unroll
            for (int c = 0; c < kCo; ++c) go[r][c] = r < rows ? sg[c * kGoFloats + r * fc::kTileCols] : 0.f;
#pragma unroll
          for (int i = 0; i < kRows + KH_T - 1; ++i) {
            float v[KW_T];
#pragma unroll
            for (int kw = 0; kw < KW_T; ++kw) v[kw] = sx[i * pitch + kw];
#pragma unroll
            for (int kh = 0; kh < KH_T; ++kh) {
              const int r = i - kh;
              if (r < 0 || r >= kRows || r >= rows) continue;  // skipped, never times 0
#pragma unroll
              for (int kw = 0; kw < KW_T; ++kw)
#pragma unroll
                for (int c = 0; c < kCo; ++c)
                  acc[c][kh * KW_T + kw] = fmaf(go[r][c], v[kw], acc[c][kh * KW_T + kw]);
            }
          }
          windowed = true;
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (windowed || r >= rows) break;
        float go[kCo];
#pragma unroll
        for (int c = 0; c < kCo; ++c) go[c] = sg[c * kGoFloats + r * fc::kTileCols];
#pragma unroll
        for (int t = 0; t < kTaps; ++t) {
          const float v = sx[r * sh * pitch + off[t]];
#pragma unroll
          for (int c = 0; c < kCo; ++c) acc[c][t] = fmaf(go[c], v, acc[c][t]);
        }
      }
    }
    __syncthreads();  // this buffer is consumed before it is refilled
  }

  warp_sums(acc, s_red);
  __syncthreads();
  for (int e = threadIdx.x; e < kCo * kTaps; e += fc::kThreads) {
    const int c = e / kTaps, tap = tap0 + e % kTaps;
    if (c >= cout_g || tap >= taps) continue;
    const float sum = sum_warps(s_red, e);
    partial[int64_t(blockIdx.y) * p.weight_numel() +
            (int64_t(g * cout_g + c) * cin_g + ci) * taps + tap] = sum;
  }
}

template <int KH, int KW, int kCo>
Split launch_narrow(const ConvParams& p, const at::TensorBase& go_t, const at::TensorBase& x_t,
                    const at::TensorBase& grad_w, bool vec, bool vec_go) {
  constexpr int kTaps = narrow_taps<KH, KW, kCo>();
  // h.cols: the input columns of the tile's threads inside the plane
  // (fc::wgrad_tile_cols).
  const fc::Halo h = fc::wgrad_halo(p);
  const int segs = static_cast<int>(ceil_div(p.kernel_h * p.kernel_w, kTaps));
  const int64_t blocks_x = p.groups * p.in_channels_per_group() * segs;
  const int64_t stages = p.batch * ceil_div(p.out_h, kTileRows) * ceil_div(p.out_w, fc::kTileCols);
  TORCH_CHECK(blocks_x < (int64_t(1) << 31) && stages < (int64_t(1) << 31),
              "conv2d_ext: problem too large for the few-channel wgrad");
  Split sp = split_stages(blocks_x, stages, 4, grad_w, p.weight_numel());
  const size_t smem = static_cast<size_t>(fc::wgrad_smem_bytes(p));
  // On Hopper, both boxes of a step by the tensor-copy engine (rows of a
  // multiple of 4 floats, as for 16-byte copies).
  const bool tma = vec_go && few_channels::tma_stages(vec, h);
  CUtensorMap x_map{}, go_map{};  // not read without tma
  if (tma) {
    x_map = nchw_tensor_map(x_t, static_cast<uint32_t>(h.pitch), static_cast<uint32_t>(h.rows),
                            1, 1);
    go_map = nchw_tensor_map(go_t, fc::kTileCols, kTileRows, kCo, 1);
  }
  auto kernel = wgrad_narrow_kernel<KH, KW, kCo>;
  ensure_dynamic_smem(kernel, smem);
  kernel<<<dim3(blocks_x, sp.slices), fc::kThreads, smem, current_stream()>>>(
      x_map, go_map, p, go_t.data_ptr<float>(), x_t.data_ptr<float>(), sp.partial.data_ptr<float>(),
      vec, vec_go, tma, h.rows, h.pitch, h.cols, segs, sp.per_slice);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return sp;
}

// ---- wide ---------------------------------------------------------------

constexpr int kTileM = 8, kTileN = 8;  // a thread's M x N tile
constexpr int kCoGroups = fc::kWgradWideCo / kTileM;
constexpr int kMaxNGroups = fc::kThreads / kCoGroups;  // N groups per block
constexpr int kPixels = fc::kWgradWidePixels;
constexpr int kSumPitch = fc::kWgradSumPitch;
constexpr int kGoPitch = fc::kWgradGoPitch;

struct WideShape {
  int n_groups;  // of this block
  int lanes;     // threads per M x N tile, splitting the pixels
};

__host__ __device__ inline WideShape wide_shape(int n_groups_block) {
  const int tiles = n_groups_block * kCoGroups;
  return {n_groups_block, std::max(1, fc::kThreads / tiles)};
}

__global__ void __launch_bounds__(fc::kThreads, 2)
    wgrad_wide_kernel(const ConvParams p, const float* __restrict__ grad_out,
                      const float* __restrict__ x, float* __restrict__ partial, bool vec,
                      int halo_rows, int pitch, int n_parts, int stages_per_slice) {
  extern __shared__ float4 smem4[];
  float* s_go = reinterpret_cast<float*>(smem4);  // [kPixels][kGoPitch]
  float* s_x = s_go + kPixels * kGoPitch;          // [ci][halo_rows][pitch]
  // Each worker's sums of its tiles so far, [worker][kSumPitch]: a thread's
  // accumulators restart every tile (2 x 64 pixels), so that no FP32 chain
  // runs over a whole slice (a stem's chain over a slice was less accurate
  // than cuDNN). The pitch keeps a quarter
  // warp's 16-byte accesses on distinct banks, and the offsets constant.
  float4* s_sum = reinterpret_cast<float4*>(s_x + p.in_channels_per_group() * halo_rows * pitch) +
                  threadIdx.x * (kSumPitch / 4);
  const int cin_g = p.in_channels_per_group();
  const int cout_g = p.out_channels_per_group();
  const int KH = p.kernel_h, KW = p.kernel_w, taps = KH * KW;
  const int H = p.in_h, W = p.in_w, Ho = p.out_h, Wo = p.out_w;
  const int sh = p.stride_h, sw = p.stride_w;
  const int n_total = cin_g * taps;
  const int ng_total = (n_total + kTileN - 1) / kTileN;
  const int ng_per_part = (ng_total + n_parts - 1) / n_parts;

  // blockIdx.x -> (group, co tile, part of the N groups).
  const int co_tiles = (cout_g + fc::kWgradWideCo - 1) / fc::kWgradWideCo;
  const int part = blockIdx.x % n_parts;
  const int co0 = (blockIdx.x / n_parts % co_tiles) * fc::kWgradWideCo;
  const int g = blockIdx.x / n_parts / co_tiles;
  const int ng0 = part * ng_per_part;
  const int ngs = min(ng_per_part, ng_total - ng0);
  const WideShape ws = wide_shape(ngs);
  const int tiles = ngs * kCoGroups;
  const int tid = threadIdx.x;
  const bool worker = tid < tiles * ws.lanes;
  const int tile = tid % tiles, lane_q = tid / tiles;
  if (worker) {
#pragma unroll
    for (int k = 0; k < kTileM * kTileN / 4; ++k) s_sum[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const int ng = ng0 + tile % ngs, cg = tile / ngs;

  int xoff[kTileN];
  const int plane = halo_rows * pitch;
#pragma unroll
  for (int j = 0; j < kTileN; ++j) {
    const int nidx = min(ng * kTileN + j, n_total - 1);
    const int ci = nidx / taps, tap = nidx % taps;
    // In bytes: the loop below adds it to a 32-bit shared address (one IADD
    // a load; float indices into a generic pointer cost an IADD and a LEA).
    xoff[j] = 4 * (ci * plane + (tap / KW) * p.dilation_h * pitch + (tap % KW) * p.dilation_w);
  }
  float acc[kTileM][kTileN];
#pragma unroll
  for (int i = 0; i < kTileM; ++i)
#pragma unroll
    for (int j = 0; j < kTileN; ++j) acc[i][j] = 0.f;

  constexpr int kRowsT = fc::kWgradWideRows;
  const int tiles_w = (Wo + fc::kTileCols - 1) / fc::kTileCols;
  const int ptiles = ((Ho + kRowsT - 1) / kRowsT) * tiles_w;
  const int total = p.batch * ptiles;
  const int first = blockIdx.y * stages_per_slice;
  const int last = min(first + stages_per_slice, total);
  const int halo_cols = (fc::kTileCols - 1) * sw + (KW - 1) * p.dilation_w + 1;
  for (int s = first; s < last; ++s) {
    const int n = s / ptiles, pt = s % ptiles;
    const int oh0 = (pt / tiles_w) * kRowsT, ow0 = (pt % tiles_w) * fc::kTileCols;
    const HaloCols hc = few_channels::halo_cols(ow0 * sw - p.pad_w, vec);
    __syncthreads();  // the previous tile is consumed
    few_channels::stage_halo(s_x, x + plane_offset(n, p.in_channels, g * cin_g, H * W), cin_g,
                               H, W, oh0 * sh - p.pad_h, halo_rows, hc, halo_cols, pitch,
                               halo_rows * pitch, vec);
    cp_async_commit();
    // grad_output, transposed to [pixel][channel] so a thread's 8 channels
    // are two 16-byte reads.
    for (int e = tid; e < kPixels * fc::kWgradWideCo; e += fc::kThreads) {
      const int px = e % kPixels, c = e / kPixels;
      const int oh = oh0 + px / fc::kTileCols, ow = ow0 + px % fc::kTileCols;
      const int co = co0 + c;
      s_go[px * kGoPitch + c] =
          (oh < Ho && ow < Wo && co < cout_g)
              ? __ldg(grad_out + plane_offset(n, p.out_channels, g * cout_g + co, Ho * Wo) +
                      oh * Wo + ow)
              : 0.f;
    }
    cp_async_wait<0>();
    __syncthreads();
    if (!worker) continue;
    const int rows = min(kRowsT, Ho - oh0), cols = min(fc::kTileCols, Wo - ow0);
    for (int r = 0; r < rows; ++r) {
      const uint32_t sxr = smem_addr(s_x + hc.lead + r * sh * pitch);
      for (int c = lane_q; c < cols; c += ws.lanes) {
        float gv[kTileM];
        load_tile(s_go + (r * fc::kTileCols + c) * kGoPitch + cg * kTileM, gv);
        const uint32_t sx = sxr + 4 * c * sw;
        float xv[kTileN];
#pragma unroll
        for (int j = 0; j < kTileN; ++j) xv[j] = lds_f32(sx + xoff[j]);
#pragma unroll
        for (int i = 0; i < kTileM; ++i)
#pragma unroll
          for (int j = 0; j < kTileN; ++j) acc[i][j] = fmaf(gv[i], xv[j], acc[i][j]);
      }
    }
#pragma unroll
    for (int i = 0; i < kTileM; ++i)
#pragma unroll
      for (int j = 0; j < kTileN; j += 4) {
        float4 t = s_sum[(i * kTileN + j) / 4];
        t.x += acc[i][j];
        t.y += acc[i][j + 1];
        t.z += acc[i][j + 2];
        t.w += acc[i][j + 3];
        s_sum[(i * kTileN + j) / 4] = t;
        acc[i][j] = acc[i][j + 1] = acc[i][j + 2] = acc[i][j + 3] = 0.f;
      }
  }
  if (worker) {
#pragma unroll
    for (int i = 0; i < kTileM; ++i)
#pragma unroll
      for (int j = 0; j < kTileN; j += 4) {
        const float4 t = s_sum[(i * kTileN + j) / 4];
        acc[i][j] = t.x;
        acc[i][j + 1] = t.y;
        acc[i][j + 2] = t.z;
        acc[i][j + 3] = t.w;
      }
  }

  // Sum the lanes of each tile in lane order through shared memory.
  __syncthreads();
  float* s_red = reinterpret_cast<float*>(smem4);  // [thread][64]
  if (worker && ws.lanes > 1) {
#pragma unroll
    for (int i = 0; i < kTileM; ++i)
#pragma unroll
      for (int j = 0; j < kTileN; ++j) s_red[tid * 64 + i * kTileN + j] = acc[i][j];
  }
  __syncthreads();
  if (!worker || lane_q != 0) return;
  if (ws.lanes > 1) {
    for (int q = 1; q < ws.lanes; ++q) {
      const float* o = s_red + (q * tiles + tile) * 64;
#pragma unroll
      for (int i = 0; i < kTileM; ++i)
#pragma unroll
        for (int j = 0; j < kTileN; ++j) acc[i][j] += o[i * kTileN + j];
    }
  }
  float* out = partial + int64_t(blockIdx.y) * p.weight_numel();
#pragma unroll
  for (int i = 0; i < kTileM; ++i) {
    const int co = co0 + cg * kTileM + i;
    if (co >= cout_g) continue;
#pragma unroll
    for (int j = 0; j < kTileN; ++j) {
      const int nidx = ng * kTileN + j;
      // [co][ci][kh][kw] within the group is [co][nidx].
      if (nidx < n_total) out[(int64_t(g) * cout_g + co) * n_total + nidx] = acc[i][j];
    }
  }
}

Split launch_wide(const ConvParams& p, const float* go, const float* x,
                  const at::TensorBase& grad_w, bool vec) {
  const fc::Halo h = fc::wgrad_halo(p);
  const int64_t n_total = p.in_channels_per_group() * p.kernel_h * p.kernel_w;
  const int64_t ng_total = ceil_div(n_total, kTileN);
  const int n_parts = static_cast<int>(ceil_div(ng_total, kMaxNGroups));
  const int64_t co_tiles = ceil_div(p.out_channels_per_group(), fc::kWgradWideCo);
  const int64_t blocks_x = p.groups * co_tiles * n_parts;
  const int64_t stages = p.batch * ceil_div(p.out_h, fc::kWgradWideRows) *
                         ceil_div(p.out_w, fc::kTileCols);
  TORCH_CHECK(blocks_x < (int64_t(1) << 31) && stages < (int64_t(1) << 31),
              "conv2d_ext: problem too large for the few-channel wgrad");
  Split sp = split_stages(blocks_x, stages, 2, grad_w, p.weight_numel());
  const int64_t ng_block = ceil_div(ng_total, n_parts);
  const WideShape ws = wide_shape(static_cast<int>(ng_block));
  const int64_t red_bytes = ws.lanes > 1 ? int64_t(fc::kThreads) * 64 * 4 : 0;
  const int workers = ws.n_groups * kCoGroups * ws.lanes;
  const size_t smem = static_cast<size_t>(std::max(fc::wgrad_wide_smem_bytes(p, workers), red_bytes));
  auto kernel = wgrad_wide_kernel;
  ensure_dynamic_smem(kernel, smem);
  kernel<<<dim3(blocks_x, sp.slices), fc::kThreads, smem, current_stream()>>>(
      p, go, x, sp.partial.data_ptr<float>(), vec, h.rows, h.pitch, n_parts, sp.per_slice);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return sp;
}

}  // namespace

void launch_wgrad_few_channels(const ConvParams& p, const at::TensorBase& grad_out,
                               const at::TensorBase& x, at::TensorBase& grad_w) {
  TORCH_CHECK(fc::wgrad_fits(p, current_sm()),
              "conv2d_ext: internal error: few-channel wgrad does not fit");
  const bool vec = few_channels::can_vectorise(x.data_ptr(), p.in_w);
  const bool vec_go = few_channels::can_vectorise(grad_out.data_ptr(), p.out_w);
  const float* go = grad_out.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  Split sp;
  if (!fc::choose_wgrad_variant(p).narrow) {
    sp = launch_wide(p, go, xp, grad_w, vec);
  } else {
    dispatch_few_channels_kernel_size(p.kernel_h, p.kernel_w, [&](auto kh, auto kw) {
      constexpr int KH = decltype(kh)::value, KW = decltype(kw)::value;
      few_channels::dispatch_narrow_channels(p.out_channels_per_group(), [&](auto co) {
        sp = launch_narrow<KH, KW, decltype(co)::value>(p, grad_out, x, grad_w, vec, vec_go);
      });
    });
  }
  if (sp.slices > 1) reduce_splits<float>(sp.partial, grad_w, p.weight_numel(), sp.slices);
}

}  // namespace cuda
}  // namespace conv2d_ext
