// dgrad for few input channels per group and many output channels at
// stride 2 (RGB stems) on TF32 tensor cores (mma.sync, sm_80+), TF32 mode
// only. The FFMA gather (few_channels/dgrad.cu) takes one stride phase
// per block with the group's input channels as its accumulators, slower
// than this kernel in TF32 mode. 3xTF32 on it was slower than the gather,
// and on wgmma (positions as M, the 16 rows as N) also less accurate than
// cuDNN's strict FP32, so IEEE mode keeps the gather (docs/kernels.md,
// "Few channels on tensor cores").
//
// All phases at once (config.h, DgradTcLayout): grad_input pixel
// (i * stride + py, j * stride + px) is the sum over output channels co and
// window offsets (dh, dw) of grad_output[co][i + dh][j + dw] times the
// weight of the tap that reaches phase (py, px) from that offset (zero
// where none does). GEMM per group, in mma.sync's orientation: M = the 16
// (py, px, input channel) rows (12 real for the stem), A = those weights,
// arranged once per call by a small kernel (rounded) and read by ldmatrix; N = the phase grid's positions, a
// stage of 4 rows x 64 columns (each warp one row and 32 columns: 4 n8
// tiles); K = (output channel, dh, dw), 8 channels a chunk. B, grad_output
// at each k's offset, comes from the chunk's halo by 4-byte shared loads
// through a table of the k offsets, as the few-channel forward gathers its
// input.
//
// A block strides over stages, and within a stage over the chunks; each
// chunk's halo and weights land in a ring buffer (tensor-copy engine and a
// bulk copy on Hopper, async copies elsewhere) while the previous chunk
// computes. Sums in two levels, as in the FFMA gather: a chunk's products
// into `part`, the chunks' into `acc`.

#include <algorithm>

#include "../../plan.h"
#include "../mma.cuh"
#include "../tensor_map.h"
#include "few_channels.cuh"
#include "few_channels.h"

namespace conv2d_ext {
namespace cuda {
namespace {

namespace fc = conv2d_ext::few_channels;
using few_channels::HaloCols;

constexpr int kBlock = fc::kThreads;
constexpr int kNT = 4;  // n8 tiles of positions per warp
constexpr int kChunk = fc::kDgradTcChunk;
static_assert(kBlock / 32 == 2 * fc::kDgradTcRows && 2 * 8 * kNT == fc::kTileCols,
              "two warps a row, 32 columns each");

// Row r of M: phase (py, px) = (r / cin / sw, r / cin % sw), channel r % cin.
struct Row {
  int py, px, ci;
  bool real;
};
__device__ __forceinline__ Row row_of(int r, int cin_g, int sh, int sw) {
  const int phase = r / cin_g;
  return {phase / sw, phase % sw, r % cin_g, r < sh * sw * cin_g};
}

// The weights per (group, chunk), rounded to TF32: [16 rows][weight_pitch],
// row r and k = (channel, dh, dw) holding the weight of the tap that
// reaches row r's phase from offset (dh, dw).
__global__ void arrange_dgrad_tc_weights(const ConvParams p, const float* __restrict__ w,
                                         float* __restrict__ out, const fc::DgradTcLayout L,
                                         int n_chunks) {
  const int wins = L.win_h.count * L.win_w.count;
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= fc::kDgradTcN * L.weight_pitch) return;
  const int r = e / L.weight_pitch, k = e - r * L.weight_pitch;
  const Row row = row_of(r, p.in_channels_per_group(), p.stride_h, p.stride_w);
  const int co_l = k / wins, win = k - co_l * wins;
  // The tap from offset (dh, dw): py + pad - kh * dil = dh * stride.
  const int nh = row.py + p.pad_h - (L.win_h.first + win / L.win_w.count) * p.stride_h;
  const int nw = row.px + p.pad_w - (L.win_w.first + win % L.win_w.count) * p.stride_w;
  const int kh = nh / p.dilation_h, kw = nw / p.dilation_w;
  const bool tap = row.real && k < L.k_chunk && nh >= 0 && nw >= 0 && nh % p.dilation_h == 0 &&
                   nw % p.dilation_w == 0 && kh < p.kernel_h && kw < p.kernel_w;
  for (int gc = blockIdx.y; gc < p.groups * n_chunks; gc += gridDim.y) {
    const int g = gc / n_chunks, co = (gc - g * n_chunks) * kChunk + co_l;
    // Zero past the group's output channels too.
    const float v = tap ? weight_or_zero(p, w, WeightOrder::kFprop, g, co, row.ci, kh, kw) : 0.f;
    out[int64_t(gc) * L.weight_floats + e] = __uint_as_float(tf32_operand(v));
  }
}

__global__ void __launch_bounds__(kBlock, 2)
    dgrad_tc_kernel(const __grid_constant__ CUtensorMap go_map, const ConvParams p,
                    const float* __restrict__ grad_out, const float* __restrict__ w_arr,
                    float* __restrict__ grad_in, const fc::DgradTcLayout L, bool vec, bool tma) {
  extern __shared__ float4 smem4[];
  __shared__ uint64_t staged[2];
  // The tensor-copy engine writes 128-byte aligned boxes (the launch adds
  // the slack).
  float* const smem = reinterpret_cast<float*>(smem4) +
                      ((128 - (smem_addr(smem4) & 127)) & 127) / 4;
  const int cin_g = p.in_channels_per_group(), cout_g = p.out_channels_per_group();
  const int H = p.in_h, W = p.in_w, Ho = p.out_h, Wo = p.out_w;
  const int sh = p.stride_h, sw = p.stride_w;
  const int pitch = L.pitch, plane = L.halo_rows * pitch, wpitch = L.weight_pitch;
  const int wins = L.win_h.count * L.win_w.count;
  const int n_chunks = (cout_g + kChunk - 1) / kChunk;
  const int g = blockIdx.y;

  int* const k_table = reinterpret_cast<int*>(smem);
  float* const buf0 = smem + L.table_floats;
  auto buffer = [&](int b) { return buf0 + b * L.buffer_floats; };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gq = lane >> 2, tq = lane & 3;

  // Each k's halo offset, laid out so that lane tq reads those of k = 8t +
  // tq and 8t + tq + 4 as one 8-byte word at step t.
  for (int k = threadIdx.x; k < L.k_steps * 8; k += kBlock) {
    int off = 0;
    if (k < L.k_chunk) {
      const int co_l = k / wins, win = k - co_l * wins;
      off = co_l * plane + (win / L.win_w.count) * pitch + win % L.win_w.count;
    }
    k_table[few_channels::k_offset_slot(k)] = off;
  }

  // Stage s is (image n, phase rows from i0, columns from j0); chunk c its
  // output channels c * kChunk on.
  const int rows_p = (H + sh - 1) / sh, cols_p = (W + sw - 1) / sw;  // the phase grid
  const int tiles_w = (cols_p + fc::kTileCols - 1) / fc::kTileCols;
  const int per_image = (rows_p + fc::kDgradTcRows - 1) / fc::kDgradTcRows * tiles_w;
  const int total = p.batch * per_image;
  struct Item {
    int s, c, n, i0, j0;
  };
  auto item = [&](int s, int c) {
    const int n = s / per_image, t = s - n * per_image, th = t / tiles_w;
    return Item{s, c, n, th * fc::kDgradTcRows, (t - th * tiles_w) * fc::kTileCols};
  };
  const int halo_cols = fc::kTileCols + L.win_w.count - 1;
  few_channels::CopyRing<2> ring(staged, tma);
  const uint32_t w_bytes = 4u * L.weight_floats;
  auto stage = [&](const Item& it, int b) {
    float* dst = buffer(b);
    const int co0 = it.c * kChunk;
    const HaloCols hc = few_channels::halo_cols(it.j0 + L.win_w.first, vec);
    const float* w_src = w_arr + int64_t(g * n_chunks + it.c) * L.weight_floats;
    if (tma) {
      // The box holds kChunk channels; past the chunk's its k are masked.
      if (threadIdx.x == 0) {
        mbarrier_arrive_expect_tx(&ring.barrier[b], 4u * kChunk * plane + w_bytes);
        tma_load_4d(dst, &go_map, hc.first - hc.lead, it.i0 + L.win_h.first, g * cout_g + co0,
                    it.n, &ring.barrier[b]);
        bulk_copy_to_smem(dst + L.halo_floats, w_src, w_bytes, &ring.barrier[b]);
      }
      return;
    }
    few_channels::stage_halo(
        dst, grad_out + plane_offset(it.n, p.out_channels, g * cout_g + co0, Ho * Wo),
        min(kChunk, cout_g - co0), Ho, Wo, it.i0 + L.win_h.first, L.halo_rows, hc, halo_cols,
        pitch, plane, vec);
    for (int e = threadIdx.x; e < int(w_bytes / 16); e += kBlock) {
      cp_async_16(dst + L.halo_floats + 4 * e, w_src + 4 * e);
    }
  };

  // ldmatrix: lanes 8i..8i+7 give the rows of matrix i (rows 0-7, 8-15 at
  // k 0-3, then at k 4-7).
  const int mat = lane >> 3;
  const uint32_t a_lane = 4u * (((mat & 1) * 8 + (lane & 7)) * wpitch + (mat >> 1) * 4);
  const int rr = warp / 2, c_warp = (warp & 1) * (fc::kTileCols / 2);
  // This thread's rows of M: gq and gq + 8.
  const Row rows[2] = {row_of(gq, cin_g, sh, sw), row_of(gq + 8, cin_g, sh, sw)};

  float acc[1][kNT][4];
  zero_fragments(acc);

  const int first = blockIdx.x, step = gridDim.x;
  Item cur = item(first, 0);
  if (first < total) stage(cur, 0);
  cp_async_commit();
  for (int q = 0; cur.s < total; ++q) {
    const int b = q & 1;
    if (tma) {
      ring.wait(b);
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // the chunk has landed; every warp is done with the previous one
    const Item next = cur.c + 1 < n_chunks ? Item{cur.s, cur.c + 1, cur.n, cur.i0, cur.j0}
                                           : item(cur.s + step, 0);
    if (next.s < total) stage(next, b ^ 1);  // flies under this chunk's work
    cp_async_commit();
    few_channels::tensor_core_operands</*kTf32x3=*/false, few_channels::OperandLayout::kPairs,
                                         /*kRoundSmall=*/true, /*kBatch=*/1>(
        reinterpret_cast<float4*>(buffer(b)), nullptr, L.halo_floats / 4, tma);

    const int i = cur.i0 + rr, c0 = cur.j0 + c_warp;  // the warp's row and first column
    if (i < rows_p && c0 < cols_p) {                   // warp-uniform
      const int lead = few_channels::halo_cols(cur.j0 + L.win_w.first, vec).lead;
      const uint32_t xb = smem_addr(buffer(b)) + 4u * (rr * pitch + lead + c_warp + gq);
      const uint32_t a_base = smem_addr(buffer(b) + L.halo_floats) + a_lane;
      // K past the chunk's channels (the last chunk) or its window: zero B.
      const int k_valid = min(kChunk, cout_g - cur.c * kChunk) * wins;
      float part[1][kNT][4];
      zero_fragments(part);
      for (int t = 0; t < L.k_steps; ++t) {
        const int2 ko = few_channels::k8_offsets(k_table, t, tq);
        const uint32_t b0 = xb + 4u * ko.x, b1 = xb + 4u * ko.y;
        uint32_t bb[kNT][2];
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          bb[j][0] = __float_as_uint(lds_f32(b0 + 32u * j));
          bb[j][1] = __float_as_uint(lds_f32(b1 + 32u * j));
        }
        if (t * 8 + 8 > k_valid) {
          const bool keep0 = t * 8 + tq < k_valid, keep1 = t * 8 + tq + 4 < k_valid;
#pragma unroll
          for (int j = 0; j < kNT; ++j) {
            if (!keep0) bb[j][0] = 0u;
            if (!keep1) bb[j][1] = 0u;
          }
        }
        uint32_t ab[4];
        ldmatrix_x4(ab, a_base + 32u * t);
#pragma unroll
        for (int j = 0; j < kNT; ++j) mma_tf32(part[0][j], ab, bb[j]);
      }
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[0][j][r] += part[0][j][r];

      if (cur.c == n_chunks - 1) {
        // Accumulator (j, r): row gq (+ 8 for r >= 2), position c0 + 8j + 2tq
        // (+ 1 for odd r).
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const Row row = rows[h];
          const int ih = i * sh + row.py;
          if (!row.real || ih >= H) continue;
          float* const gi =
              grad_in + plane_offset(cur.n, p.in_channels, g * cin_g + row.ci, H * W) +
              int64_t(ih) * W;
#pragma unroll
          for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int iw = (c0 + 8 * j + 2 * tq + e) * sw + row.px;
              if (iw < W) gi[iw] = acc[0][j][2 * h + e];
            }
        }
        zero_fragments(acc);
      }
    }
    cur = next;
  }
}

}  // namespace

void launch_dgrad_few_channels_tc(const ConvParams& p, const at::TensorBase& grad_out,
                                  const at::TensorBase& w, at::TensorBase& grad_in) {
  TORCH_CHECK(fc::dgrad_tc_fits(p),
              "conv2d_ext: internal error: few-channel tensor-core dgrad does not fit");
  const fc::DgradTcLayout L = fc::dgrad_tc_layout(p);
  const int64_t n_chunks = ceil_div(p.out_channels_per_group(), kChunk);
  const int64_t rows_p = ceil_div(p.in_h, p.stride_h), cols_p = ceil_div(p.in_w, p.stride_w);
  const int64_t stages =
      p.batch * ceil_div(rows_p, fc::kDgradTcRows) * ceil_div(cols_p, fc::kTileCols);
  TORCH_CHECK(stages < (int64_t(1) << 31) && p.groups <= kMaxGridYZ &&
                  p.groups * n_chunks * L.weight_floats < (int64_t(1) << 31),
              "conv2d_ext: problem too large for the few-channel tensor-core dgrad");
  auto stream = current_stream();

  // The weights, arranged (and rounded) once per call.
  at::TensorBase w_arr = scratch({p.groups * n_chunks * L.weight_floats}, w.scalar_type());
  const dim3 arrange_grid(static_cast<unsigned>(ceil_div(fc::kDgradTcN * L.weight_pitch, 256)),
                          static_cast<unsigned>(std::min(p.groups * n_chunks, kMaxGridYZ)));
  arrange_dgrad_tc_weights<<<arrange_grid, 256, 0, stream>>>(
      p, w.data_ptr<float>(), w_arr.data_ptr<float>(), L, static_cast<int>(n_chunks));
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  const bool vec = few_channels::can_vectorise(grad_out.data_ptr(), p.out_w);
  const fc::Halo h{L.halo_rows, L.pitch, int64_t(L.halo_rows) * L.pitch};
  const bool tma = few_channels::tma_stages(vec, h);
  CUtensorMap go_map{};  // not read without tma
  if (tma) {
    go_map = nchw_tensor_map(grad_out, static_cast<uint32_t>(L.pitch),
                             static_cast<uint32_t>(L.halo_rows), kChunk, 1);
  }
  auto kernel = dgrad_tc_kernel;
  const size_t smem = static_cast<size_t>(L.smem_bytes);
  ensure_dynamic_smem(kernel, smem);
  // One wave of blocks over the groups, each striding over stages.
  const int64_t slots = int64_t(max_blocks_per_sm(kernel, kBlock, smem)) *
                        device_properties()->multiProcessorCount;
  const int64_t blocks_x = std::max<int64_t>(1, std::min(stages, ceil_div(slots, p.groups)));
  kernel<<<dim3(static_cast<unsigned>(blocks_x), static_cast<unsigned>(p.groups)), kBlock, smem,
           stream>>>(go_map, p, grad_out.data_ptr<float>(), w_arr.data_ptr<float>(),
                     grad_in.data_ptr<float>(), L, vec, tma);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace conv2d_ext
