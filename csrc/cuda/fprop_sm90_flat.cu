// Forward pass (fprop) on Hopper's wgmma with pixels as the N dimension.
//
// GEMM view per group and block: M = 64 output channels, N = 256 output
// positions, K = Cin/groups*KH*KW. With Cout = 64, putting pixels in M (the
// other sm_90 kernel) caps a wgmma at n64, so every m64n64k8 reads as many
// operand bytes from shared memory as it does math; here a k8 step is one
// m64n128k8 per half of the 256 positions, B (pixels) read straight from
// shared memory and A (the weights of one tap, 4 registers per thread)
// reused by both halves: half the shared-memory bytes per MMA.
//
// TF32 mode only: 3xTF32 on this layout (big and small halo copies, two
// warpgroups for the per-step temporaries) measured slower than the other
// sm_90 kernel on every benchmark shape (docs/perf-notes.md), so the plan
// sends IEEE mode there.
//
// wgmma reads TF32 B only K-major, so the halo of a chunk of input channels
// is stored channel-interleaved, [4-channel plane][pixel][4 channels], and
// flattened with a power-of-two row pitch P (tile_config.h): the N
// positions of every tap are consecutive 16-byte rows, a tap just moves the
// descriptor's start. Positions in the last (KW-1)*dw columns of each pitch
// wrap into the next halo row; they are computed and not stored. Rows of a
// block are one phase of the dilation (oh0 + dh*r), so the halo needs
// rows + KH - 1 consecutive rows of that phase. Unit stride only.
//
// The halo arrives by 4-byte cp.async into the interleaved layout; each
// thread then rounds to TF32 the elements it copied, under the last wgmmas
// of the previous chunk. Weights come per stage (kernel rows of a chunk) in A-fragment
// order, one 16-byte shared load per thread and k8 step.
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

namespace cfg = igemm_fprop_flat;

// Weights [Cout][Cin/g][KH][KW] -> [group][co tile][chunk][kh][kw][k8 step]
// [warp (4)][lane (32)][4]: the lane's wgmma A fragment (rows warp*16 +
// lane/4 (+8), columns lane%4 (+4)), zero outside the real channels, rounded
// to TF32.
__global__ void __launch_bounds__(kThreads)
    rearrange_flat_weights_kernel(const ConvParams p, const float* __restrict__ w,
                                  float* __restrict__ out, int chunks, int ksteps,
                                  int co_tiles, int64_t total, WeightOrder order) {
  for (int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * kThreads) {
    const WeightTileIndex t = decode_weight_tile_index(e, cfg::kStepFloats, ksteps, p.kernel_h,
                                                       p.kernel_w, chunks, co_tiles);
    const int element = t.within & 3, lane = (t.within >> 2) & 31, warp = t.within >> 7;
    const int m = warp * 16 + (lane >> 2) + 8 * (element & 1);
    const int k = (lane & 3) + 4 * (element >> 1);
    const float v = weight_or_zero(p, w, order, t.g, t.co_tile * cfg::kCo + m,
                                   (t.chunk * ksteps + t.kstep) * 8 + k, t.kh, t.kw);
    out[e] = __uint_as_float(tf32_round(v));
  }
}

template <int KH_T, int KW_T>
__global__ void __launch_bounds__(cfg::kThreads, 2)
    fprop_flat_kernel(const ConvParams p, const float* __restrict__ x,
                      const float* __restrict__ w_frag, const float* __restrict__ bias,
                      float* __restrict__ y, const cfg::Layout L) {
  extern __shared__ __align__(16) float smem[];
  const int KH = static_or<KH_T>(p.kernel_h);
  const int KW = static_or<KW_T>(p.kernel_w);
  const int H = p.in_h, W = p.in_w, Ho = p.out_h, Wo = p.out_w;
  const int HW = H * W;
  const int cin_g = p.in_channels_per_group();
  const int cout_g = p.out_channels_per_group();
  const int dh = p.dilation_h, dw = p.dilation_w;
  const int log2_pitch = L.log2_pitch, pitch = 1 << log2_pitch;
  const int hp = L.halo_pixels;

  // Shared memory, in floats: two halo buffers (planes of hp pixels x 4
  // channels), then two weight stages.
  const int planes = 2 * L.ksteps;
  const int plane_floats = 4 * hp;
  const int halo_floats = planes * plane_floats;
  const int step_floats = cfg::kStepFloats;
  const int stage_steps = L.rows_per_stage * KW * L.ksteps;
  const int stage_floats = stage_steps * step_floats;
  auto halo_at = [&](int buf) { return buf * halo_floats; };
  auto weights_at = [&](int buf) { return 2 * halo_floats + buf * stage_floats; };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int grp = lane >> 2, tig = lane & 3;
  const int tile_h = blockIdx.x / L.tiles_w;
  const int ow0 = (blockIdx.x - tile_h * L.tiles_w) * L.out_cols;
  const int oh0 = (tile_h / dh) * L.rows * dh + tile_h % dh;  // rows oh0 + dh*r
  const int ih0 = oh0 - p.pad_h, iw0 = ow0 - p.pad_w;

  const int stages_per_chunk = KH / L.rows_per_stage;
  const int stages = L.chunks * stages_per_chunk;
  // Lanes of a warp write 16-byte rows; starting each group of 8 lanes on
  // a different channel puts their 4-byte copies in 32 different banks.
  const int ch_rot = lane >> 3;

  for (int gy = blockIdx.y; gy < p.groups * L.co_tiles; gy += gridDim.y) {
    const int g = gy / L.co_tiles;
    const int co0 = (gy % L.co_tiles) * cfg::kCo;
    const float* w_tile = w_frag + int64_t(gy) * stages * stage_floats;

    for (int n = blockIdx.z; n < p.batch; n += gridDim.z) {
      const float* x_img = x + (int64_t(n) * p.in_channels + int64_t(g) * cin_g) * HW;
      auto load_halo = [&](int chunk, int buf) {
        const int c0 = chunk * 8 * L.ksteps;
#pragma unroll 1
        for (int plane = 0; plane < planes; ++plane) {
          // The plane's 4 channel pointers, in this lane's rotated order.
          const float* src[4];
          bool ch_ok[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int c = c0 + plane * 4 + ((e + ch_rot) & 3);
            ch_ok[e] = c < cin_g;
            src[e] = x_img + int64_t(ch_ok[e] ? c : 0) * HW;
          }
          float* dst = smem + halo_at(buf) + plane * plane_floats;
#pragma unroll 1
          for (int i = threadIdx.x; i < hp; i += cfg::kThreads) {
            const int ih = ih0 + dh * (i >> log2_pitch), iw = iw0 + (i & (pitch - 1));
            const bool in = unsigned(ih) < unsigned(H) && unsigned(iw) < unsigned(W);
            const int at = in ? ih * W + iw : 0;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              cp_async_4(dst + 4 * i + ((e + ch_rot) & 3), src[e] + at, in && ch_ok[e]);
            }
          }
        }
      };
      // Rounds the elements this thread copied (visible to it after its
      // cp.async wait); a later barrier publishes them.
      auto convert_halo = [&](int buf) {
        float* dst = smem + halo_at(buf);
#pragma unroll 1
        for (int plane = 0; plane < planes; ++plane)
#pragma unroll 1
        for (int i = threadIdx.x; i < hp; i += cfg::kThreads) {
          const int idx = plane * hp + i;  // as load_halo visits them
          float4* v = reinterpret_cast<float4*>(dst) + idx;
          const float4 t = *v;
          *v = make_float4(__uint_as_float(tf32_round(t.x)), __uint_as_float(tf32_round(t.y)),
                           __uint_as_float(tf32_round(t.z)), __uint_as_float(tf32_round(t.w)));
        }
      };
      auto load_weights = [&](int stage, int buf) {
        const float* src = w_tile + int64_t(stage) * stage_floats;
        float* dst = smem + weights_at(buf);
        for (int i = threadIdx.x; i < stage_floats / 4; i += cfg::kThreads) {
          cp_async_16(dst + 4 * i, src + 4 * i);
        }
      };

      float acc[2][16][4];
      zero_fragments(acc);

      __syncthreads();  // buffers free (previous image or channel tile)
      load_halo(0, 0);
      load_weights(0, 0);
      cp_async_commit();
      for (int s = 0; s < stages; ++s) {
        const int chunk = s / stages_per_chunk;
        const int within = s - chunk * stages_per_chunk;
        const bool next_halo = within == 0 && chunk + 1 < L.chunks;
        // Copy groups are committed as [weights s+1][halo chunk+1] in a
        // chunk's first stage: its second stage waits for its weights only.
        if (within == 1 && chunk + 1 < L.chunks) {
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
        if (s == 0) convert_halo(0);
        fence_proxy_async_smem();  // both operands are read by wgmma
        __syncthreads();
        // Stage s-1 is done everywhere: its weight buffer, and at a chunk's
        // first stage the previous chunk's halo buffer, can be refilled.
        if (s + 1 < stages) {
          load_weights(s + 1, (s + 1) & 1);
          cp_async_commit();
        }
        if (next_halo) {
          load_halo(chunk + 1, (chunk + 1) & 1);
          cp_async_commit();
        }

        // The next chunk's halo, copied since this chunk's first stage, is
        // rounded while the last wgmmas of the chunk run.
        const bool last_of_chunk = within == stages_per_chunk - 1 && chunk + 1 < L.chunks;
        auto prepare_next_chunk = [&]() {
          if (last_of_chunk) {
            cp_async_wait<0>();
            convert_halo((chunk + 1) & 1);
          }
        };
        const uint32_t halo_addr = smem_addr(smem + halo_at(chunk & 1));
        const uint32_t plane_bytes = 4 * plane_floats;
        const float* w_stage = smem + weights_at(s & 1) + 4 * threadIdx.x;
        // Step order: taps in (kernel row, kernel column) order, k8 steps
        // within a tap. `off` is the tap's first halo pixel.
        int off = within * L.rows_per_stage * pitch;
        int kw = 0, k = 0;
        auto desc_of = [&]() {
          return wgmma_desc(halo_addr + 16 * off + 2 * k * plane_bytes, plane_bytes, 128);
        };
        auto advance = [&]() {
          if (++k < L.ksteps) return;
          k = 0;
          if (++kw == KW) {
            kw = 0;
            off += pitch - (KW - 1) * dw;
          } else {
            off += dw;
          }
        };
        auto load_a = [&](int t) {
          return *reinterpret_cast<const float4*>(w_stage + t * step_floats);
        };
        // The second half's 128 positions start 2 KB further.
        constexpr uint64_t kHalfDesc = (cfg::kHalf * 16) >> 4;

        {
          // A registers stay untouched until the wgmma group reading them
          // completes, hence two sets and wait_group 1 before a refill.
          auto to_a = [](const float4& v, uint32_t (&a)[4]) {
            a[0] = __float_as_uint(v.x);
            a[1] = __float_as_uint(v.y);
            a[2] = __float_as_uint(v.z);
            a[3] = __float_as_uint(v.w);
          };
          auto issue = [&](const uint32_t (&a)[4]) {
            const uint64_t desc = desc_of();
            advance();
            wgmma_fence();
            wgmma_m64n128k8_tf32(acc[0], a, desc, true);
            wgmma_m64n128k8_tf32(acc[1], a, desc + kHalfDesc, true);
            wgmma_commit();
          };
          uint32_t a0[4], a1[4];
          to_a(load_a(0), a0);
#pragma unroll 1
          for (int t = 0; t < stage_steps; t += 2) {
            issue(a0);
            if (t + 1 < stage_steps) {
              wgmma_wait<1>();  // step t-1, the last reader of a1, is done
              to_a(load_a(t + 1), a1);
              issue(a1);
              if (t + 2 < stage_steps) {
                wgmma_wait<1>();  // step t is done with a0
                to_a(load_a(t + 2), a0);
              }
            }
          }
          prepare_next_chunk();
          // The next stage refills these buffers; the epilogue reads acc.
          wgmma_wait<0>();
          wgmma_fence_operands(acc[0]);
          wgmma_fence_operands(acc[1]);
        }
      }

      // Epilogue: row m of the tile is output channel co0 + m (this lane
      // holds rows m and m + 8); column o is position (o / P, o % P) of the
      // flattened tile. A lane's two accumulators of a row are neighbouring
      // positions: stored as one 8-byte write where both are stored and
      // aligned, so that the 4 lanes of a row fill a whole 32-byte sector.
      // The positions do not depend on the image or channel tile; hidden
      // behind an empty asm, they are not hoisted out of those loops, where
      // they would stay live (and spill) across the main loop.
      int col0 = 2 * tig;
      asm volatile("" : "+r"(col0));
      const int co_lo = co0 + warp * 16 + grp, co_hi = co_lo + 8;
      const bool lo_ok = co_lo < cout_g, hi_ok = co_hi < cout_g;
      const float bias_lo = bias != nullptr && lo_ok ? bias[g * cout_g + co_lo] : 0.f;
      const float bias_hi = bias != nullptr && hi_ok ? bias[g * cout_g + co_hi] : 0.f;
      const int64_t lo_plane = (int64_t(n) * p.out_channels + int64_t(g) * cout_g + co_lo) * Ho * Wo;
      float* y_lo = y + lo_plane;
      const int64_t hi_offset = int64_t(8) * Ho * Wo;
      // Parity of the element offset of (row 0, column 0) in both planes
      // (8 planes apart: same parity).
      const int parity = static_cast<int>(lo_plane & 1);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const int o = h * cfg::kHalf + j * 8 + col0;  // even; o + 1 in the same row
          const int c = o & (pitch - 1);
          const int oh = oh0 + dh * (o >> log2_pitch), ow = ow0 + c;
          if (oh >= Ho || c >= L.out_cols || ow >= Wo) continue;
          float* dst = y_lo + oh * Wo + ow;
          const float* v = acc[h][j];
          if (c + 1 < L.out_cols && ow + 1 < Wo && ((parity + oh * Wo + ow) & 1) == 0) {
            if (lo_ok) *reinterpret_cast<float2*>(dst) = make_float2(v[0] + bias_lo, v[1] + bias_lo);
            if (hi_ok) {
              *reinterpret_cast<float2*>(dst + hi_offset) = make_float2(v[2] + bias_hi, v[3] + bias_hi);
            }
          } else {
            if (lo_ok) dst[0] = v[0] + bias_lo;
            if (hi_ok) dst[hi_offset] = v[2] + bias_hi;
            if (c + 1 < L.out_cols && ow + 1 < Wo) {
              if (lo_ok) dst[1] = v[1] + bias_lo;
              if (hi_ok) dst[hi_offset + 1] = v[3] + bias_hi;
            }
          }
        }
    }
  }
}

}  // namespace

void launch_fprop_sm90_flat(const ConvParams& p, const at::Tensor& x, const at::Tensor& w,
                            const float* bias, at::Tensor& y, WeightOrder order) {
  const cfg::Layout L = cfg::choose_layout(p);
  TORCH_CHECK(L.smem_bytes != INT64_MAX, "conv2d_ext: internal error: the plan picked the "
              "sm_90 flat kernel for a problem it does not fit");
  auto stream = at::cuda::getCurrentCUDAStream();

  const int64_t total = p.groups * int64_t(L.co_tiles) * L.chunks * p.kernel_h * p.kernel_w *
                        L.ksteps * cfg::kStepFloats;
  at::Tensor w_tiles = at::empty({total}, w.options());
  const int rblocks = static_cast<int>(std::min<int64_t>(ceil_div(total, kThreads), 4096));
  rearrange_flat_weights_kernel<<<rblocks, kThreads, 0, stream>>>(
      p, w.data_ptr<float>(), w_tiles.data_ptr<float>(), L.chunks, L.ksteps, L.co_tiles,
      total, order);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  const dim3 grid(static_cast<unsigned>(int64_t(L.tiles_w) * L.tiles_h),
                  std::min<int64_t>(p.groups * L.co_tiles, kMaxGridYZ),
                  std::min(p.batch, kMaxGridYZ));
  dispatch_kernel_size(p.kernel_h, p.kernel_w, /*specialise=*/true, [&](auto kh, auto kw) {
    constexpr int KH = decltype(kh)::value, KW = decltype(kw)::value;
    auto kernel = fprop_flat_kernel<KH, KW>;
    ensure_dynamic_smem(kernel, L.smem_bytes);
    kernel<<<grid, cfg::kThreads, L.smem_bytes, stream>>>(
        p, x.data_ptr<float>(), w_tiles.data_ptr<float>(), bias, y.data_ptr<float>(), L);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace cuda
}  // namespace conv2d_ext
