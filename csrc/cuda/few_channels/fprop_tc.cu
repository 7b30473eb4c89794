// Forward for few input channels per group and many output channels (RGB
// stems) on TF32 tensor cores: TF32 in TF32 mode, 3xTF32 in IEEE mode;
// mma.sync on sm_80+, and on Hopper wgmma (few_channels/fprop_sm90.cuh),
// with the output stored through the tensor-copy engine where whole boxes
// fit. The FFMA wide kernel (few_channels/fprop.cu) is issue-bound well
// below the FFMA peak, while on the tensor cores this GEMM's floor is the
// output, written once (docs/kernels.md, "Few channels on tensor cores").
//
// GEMM view per group: M = Cout/groups (64-channel tiles, one per block for
// its whole life), K = Cin/groups * KH * KW (the (input channel, tap) pairs
// in k8 steps), N = output pixels. A stage is 4 output rows x 64 columns of
// one image: each warp one row and 32 columns (4 n8 tiles), all 64 rows of
// M. Blocks stride over the stages; each stage's input halo lands in a raw
// buffer (tensor-copy engine on Hopper, async copies elsewhere) while the
// previous stage computes, and is then rounded to TF32 in place, or split
// into [big, small] pairs in a buffer of its own (one 8-byte load gives
// both), once per block.
//
// A, the weights, is staged once per block (rounded or split) as [channel]
// [k] rows and read by ldmatrix. B, the input at each k's (channel, tap)
// offset and each pixel's column times the stride, by 4-byte shared loads
// through a table of the k offsets: a gather no 16-byte layout serves.
//
// A pixel's outputs depend only on its own B column, so columns past the
// output's edge compute garbage that is never stored. K past the group's
// pairs has zero weights but may meet Inf or NaN input (0 * Inf = NaN):
// B is zeroed there.
//
// Accuracy in IEEE mode: the tensor cores truncate (round toward zero) as
// they accumulate, by up to an ulp of the running sum. A k8 step's three
// products go into a fresh temporary, small ones first, so that one
// truncation per step is at the size of the big products; FADDs (rounded
// to nearest) add the temporaries up. Two steps per temporary (four such
// truncations per temporary) left more error than cuDNN's FP32 on short
// reductions.

#include "../../plan.h"
#include "../mma.cuh"
#include "../tensor_map.h"
#include "few_channels.cuh"
#include "few_channels.h"
#include "fprop_sm90.cuh"

namespace conv2d_ext {
namespace cuda {
namespace {

namespace fc = conv2d_ext::few_channels;
using few_channels::HaloCols;

constexpr int kBlock = fc::kThreads;
constexpr int kWarps = kBlock / 32;
using fprop_tc::kCo;
using fprop_tc::kOutBoxFloats;
constexpr int kMTiles = kCo / 16;
constexpr int kNT = fc::kFpropTcWarpN;
constexpr int kRows = fc::kFpropTcRows;
static_assert(kWarps == 2 * kRows && 2 * 8 * kNT == fc::kTileCols,
              "two warps a row, 32 columns each");

// kSW: the column stride at compile time (n8 tiles' loads then differ by
// immediate offsets), or 0 for any. kSm90: Hopper's warpgroup MMA with the
// GEMM turned around (sm_90a code only; see few_channels/fprop_sm90.cuh).
template <bool kTf32x3, int kSW, bool kSm90>
__global__ void __launch_bounds__(kBlock, kTf32x3 || kSm90 ? 1 : 2)
    fprop_tc_kernel(const __grid_constant__ CUtensorMap x_map,
                    const __grid_constant__ CUtensorMap y_map, const ConvParams p,
                    const float* __restrict__ x, const float* __restrict__ w,
                    const float* __restrict__ bias, float* __restrict__ y,
                    const fc::FpropTcLayout L, bool vec, bool tma, bool vec_out, bool tma_out) {
  extern __shared__ float4 smem4[];
  __shared__ uint64_t staged[2];
  static_assert(sizeof(staged) <= fc::kFpropTcStaticSmemBytes, "the plan's budget");
  // The tensor-copy engine writes 128-byte aligned boxes (the launch adds
  // the slack).
  float* const smem = reinterpret_cast<float*>(smem4) +
                      ((128 - (smem_addr(smem4) & 127)) & 127) / 4;
  const int cin_g = p.in_channels_per_group(), cout_g = p.out_channels_per_group();
  const int KW = p.kernel_w, taps = p.kernel_h * KW;
  const int H = p.in_h, W = p.in_w, Ho = p.out_h, Wo = p.out_w;
  const int sh = p.stride_h, sw = kSW > 0 ? kSW : p.stride_w;
  const int n_total = cin_g * taps;
  const int pitch = L.pitch, plane = L.halo_rows * pitch, wpitch = L.weight_pitch;

  // blockIdx.y -> (group, channel tile); blockIdx.x strides over stages.
  const int co_tiles = (cout_g + kCo - 1) / kCo;
  const int co0 = (blockIdx.y % co_tiles) * kCo;
  const int g = blockIdx.y / co_tiles;
  const int co_here = min(kCo, cout_g - co0);

  // Shared memory (floats): weights (big, then small for 3xTF32), the k
  // offset table, two raw halo buffers, 3xTF32's split one (twice as large).
  float* const w_big = smem;
  const int w_floats = fc::fprop_tc_weight_floats(L, kSm90);
  [[maybe_unused]] float* const w_small = smem + w_floats;
  int* const k_table = reinterpret_cast<int*>(smem + (kTf32x3 ? 2 : 1) * w_floats);
  // wgmma: the tile's bias after the table (registers are short there).
  [[maybe_unused]] float* const bias_s = reinterpret_cast<float*>(k_table) + L.k_steps * 8;
  float* const buf0 = smem + (kTf32x3 ? 2 : 1) * w_floats + L.table_floats;
  auto buffer = [&](int b) { return buf0 + b * L.buffer_floats; };
  [[maybe_unused]] float* const tf32x3_buf = buffer(2);
  // wgmma with stores by tensor copy: each warpgroup's two output boxes, 1024-
  // byte aligned for the swizzle (the launch adds the slack).
  [[maybe_unused]] float* const out_stage =
      buffer(kTf32x3 ? 4 : 2) + ((1024 - (smem_addr(buffer(kTf32x3 ? 4 : 2)) & 1023)) & 1023) / 4;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gq = lane >> 2, tq = lane & 3;

  // The weights [co][k] of this channel tile, zero past the group's
  // channels and pairs; then each k's offset in a halo buffer, laid out so
  // that lane tq reads the offsets of k = 8t + tq and 8t + tq + 4 as one
  // 8-byte word at step t.
  const float* w_tile = w + (int64_t(g) * cout_g + co0) * n_total;
  const int w_elems = kSm90 ? L.k_steps * 8 * kCo : kCo * wpitch;
  for (int e = threadIdx.x; e < w_elems; e += kBlock) {
    int co, k;
    if constexpr (kSm90) {  // [k8 step][8-channel block][k half][channel (8)][k (4)]
      const int r = e & 511;
      co = (r >> 6) * 8 + ((r >> 2) & 7);
      k = (e >> 9) * 8 + ((r >> 5) & 1) * 4 + (r & 3);
    } else {
      co = e / wpitch;
      k = e - co * wpitch;
    }
    const float v = co < co_here && k < n_total ? w_tile[int64_t(co) * n_total + k] : 0.f;
    if constexpr (kTf32x3) {
      uint32_t big, small;
      tf32_split</*kRoundBig=*/true, /*kRoundSmall=*/true>(v, big, small);
      w_big[e] = __uint_as_float(big);
      w_small[e] = __uint_as_float(small);
    } else {
      w_big[e] = __uint_as_float(tf32_operand(v));
    }
  }
  for (int k = threadIdx.x; k < L.k_steps * 8; k += kBlock) {
    int off = 0;
    if (k < n_total) {
      const int ci = k / taps, tap = k - ci * taps;
      off = ci * plane + (tap / KW) * p.dilation_h * pitch + (tap % KW) * p.dilation_w;
    }
    k_table[few_channels::k_offset_slot(k)] = off;
  }
  if constexpr (kSm90) fence_proxy_async_smem();  // the weights are wgmma's B
  // This thread's output channels: i * 16 + gq, and 8 more (mma.sync).
  float bias_v[kSm90 ? 1 : kMTiles][2];
  if constexpr (kSm90) {
    for (int co = threadIdx.x; co < kCo; co += kBlock) {
      bias_s[co] = bias != nullptr && co < co_here ? bias[g * cout_g + co0 + co] : 0.f;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kMTiles; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int co = i * 16 + gq + 8 * h;
        bias_v[i][h] = bias != nullptr && co < co_here ? bias[g * cout_g + co0 + co] : 0.f;
      }
  }

  const int tiles_w = (Wo + fc::kTileCols - 1) / fc::kTileCols;
  const int per_image = (Ho + kRows - 1) / kRows * tiles_w;
  const int total = p.batch * per_image;
  const int halo_cols = (fc::kTileCols - 1) * sw + (KW - 1) * p.dilation_w + 1;
  // Stage s is (image n, output rows from oh0, columns from ow0); each
  // stage's origin is found once, when it is staged, and kept for its work.
  struct Origin {
    int n, oh0, ow0;
  };
  auto origin = [&](int s) {
    const int n = s / per_image, t = s - n * per_image, th = t / tiles_w;
    return Origin{n, th * kRows, (t - th * tiles_w) * fc::kTileCols};
  };
  few_channels::CopyRing<2> ring(staged, tma);
  const uint32_t stage_bytes = 4u * cin_g * plane;
  auto stage = [&](const Origin& o, int b) {
    const auto [n, oh0, ow0] = o;
    float* dst = buffer(b);
    const HaloCols hc = few_channels::halo_cols(ow0 * sw - p.pad_w, vec);
    if (tma) {
      if (threadIdx.x == 0) {
        mbarrier_arrive_expect_tx(&ring.barrier[b], stage_bytes);
        tma_load_4d(dst, &x_map, hc.first - hc.lead, oh0 * sh - p.pad_h, g * cin_g, n,
                    &ring.barrier[b]);
      }
      return;
    }
    few_channels::stage_halo(dst, x + plane_offset(n, p.in_channels, g * cin_g, H * W), cin_g,
                               H, W, oh0 * sh - p.pad_h, L.halo_rows, hc, halo_cols, pitch,
                               plane, vec);
  };

  // ldmatrix: lanes 8i..8i+7 give the rows of matrix i (channels 0-7, 8-15
  // of an m16 tile at k 0-3, then at k 4-7).
  const int mat = lane >> 3;
  const uint32_t a_lane =
      smem_addr(w_big) + 4u * (((mat & 1) * 8 + (lane & 7)) * wpitch + (mat >> 1) * 4);
  const uint32_t a_tile = 4u * 16 * wpitch;
  [[maybe_unused]] const uint32_t a_small = 4u * L.weight_floats;
  // Bytes per staged B element (3xTF32: a [big, small] pair), and to the
  // next n8 tile of pixels.
  constexpr uint32_t kElem = kTf32x3 ? 8 : 4;
  const uint32_t col_step = kElem * 8 * sw;

  const int first = blockIdx.x, step = gridDim.x;
  Origin ahead = origin(first);
  if (first < total) stage(ahead, 0);
  cp_async_commit();
  int it = 0;
  for (int s = first; s < total; s += step, ++it) {
    const int b = it & 1;
    const auto [n, oh0, ow0] = ahead;
    if (tma) {
      ring.wait(b);
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // stage s has landed; every warp is done with s - step
    if (s + step < total) {
      ahead = origin(s + step);
      stage(ahead, b ^ 1);  // flies under this stage's work
    }
    cp_async_commit();
    few_channels::tensor_core_operands<kTf32x3, few_channels::OperandLayout::kPairs,
                                         /*kRoundSmall=*/true,
                                         /*kBatch=*/kTf32x3 || kSm90 ? 4 : 1>(
        reinterpret_cast<float4*>(buffer(b)), reinterpret_cast<float4*>(tf32x3_buf),
        L.buffer_floats / 4, tma);

    if constexpr (kSm90) {
      fprop_tc::fprop_stage_sm90<kTf32x3, kSW>(
          p, L, k_table, bias_s, smem_addr(kTf32x3 ? tf32x3_buf : buffer(b)), smem_addr(w_big), y,
          n, g, co0, co_here, oh0, ow0, few_channels::halo_cols(ow0 * sw - p.pad_w, vec).lead,
          vec_out, tma_out ? &y_map : nullptr, out_stage);
      continue;
    }
    const int oh = oh0 + warp / 2;
    const int c0 = ow0 + (warp & 1) * (fc::kTileCols / 2);  // the warp's first column
    if (oh >= Ho || c0 >= Wo) continue;  // warp-uniform; no barrier before the next stage's
    const int lead = few_channels::halo_cols(ow0 * sw - p.pad_w, vec).lead;
    const uint32_t xb = smem_addr(kTf32x3 ? tf32x3_buf : buffer(b)) +
                        kElem * ((warp / 2) * sh * pitch + lead + ((warp & 1) * 32 + gq) * sw);

    float acc[kMTiles][kNT][4];
    if constexpr (!kTf32x3) {
#pragma unroll
      for (int i = 0; i < kMTiles; ++i)
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          acc[i][j][0] = acc[i][j][1] = bias_v[i][0];
          acc[i][j][2] = acc[i][j][3] = bias_v[i][1];
        }
    }
    [[maybe_unused]] float tmp[kTf32x3 ? kMTiles : 1][kTf32x3 ? kNT : 1][4];

    // One k8 step; 3xTF32's first starts the accumulators at the bias.
    auto k_step = [&](int t, auto first_c) {
      [[maybe_unused]] constexpr bool kFirst = decltype(first_c)::value;
      const int2 ko = few_channels::k8_offsets(k_table, t, tq);
      const uint32_t b0 = xb + kElem * ko.x, b1 = xb + kElem * ko.y;
      uint32_t bb[kNT][2];
      [[maybe_unused]] uint32_t bs[kTf32x3 ? kNT : 1][2];
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        if constexpr (kTf32x3) {
          lds_u32x2(b0 + j * col_step, bb[j][0], bs[j][0]);
          lds_u32x2(b1 + j * col_step, bb[j][1], bs[j][1]);
        } else {
          bb[j][0] = __float_as_uint(lds_f32(b0 + j * col_step));
          bb[j][1] = __float_as_uint(lds_f32(b1 + j * col_step));
        }
      }
      if (t == L.k_steps - 1) {  // K past the group's pairs: zero B
        const bool keep0 = t * 8 + tq < n_total, keep1 = t * 8 + tq + 4 < n_total;
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          if (!keep0) bb[j][0] = 0u;
          if (!keep1) bb[j][1] = 0u;
          if constexpr (kTf32x3) {
            if (!keep0) bs[j][0] = 0u;
            if (!keep1) bs[j][1] = 0u;
          }
        }
      }
      const uint32_t a_step = a_lane + 32u * t;
      uint32_t ab[kMTiles][4];
      [[maybe_unused]] uint32_t as[kTf32x3 ? kMTiles : 1][4];
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
        ldmatrix_x4(ab[i], a_step + i * a_tile);
        if constexpr (kTf32x3) ldmatrix_x4(as[i], a_step + i * a_tile + a_small);
      }
      if constexpr (kTf32x3) {
        mma_3xtf32</*kFresh=*/true, kNT>(tmp, ab, as, bb, bs);
#pragma unroll
        for (int i = 0; i < kMTiles; ++i)
#pragma unroll
          for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              if constexpr (kFirst) {
                acc[i][j][r] = bias_v[i][r >> 1] + tmp[i][j][r];
              } else {
                acc[i][j][r] += tmp[i][j][r];
              }
            }
      } else {
#pragma unroll
        for (int i = 0; i < kMTiles; ++i)
#pragma unroll
          for (int j = 0; j < kNT; ++j) mma_tf32(acc[i][j], ab[i], bb[j]);
      }
    };
    k_step(0, std::true_type{});
    for (int t = 1; t < L.k_steps; ++t) k_step(t, std::false_type{});

    // Accumulator (i, j, r): channel i * 16 + gq (+ 8 for r >= 2), column
    // c0 + j * 8 + 2 * tq + (r & 1): two neighbouring columns a register pair.
    const int64_t out_plane = int64_t(Ho) * Wo;
    float* const y_row =
        y + plane_offset(n, p.out_channels, g * cout_g + co0, out_plane) + int64_t(oh) * Wo;
#pragma unroll
    for (int i = 0; i < kMTiles; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int co = i * 16 + gq + 8 * h;
        if (co >= co_here) continue;
        float* const y_co = y_row + co * out_plane;
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          const int ow = c0 + j * 8 + 2 * tq;
          if (ow >= Wo) continue;
          const float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
          if (vec_out) {  // Wo even: ow + 1 < Wo too
            *reinterpret_cast<float2*>(y_co + ow) = make_float2(v0, v1);
          } else {
            y_co[ow] = v0;
            if (ow + 1 < Wo) y_co[ow + 1] = v1;
          }
        }
      }
  }
  // Shared memory must outlive the reads of the last boxes.
  if (kSm90 && tma_out && threadIdx.x == 0) bulk_wait<0, /*kRead=*/false>();
}

}  // namespace

void launch_fprop_few_channels_tc(const ConvParams& p, const at::TensorBase& x,
                                  const at::TensorBase& w, const float* bias, at::TensorBase& y,
                                  MathMode math) {
  const bool tf32x3 = math == MathMode::kIEEE;
  const fc::FpropTcLayout L = fc::fprop_tc_layout(p, tf32x3);
  TORCH_CHECK(fc::fprop_tc_fits(p, tf32x3, current_sm()),
              "conv2d_ext: internal error: few-channel tensor-core forward does not fit");
  const int64_t co_tiles = ceil_div(p.out_channels_per_group(), kCo);
  const int64_t stages = p.batch * ceil_div(p.out_h, kRows) * ceil_div(p.out_w, fc::kTileCols);
  TORCH_CHECK(stages < (int64_t(1) << 31) && p.batch < (int64_t(1) << 30),
              "conv2d_ext: problem too large for the few-channel forward");
  const bool vec = few_channels::can_vectorise(x.data_ptr(), p.in_w);
  const fc::Halo h{L.halo_rows, L.pitch, int64_t(L.halo_rows) * L.pitch};
  const bool tma = few_channels::tma_stages(vec, h);
  CUtensorMap x_map{};  // not read without tma
  if (tma) {
    x_map = nchw_tensor_map(x, static_cast<uint32_t>(L.pitch), static_cast<uint32_t>(L.halo_rows),
                            static_cast<uint32_t>(p.in_channels_per_group()), 1);
  }
  const bool vec_out = p.out_w % 2 == 0 && reinterpret_cast<uintptr_t>(y.data_ptr()) % 8 == 0;
  const bool sm90 = hopper_kernels(current_sm());
  // The tensor-copy engine writes whole 64-channel boxes, clipped only at
  // the tensor's edges, so the group's channels must be whole tiles.
  const int64_t smem_bytes = fc::fprop_tc_smem_bytes(L, tf32x3, sm90);
  const int64_t out_smem = 1024 + 4 * int64_t(2 * 2 * kOutBoxFloats);
  const bool tma_out = sm90 && tma && p.out_channels_per_group() % kCo == 0 &&
                       p.out_w % 4 == 0 && reinterpret_cast<uintptr_t>(y.data_ptr()) % 16 == 0 &&
                       smem_bytes + out_smem <= max_block_smem_bytes(current_sm()) -
                                                      fc::kFpropTcStaticSmemBytes;
  CUtensorMap y_map{};  // not read without tma_out
  if (tma_out) y_map = nwch_box_tensor_map(y, 32, kCo, 2, /*swizzle_128b=*/true);
  auto kernel = [&] {
    auto pick = [&](auto sw) {
      constexpr int kSW = decltype(sw)::value;
      if (sm90) return tf32x3 ? fprop_tc_kernel<true, kSW, true> : fprop_tc_kernel<false, kSW, true>;
      return tf32x3 ? fprop_tc_kernel<true, kSW, false> : fprop_tc_kernel<false, kSW, false>;
    };
    return p.stride_w == 1 ? pick(Int<1>{}) : p.stride_w == 2 ? pick(Int<2>{}) : pick(Int<0>{});
  }();
  const size_t smem = static_cast<size_t>(smem_bytes + (tma_out ? out_smem : 0));
  ensure_dynamic_smem(kernel, smem);
  // One wave of blocks over the channel tiles, each striding over stages.
  const int64_t tiles = p.groups * co_tiles;
  const int64_t slots = int64_t(max_blocks_per_sm(kernel, kBlock, smem)) *
                        device_properties()->multiProcessorCount;
  const int64_t blocks_x = std::max<int64_t>(1, std::min(stages, ceil_div(slots, tiles)));
  kernel<<<dim3(static_cast<unsigned>(blocks_x), static_cast<unsigned>(tiles)), kBlock, smem,
           current_stream()>>>(x_map, y_map, p, x.data_ptr<float>(),
                                               w.data_ptr<float>(), bias, y.data_ptr<float>(), L,
                                               vec, tma, vec_out, tma_out);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace conv2d_ext
