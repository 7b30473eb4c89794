// Forward pass (fprop) on tensor cores: implicit GEMM with mma.sync TF32.
//
// GEMM view per group: M = output pixels, N = Cout/groups, K =
// Cin/groups*KH*KW. A block computes 8 output rows x 32 columns x 64 output
// channels with 4 warps; a warp owns two output rows (four m16 fragments)
// and all 64 channels (eight n8 fragments), so each B fragment it reads from
// shared memory feeds four MMAs. K advances 8 input channels at a time: the
// input halo tile of those channels is staged in shared memory once (NCHW
// order, zero-filled at borders) and read by every tap of the kernel, so
// taps cost shared-memory reads, not global traffic. The weights, rearranged
// once per call into fragment order, stream one kernel row per stage (all
// rows of the chunk for kernels of at most 16 taps). Stages are
// double-buffered with cp.async behind one barrier each.
//
// Math: TF32 rounds each operand to nearest; 3xTF32 splits each into
// big + small and accumulates small*big + big*small before big*big.

#include "../common.cuh"
#include "../kernel_sizes.cuh"
#include "../mma.cuh"
#include "config.h"
#include "implicit_gemm.h"

namespace conv2d_ext {
namespace cuda {
namespace {

namespace cfg = igemm_fprop;

// Weights [Cout][Cin/g][KH][KW] -> per (group, co tile):
// [chunk][kh][kw][one tap's B tile of 64 channels x 8 input channels], zero
// outside the real channels, so that one kernel row of one chunk is a
// contiguous stage. The tap tile is laid out for its main loop:
// - mma.sync: [pair of n-fragments (4)][lane (32)][b0, b1 of fragment
//   2*pair, b0, b1 of fragment 2*pair+1]: a lane loads its B fragments for
//   two n-fragments with one 16-byte read. Rounded to TF32 in TF32 mode.
// - wgmma: core matrices [n-block (8)][k-block (2)][n (8)][k (4)] (see
//   wgmma_desc_k8), rounded in TF32 mode; for 3xTF32 the big parts, then
//   the small parts as a second tile.
__global__ void __launch_bounds__(kThreads)
    rearrange_weights_kernel(const ConvParams p, const float* __restrict__ w,
                             float* __restrict__ out, int chunks, int co_tiles,
                             int64_t total, bool sm90, MathMode math, WeightOrder order) {
  const bool tf32x3 = sm90 && math == MathMode::kIEEE;
  const int per_tap = cfg::weight_floats_per_tap(sm90, tf32x3);
  for (int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * kThreads) {
    const WeightTileIndex t = decode_weight_tile_index(e, per_tap, 1, p.kernel_h, p.kernel_w,
                                                       chunks, co_tiles);
    const int within = t.within;
    int n, k;
    if (sm90) {
      n = ((within >> 6) & 7) * 8 + ((within >> 2) & 7);
      k = ((within >> 5) & 1) * 4 + (within & 3);
    } else {
      const int element = within & 3, lane = (within >> 2) & 31, pair = within >> 7;
      n = (2 * pair + (element >> 1)) * 8 + (lane >> 2);
      k = (lane & 3) + 4 * (element & 1);
    }
    float v = weight_or_zero(p, w, order, t.g, t.co_tile * cfg::kCo + n,
                             t.chunk * cfg::kChunk + k, t.kh, t.kw);
    if (math == MathMode::kTF32) {
      v = __uint_as_float(tf32_operand(v));
    } else if (tf32x3) {
      uint32_t big, small;
      tf32_split(v, big, small);
      v = __uint_as_float(within < cfg::kCo * cfg::kChunk ? big : small);
    }
    out[e] = v;
  }
}

// One tap's operands in registers: A (kFrags m-fragments) and B (8
// n-fragments, two per float4 as the weights are rearranged).
template <int kFrags>
struct TapOperands {
  float a[kFrags][4];
  float4 b[4];
};

// One k8 step of the warp tile. Operands are rounded or split one B
// fragment at a time to keep register pressure down.
template <MathMode kMath, int kFrags>
__device__ __forceinline__ void mma_step(float (&acc)[kFrags][8][4],
                                         const TapOperands<kFrags>& op) {
  const auto& a = op.a;
  uint32_t a_big[kFrags][4], a_small[kFrags][4];
#pragma unroll
  for (int f = 0; f < kFrags; ++f)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (kMath == MathMode::kTF32) {
        a_big[f][i] = tf32_operand(a[f][i]);
      } else {
        tf32_split(a[f][i], a_big[f][i], a_small[f][i]);
      }
    }
#pragma unroll
  for (int pr = 0; pr < 4; ++pr) {
    const float4 v = op.b[pr];
    const float raw[2][2] = {{v.x, v.y}, {v.z, v.w}};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = 2 * pr + h;
      uint32_t b_big[2], b_small[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if constexpr (kMath == MathMode::kTF32) {
          b_big[i] = __float_as_uint(raw[h][i]);  // rounded when rearranged
        } else {
          tf32_split(raw[h][i], b_big[i], b_small[i]);
        }
      }
#pragma unroll
      for (int f = 0; f < kFrags; ++f) {
        if constexpr (kMath == MathMode::kIEEE) {
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

template <int KH_T, int KW_T, MathMode kMath, bool kSm90>
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
  // Specialised kernel sizes run at unit stride only (see the launch): the
  // A operand's column offsets then become immediates of the shared loads.
  const int sh = KH_T > 0 ? 1 : p.stride_h, sw = KH_T > 0 ? 1 : p.stride_w;
  const int dh = p.dilation_h, dw = p.dilation_w;
  const int rows_per_stage = L.rows_per_stage;
  const int stage_floats = rows_per_stage * KW * L.weight_floats_per_tap;
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

  const int ih0 = oh0 * sh - p.pad_h, iw0 = ow0 * sw - p.pad_w;
  const int halo_area = L.halo_rows * L.halo_cols;

  // Offset of this lane's first A element for tap (0, 0) in a halo buffer;
  // a tap adds kh*dh rows and kw*dw columns. The other elements of a
  // fragment sit 8 columns and 4 channel planes away; the warp's second m16
  // fragment of a row 16 columns, its second row one output row down.
  const int a_lane = warp * cfg::kRowsPerWarp * sh * L.halo_cols + tig * L.plane + grp * sw;
  const int a_next_col = 8 * sw, a_next_ch = 4 * L.plane, a_next_frag = 16 * sw;
  const int a_next_row = sh * L.halo_cols;

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
        const int c0 = chunk * cfg::kChunk;
        const float* chunk_src = x_img + int64_t(c0) * HW;
        // Positions are recomputed per chunk rather than kept in registers
        // across the main loop, where the accumulators need them.
#pragma unroll 1
        for (int idx = threadIdx.x; idx < halo_area; idx += cfg::kThreads) {
          const int hr = idx / L.halo_cols, hc = idx - hr * L.halo_cols;
          const int ih = ih0 + hr, iw = iw0 + hc;
          const bool in = ih >= 0 && ih < H && iw >= 0 && iw < W;
          const float* src = chunk_src + (in ? ih * W + iw : 0);
#pragma unroll
          for (int ci = 0; ci < cfg::kChunk; ++ci) {
            const bool ok = in && c0 + ci < cin_g;
            cp_async_4(dst + ci * L.plane + idx, ok ? src + int64_t(ci) * HW : x, ok);
          }
        }
      };
      auto load_weights = [&](int stage, float* dst) {
        const float* src = w_tile + int64_t(stage) * stage_floats;
        for (int i = threadIdx.x; i < stage_floats / 4; i += cfg::kThreads) {
          cp_async_16(dst + 4 * i, src + 4 * i);
        }
      };

      float acc[cfg::kWarpFrags][8][4];
      zero_fragments(acc);

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
        if constexpr (kSm90) fence_proxy_async_smem();  // B is read by wgmma
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
        // The stage's taps in (kernel row, kernel column) order. `off` is
        // this lane's first A element of the tap; the other A elements sit
        // at fixed offsets from it: a_next_ch (channels tig + 4), a_next_row
        // (the warp's second output row) and column offsets that are
        // immediates at unit stride.
        const int taps = rows_per_stage * KW;
        const int row_step = dh * L.halo_cols - (KW - 1) * dw;
        int off = halo_at(chunk & 1) + a_lane + kh0 * dh * L.halo_cols;
        int kw = 0;
        auto load_a = [&](float (&a)[cfg::kWarpFrags][4]) {  // and step to the next tap
#pragma unroll
          for (int f = 0; f < cfg::kWarpFrags; ++f) {
            const float* lo = smem + off + (f >> 1) * a_next_row + (f & 1) * a_next_frag;
            a[f][0] = lo[0];
            a[f][1] = lo[a_next_col];
            a[f][2] = lo[a_next_ch];
            a[f][3] = lo[a_next_ch + a_next_col];
          }
          if (++kw == KW) {
            kw = 0;
            off += row_step;
          } else {
            off += dw;
          }
        };
        auto load_tap = [&](int t, TapOperands<cfg::kWarpFrags>& op) {
          load_a(op.a);
#pragma unroll
          for (int pr = 0; pr < 4; ++pr) op.b[pr] = wb[t * 4 * 32 + pr * 32];
        };
        if constexpr (kSm90 && kMath == MathMode::kIEEE) {
          // Per tap and m16 fragment, small*big + big*small + big*big into a
          // zeroed temporary (the first wgmma does not accumulate), which
          // is then added to the sum with round-to-nearest FADDs, as in the
          // mma.sync loop. Two temporaries alternate so that one fragment's
          // wgmmas run while the other's sum is added.
          const uint32_t tap_big = smem_addr(smem + weights_at(s & 1));
          const uint32_t tap_bytes = 4 * L.weight_floats_per_tap;
          const uint32_t small_offset = 4 * cfg::kCo * cfg::kChunk;
#pragma unroll 1
          for (int t = 0; t < taps; ++t) {
            uint32_t a_big[cfg::kWarpFrags][4], a_small[cfg::kWarpFrags][4];
            {
              float a[cfg::kWarpFrags][4];
              load_a(a);
#pragma unroll
              for (int f = 0; f < cfg::kWarpFrags; ++f)
#pragma unroll
                for (int i = 0; i < 4; ++i) tf32_split(a[f][i], a_big[f][i], a_small[f][i]);
            }
            const uint64_t big = wgmma_desc_k8(tap_big + t * tap_bytes);
            const uint64_t small = wgmma_desc_k8(tap_big + t * tap_bytes + small_offset);
            float tmp[2][8][4];
            auto issue = [&](int f) {
              wgmma_fence();
              wgmma_m64n64k8_3xtf32(tmp[f & 1], a_big[f], a_small[f], big, small, false);
              wgmma_commit();
            };
            auto add = [&](int f) {
              wgmma_fence_operands(tmp[f & 1]);
#pragma unroll
              for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[f][j][i] += tmp[f & 1][j][i];
            };
            static_assert(cfg::kWarpFrags == 4, "the issue/add sequence below");
            issue(0);
            issue(1);
            wgmma_wait<1>();
            add(0);
            issue(2);
            wgmma_wait<1>();
            add(1);
            issue(3);
            wgmma_wait<1>();
            add(2);
            wgmma_wait<0>();
            add(3);
          }
        } else if constexpr (kSm90) {
          // The warpgroup (the whole block) issues one m64n64k8 per m16
          // fragment of its warps: B comes straight from the staged weights,
          // A from registers, which must stay untouched until the wgmma
          // group reading them has completed, hence two register sets.
          const uint32_t b_stage = smem_addr(smem + weights_at(s & 1));
          const uint32_t tap_bytes = 4 * L.weight_floats_per_tap;
          using AFrags = uint32_t[cfg::kWarpFrags][4];
          auto load_rounded = [&](AFrags& ab) {
            float a[cfg::kWarpFrags][4];
            load_a(a);
#pragma unroll
            for (int f = 0; f < cfg::kWarpFrags; ++f)
#pragma unroll
              for (int i = 0; i < 4; ++i) ab[f][i] = tf32_operand(a[f][i]);
          };
          auto issue = [&](int t, const AFrags& ab) {
            const uint64_t desc = wgmma_desc_k8(b_stage + t * tap_bytes);
            wgmma_fence();
#pragma unroll
            for (int f = 0; f < cfg::kWarpFrags; ++f) {
              wgmma_m64n64k8_tf32(acc[f], ab[f], desc, true);
            }
            wgmma_commit();
          };
          AFrags ab0, ab1;
          load_rounded(ab0);
#pragma unroll 1
          for (int t = 0; t < taps; t += 2) {
            issue(t, ab0);
            if (t + 1 < taps) {
              wgmma_wait<1>();  // tap t-1, the last reader of ab1, is done
              load_rounded(ab1);
              issue(t + 1, ab1);
              if (t + 2 < taps) {
                wgmma_wait<1>();  // tap t is done with ab0
                load_rounded(ab0);
              }
            }
          }
          // The next stage's prefetch overwrites these weights, and the
          // epilogue reads the accumulators.
          wgmma_wait<0>();
#pragma unroll
          for (int f = 0; f < cfg::kWarpFrags; ++f) wgmma_fence_operands(acc[f]);
        } else {
          // mma.sync, both modes. Loading the next tap's operands during
          // this tap's MMAs (two register sets) was no faster.
#pragma unroll 1
          for (int t = 0; t < taps; ++t) {
            TapOperands<cfg::kWarpFrags> op;
            load_tap(t, op);
            mma_step<kMath>(acc, op);
          }
        }
      }

      // Epilogue: bias, then each accumulator to its (channel, pixel).
#pragma unroll
      for (int f = 0; f < cfg::kWarpFrags; ++f) {
        const int oh = oh0 + warp * cfg::kRowsPerWarp + (f >> 1);
        if (oh >= Ho) continue;
        float* y_row = y + (int64_t(n) * p.out_channels + int64_t(g) * cout_g) *
                               Ho * Wo +
                       int64_t(oh) * Wo;
        const int ow_a = ow0 + (f & 1) * 16 + grp, ow_b = ow_a + 8;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int co = co0 + j * 8 + 2 * tig + half;
            if (co >= cout_g) continue;
            const float bv = bias != nullptr ? bias[g * cout_g + co] : 0.f;
            float* y_ch = y_row + int64_t(co) * Ho * Wo;
            if (ow_a < Wo) y_ch[ow_a] = acc[f][j][half] + bv;
            if (ow_b < Wo) y_ch[ow_b] = acc[f][j][2 + half] + bv;
          }
        }
      }
    }
  }
}

}  // namespace

void launch_fprop_implicit_gemm(const ConvParams& p, const at::TensorBase& x,
                                const at::TensorBase& w, const float* bias, at::TensorBase& y,
                                MathMode math, bool sm90, WeightOrder order) {
  const bool tf32x3 = sm90 && math == MathMode::kIEEE;  // weights pre-split
  const cfg::Layout L = cfg::choose_layout(p, cfg::weight_floats_per_tap(sm90, tf32x3));
  auto stream = current_stream();

  const int64_t total = p.groups * int64_t(L.co_tiles) * L.chunks * p.kernel_h *
                        p.kernel_w * L.weight_floats_per_tap;
  at::TensorBase w_tiles = scratch({total}, w.scalar_type());
  const int rblocks = static_cast<int>(std::min<int64_t>(ceil_div(total, kThreads), 4096));
  rearrange_weights_kernel<<<rblocks, kThreads, 0, stream>>>(
      p, w.data_ptr<float>(), w_tiles.data_ptr<float>(), L.chunks, L.co_tiles, total,
      sm90, math, order);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  const dim3 grid(ceil_div(p.out_h, cfg::kRows) * ceil_div(p.out_w, cfg::kCols),
                  std::min<int64_t>(p.groups * L.co_tiles, kMaxGridYZ),
                  std::min(p.batch, kMaxGridYZ));
  const bool unit_stride = p.stride_h == 1 && p.stride_w == 1;
  dispatch_kernel_size(p.kernel_h, p.kernel_w, unit_stride, [&](auto kh, auto kw) {
    constexpr int KH = decltype(kh)::value, KW = decltype(kw)::value;
    auto kernel = sm90 ? (math == MathMode::kTF32
                               ? fprop_igemm_kernel<KH, KW, MathMode::kTF32, true>
                               : fprop_igemm_kernel<KH, KW, MathMode::kIEEE, true>)
                  : math == MathMode::kTF32
                      ? fprop_igemm_kernel<KH, KW, MathMode::kTF32, false>
                      : fprop_igemm_kernel<KH, KW, MathMode::kIEEE, false>;
    ensure_dynamic_smem(kernel, L.smem_bytes);
    kernel<<<grid, cfg::kThreads, L.smem_bytes, stream>>>(
        p, x.data_ptr<float>(), w_tiles.data_ptr<float>(), bias,
        y.data_ptr<float>(), L);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace cuda
}  // namespace conv2d_ext
