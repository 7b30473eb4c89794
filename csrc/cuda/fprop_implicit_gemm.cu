// Forward pass (fprop) on tensor cores: implicit GEMM with mma.sync TF32.
//
// GEMM view per group: M = output pixels, N = Cout/groups, K =
// Cin/groups*KH*KW. A block computes 8 output rows x 32 columns x 64 output
// channels; warp w owns output row w (two m16 fragments) and all 64
// channels (eight n8 fragments). K advances 8 input channels at a time: the
// input halo tile of those channels is staged in shared memory once (NCHW
// order, zero-filled at borders) and read by every tap of the kernel, so
// taps cost shared-memory reads, not global traffic. The weights, rearranged
// once per call into fragment order, stream one kernel row per stage (all
// rows of the chunk for kernels of at most 16 taps). Stages are
// double-buffered with cp.async behind one barrier each.
//
// Math: TF32 rounds each operand to nearest; 3xTF32 splits each into
// big + small and accumulates small*big + big*small before big*big.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "../tile_config.h"
#include "common.cuh"
#include "fprop_implicit_gemm.h"
#include "kernel_sizes.cuh"
#include "mma.cuh"

namespace conv2d_ext {
namespace cuda {
namespace {

namespace cfg = igemm_fprop;

// Weights [Cout][Cin/g][KH][KW] -> per (group, co tile):
// [chunk][kh][kw][pair of n-fragments (4)][lane (32)][b0, b1 of fragment
// 2*pair, b0, b1 of fragment 2*pair+1], zero outside the real channels,
// already rounded to TF32 in TF32 mode.
// A lane then loads its B fragments for two n-fragments with one 16-byte
// read, and one kernel row of one chunk is a contiguous stage.
__global__ void __launch_bounds__(kThreads)
    rearrange_weights_kernel(const ConvParams p, const float* __restrict__ w,
                             float* __restrict__ out, int chunks, int co_tiles,
                             int64_t total, bool round_tf32) {
  const int KH = p.kernel_h, KW = p.kernel_w;
  const int cin_g = p.in_channels_per_group();
  const int cout_g = p.out_channels_per_group();
  for (int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * kThreads) {
    int64_t q = e;
    const int element = q & 3;
    q >>= 2;
    const int lane = q & 31;
    q >>= 5;
    const int pair = q & 3;
    q >>= 2;
    const int kw = q % KW;
    q /= KW;
    const int kh = q % KH;
    q /= KH;
    const int chunk = q % chunks;
    q /= chunks;
    const int co_tile = q % co_tiles;
    const int g = q / co_tiles;
    const int frag = 2 * pair + (element >> 1);
    const int co = co_tile * cfg::kCo + frag * 8 + (lane >> 2);
    const int ci = chunk * cfg::kChunk + (lane & 3) + 4 * (element & 1);
    float v = 0.f;
    if (co < cout_g && ci < cin_g) {
      v = w[((int64_t(g) * cout_g + co) * cin_g + ci) * KH * KW + kh * KW + kw];
      if (round_tf32) v = __uint_as_float(tf32_round(v));
    }
    out[e] = v;
  }
}

// One k8 step of the warp tile: A (2 m-fragments) from registers, B (8
// n-fragments) read pairwise from the staged weights (wb: this lane's
// first 16 bytes of the tap). Operands are rounded
// or split one B fragment at a time to keep register pressure down.
template <TcMath kMath>
__device__ __forceinline__ void mma_step(float (&acc)[2][8][4],
                                         const float (&a)[2][4],
                                         const float4* __restrict__ wb) {
  uint32_t a_big[2][4], a_small[2][4];
#pragma unroll
  for (int f = 0; f < 2; ++f)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (kMath == TcMath::kTF32) {
        a_big[f][i] = tf32_round(a[f][i]);
      } else {
        tf32_split(a[f][i], a_big[f][i], a_small[f][i]);
      }
    }
#pragma unroll
  for (int pr = 0; pr < 4; ++pr) {
    const float4 v = wb[pr * 32];  // wb already points at this lane
    const float raw[2][2] = {{v.x, v.y}, {v.z, v.w}};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = 2 * pr + h;
      uint32_t b_big[2], b_small[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if constexpr (kMath == TcMath::kTF32) {
          b_big[i] = __float_as_uint(raw[h][i]);  // rounded when rearranged
        } else {
          tf32_split(raw[h][i], b_big[i], b_small[i]);
        }
      }
#pragma unroll
      for (int f = 0; f < 2; ++f) {
        if constexpr (kMath == TcMath::k3xTF32) {
          // The tensor cores truncate when they accumulate, a bias that
          // grows with the length of an accumulation chain. Each k step
          // therefore starts from zero (small products first, then
          // big*big), and steps are summed with round-to-nearest FADDs.
          float step[4] = {0.f, 0.f, 0.f, 0.f};
          mma_tf32(step, a_small[f], b_big);
          mma_tf32(step, a_big[f], b_small);
          mma_tf32(step, a_big[f], b_big);
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[f][j][i] += step[i];
        } else {
          mma_tf32(acc[f][j], a_big[f], b_big);
        }
      }
    }
  }
}

template <int KH_T, int KW_T, TcMath kMath>
__global__ void __launch_bounds__(cfg::kThreads, 2)
    fprop_igemm_kernel(const ConvParams p, const float* __restrict__ x,
                       const float* __restrict__ w_frag,
                       const float* __restrict__ bias, float* __restrict__ y,
                       const cfg::Layout L) {
  extern __shared__ __align__(16) float smem[];
  const int KH = static_or<KH_T>(p.kernel_h);
  const int KW = static_or<KW_T>(p.kernel_w);
  const int H = p.in_h, W = p.in_w, Ho = p.out_h, Wo = p.out_w;
  const int HW = H * W;
  const int cin_g = p.in_channels_per_group();
  const int cout_g = p.out_channels_per_group();
  const int sh = p.stride_h, sw = p.stride_w;
  const int dh = p.dilation_h, dw = p.dilation_w;
  const int rows_per_stage = L.rows_per_stage;
  const int stage_floats = rows_per_stage * KW * cfg::kWeightFloatsPerTap;
  // Buffers as offsets from `smem`, not as an array of pointers: indexing a
  // pointer array loses the shared address space and turns every operand
  // read into a generic load with 64-bit address arithmetic.
  const int halo_floats = cfg::kChunk * L.plane;
  auto halo_at = [&](int buf) { return buf * halo_floats; };
  auto weights_at = [&](int buf) { return 2 * halo_floats + buf * stage_floats; };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int grp = lane >> 2, tig = lane & 3;
  const int tiles_w = (Wo + cfg::kCols - 1) / cfg::kCols;
  const int oh0 = (blockIdx.x / tiles_w) * cfg::kRows;
  const int ow0 = (blockIdx.x % tiles_w) * cfg::kCols;

  // The halo positions this thread stages, fixed for every chunk: offset in
  // an input plane, slot in a shared plane, and whether inside the input.
  const int ih0 = oh0 * sh - p.pad_h, iw0 = ow0 * sw - p.pad_w;
  const int halo_area = L.halo_rows * L.halo_cols;
  int pos_off[cfg::kMaxHaloPerThread], pos_slot[cfg::kMaxHaloPerThread];
  uint32_t inside = 0;
#pragma unroll
  for (int i = 0; i < cfg::kMaxHaloPerThread; ++i) {
    const int idx = threadIdx.x + i * cfg::kThreads;
    const int hr = idx / L.halo_cols, hc = idx - hr * L.halo_cols;
    const int ih = ih0 + hr, iw = iw0 + hc;
    const bool ok = idx < halo_area && ih >= 0 && ih < H && iw >= 0 && iw < W;
    inside |= uint32_t(ok) << i;
    pos_off[i] = ok ? ih * W + iw : 0;
    pos_slot[i] = hr * L.halo_cols + hc;
  }

  // Offset of this lane's first A element for tap (0, 0) in a halo buffer;
  // a tap adds kh*dh rows and kw*dw columns. The other seven elements sit
  // 8 columns, 4 channel planes and 16 columns (second m fragment) away.
  const int a_lane = warp * sh * L.halo_cols + tig * L.plane + grp * sw;
  const int a_next_col = 8 * sw, a_next_ch = 4 * L.plane, a_next_frag = 16 * sw;

  const int stages_per_chunk = KH / rows_per_stage;
  const int stages = L.chunks * stages_per_chunk;
  for (int gy = blockIdx.y; gy < p.groups * L.co_tiles; gy += gridDim.y) {
    const int g = gy / L.co_tiles;
    const int co0 = (gy % L.co_tiles) * cfg::kCo;
    const float* w_tile = w_frag + int64_t(gy) * stages * stage_floats;

    for (int n = blockIdx.z; n < p.batch; n += gridDim.z) {
      const float* x_img =
          x + (int64_t(n) * p.in_channels + int64_t(g) * cin_g) * HW;
      auto load_halo = [&](int chunk, float* dst) {  // dst: a halo buffer
        // Not unrolled: the compiler would keep all 32 source addresses
        // live across the main loop.
#pragma unroll 1
        for (int ci = 0; ci < cfg::kChunk; ++ci) {
          const int c = chunk * cfg::kChunk + ci;
          const float* plane = x_img + int64_t(c < cin_g ? c : 0) * HW;
#pragma unroll
          for (int i = 0; i < cfg::kMaxHaloPerThread; ++i) {
            if (threadIdx.x + i * cfg::kThreads < halo_area) {
              const bool ok = c < cin_g && ((inside >> i) & 1u);
              cp_async_4(dst + ci * L.plane + pos_slot[i], plane + pos_off[i], ok);
            }
          }
        }
      };
      auto load_weights = [&](int stage, float* dst) {
        const float* src = w_tile + int64_t(stage) * stage_floats;
        for (int i = threadIdx.x; i < stage_floats / 4; i += cfg::kThreads) {
          cp_async_16(dst + 4 * i, src + 4 * i);
        }
      };

      float acc[2][8][4];
#pragma unroll
      for (int f = 0; f < 2; ++f)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[f][j][i] = 0.f;

      __syncthreads();  // buffers free (previous image or channel tile)
      load_halo(0, smem + halo_at(0));
      load_weights(0, smem + weights_at(0));
      cp_async_commit();
      for (int s = 0; s < stages; ++s) {
        const int chunk = s / stages_per_chunk;
        const int kh0 = (s - chunk * stages_per_chunk) * rows_per_stage;
        // One barrier per stage: it publishes stage s (landed for this
        // thread after the wait) and ends every warp's reads of stage s-1,
        // whose buffers the prefetch of stage s+1 then refills while stage s
        // computes.
        cp_async_wait<0>();
        __syncthreads();
        if (s + 1 < stages) {
          // The next chunk's halo goes in during this chunk's last stage.
          if ((s + 1) % stages_per_chunk == 0) {
            load_halo(chunk + 1, smem + halo_at((chunk + 1) & 1));
          }
          load_weights(s + 1, smem + weights_at((s + 1) & 1));
          cp_async_commit();
        }
        const float4* wb = reinterpret_cast<const float4*>(smem + weights_at(s & 1)) + lane;
        for (int r = 0; r < rows_per_stage; ++r) {
          const int a_row = halo_at(chunk & 1) + a_lane + (kh0 + r) * dh * L.halo_cols;
          // Not unrolled: an unrolled tap loop hoists every tap's loads and
          // runs out of registers.
#pragma unroll 1
          for (int kw = 0; kw < KW; ++kw) {
            const int o = a_row + kw * dw;
            float a[2][4];
#pragma unroll
            for (int f = 0; f < 2; ++f) {
              const int of = o + f * a_next_frag;
              a[f][0] = smem[of];
              a[f][1] = smem[of + a_next_col];
              a[f][2] = smem[of + a_next_ch];
              a[f][3] = smem[of + a_next_ch + a_next_col];
            }
            mma_step<kMath>(acc, a, wb + (r * KW + kw) * 4 * 32);
          }
        }
      }

      // Epilogue: bias, then each accumulator to its (channel, pixel).
      const int oh = oh0 + warp;
      if (oh < Ho) {
        float* y_row = y + (int64_t(n) * p.out_channels + int64_t(g) * cout_g) *
                               Ho * Wo +
                       int64_t(oh) * Wo;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int co = co0 + j * 8 + 2 * tig + half;
            if (co >= cout_g) continue;
            const float bv = bias != nullptr ? bias[g * cout_g + co] : 0.f;
            float* y_ch = y_row + int64_t(co) * Ho * Wo;
#pragma unroll
            for (int f = 0; f < 2; ++f) {
              const int ow_a = ow0 + f * 16 + grp, ow_b = ow_a + 8;
              if (ow_a < Wo) y_ch[ow_a] = acc[f][j][half] + bv;
              if (ow_b < Wo) y_ch[ow_b] = acc[f][j][2 + half] + bv;
            }
          }
        }
      }
    }
  }
}

}  // namespace

void launch_fprop_implicit_gemm(const ConvParams& p, const at::Tensor& x,
                                const at::Tensor& w, const float* bias,
                                at::Tensor& y, MathMode math) {
  const cfg::Layout L = cfg::layout(p);
  auto stream = at::cuda::getCurrentCUDAStream();

  const int64_t total = p.groups * int64_t(L.co_tiles) * L.chunks * p.kernel_h *
                        p.kernel_w * cfg::kWeightFloatsPerTap;
  at::Tensor w_frag = at::empty({total}, w.options());
  const int rblocks = static_cast<int>(std::min<int64_t>(ceil_div(total, kThreads), 4096));
  rearrange_weights_kernel<<<rblocks, kThreads, 0, stream>>>(
      p, w.data_ptr<float>(), w_frag.data_ptr<float>(), L.chunks, L.co_tiles, total,
      math == MathMode::kTF32);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  const dim3 grid(ceil_div(p.out_h, cfg::kRows) * ceil_div(p.out_w, cfg::kCols),
                  std::min<int64_t>(p.groups * L.co_tiles, kMaxGridYZ),
                  std::min(p.batch, kMaxGridYZ));
  dispatch_kernel_size(p.kernel_h, p.kernel_w, true, [&](auto kh, auto kw) {
    constexpr int KH = decltype(kh)::value, KW = decltype(kw)::value;
    auto kernel = math == MathMode::kTF32
                      ? fprop_igemm_kernel<KH, KW, TcMath::kTF32>
                      : fprop_igemm_kernel<KH, KW, TcMath::k3xTF32>;
    ensure_dynamic_smem(kernel, L.smem_bytes);
    kernel<<<grid, cfg::kThreads, L.smem_bytes, stream>>>(
        p, x.data_ptr<float>(), w_frag.data_ptr<float>(), bias,
        y.data_ptr<float>(), L);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace cuda
}  // namespace conv2d_ext
