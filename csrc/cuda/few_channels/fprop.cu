// Forward for few input channels per group (at most 4: depthwise layers,
// RGB stems) on FFMA; also dgrad at unit stride where that is such a
// forward (p = dgrad_as_fprop(layer), WeightOrder::kDgrad).
//
// A few multiply-adds per byte: the limit is memory traffic, not the
// tensor cores. A block stages its input channels' tile with halo in
// shared memory once (16-byte async copies where rows are aligned), then
// each thread owns one output column of the tile:
// - narrow (at most 4 output channels per group: depthwise, grouped 4 ->
//   4): 8 rows x those channels; 4 slots of 64 threads stack to a 32 x 64
//   tile. At unit stride and dilation a thread slides a register window
//   down its column, so each staged value is read once per kernel column,
//   not once per tap, while the window's weights fit in registers. Tall
//   depthwise tiles (fc::fprop_tall) at unit stride and dilation: 14 rows
//   x 2 columns a thread, so a window row is a few 8-byte loads that feed
//   both columns.
// - wide (RGB stems): 4 rows x 16 channels; the 4 slots cover a 64-channel
//   tile, and every staged input value feeds 16 multiply-adds.
// Lanes of a warp own consecutive columns (or column pairs): coalesced
// stores, conflict-free shared reads at unit stride.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "../../plan.h"
#include "../kernel_sizes.cuh"
#include "../tensor_map.h"
#include "few_channels.cuh"
#include "few_channels.h"

namespace conv2d_ext {
namespace cuda {
namespace {

namespace fc = conv2d_ext::few_channels;
using few_channels::HaloCols;

// The weights of one tap for this thread's channels (broadcast reads).
template <int kCo>
__device__ __forceinline__ void tap_weights(const float* s, float (&wv)[kCo]) {
  if constexpr (kCo % 4 == 0) {
    load_tile(s, wv);
  } else {
#pragma unroll
    for (int c = 0; c < kCo; ++c) wv[c] = s[c];
  }
}

// A work item of the forward: output tile (th, tw) of output-channel tile
// ct of group g of image n. Blocks stride over items numbered with tw
// fastest, then th, ct, g and n; the stride is split into these digits
// once, so that stepping is a few additions and carries instead of
// divisions per item, which took a visible share of the depthwise
// forward's time.
struct Item {
  int tw, th, ct, g, n;
};
struct ItemRadix {
  int tiles_w, tiles_h, co_tiles, groups;
  __device__ __forceinline__ Item item(unsigned i) const {
    Item it;
    it.tw = static_cast<int>(i % tiles_w);
    i /= tiles_w;
    it.th = static_cast<int>(i % tiles_h);
    i /= tiles_h;
    it.ct = static_cast<int>(i % co_tiles);
    i /= co_tiles;
    it.g = static_cast<int>(i % groups);
    it.n = static_cast<int>(i / groups);
    return it;
  }
  // Brings a digit below its radix (it is below twice the radix: a digit
  // plus a step's digit plus a carry); returns the carry.
  static __device__ __forceinline__ int wrap(int& digit, int radix) {
    const int carry = digit >= radix;
    digit -= carry * radix;
    return carry;
  }
  __device__ __forceinline__ void advance(Item& it, const Item& step) const {
    it.tw += step.tw;
    it.th += step.th + wrap(it.tw, tiles_w);
    it.ct += step.ct + wrap(it.th, tiles_h);
    it.g += step.g + wrap(it.ct, co_tiles);
    it.n += step.n + wrap(it.g, groups);
  }
};

// kCo output channels x kRows rows x kCols columns per thread; kCoGroups
// slots split the channel tile, the others stack rows.
template <int KH_T, int KW_T, int kCo, int kRows, int kCoGroups, int kStages, int kCols,
          bool kOddLead>
// Several blocks per SM keep more copies in flight: three with one output
// channel per group (at most 85 registers; two channels would spill). With
// two columns a thread, four blocks of half the threads, as many as the
// tall tiles' rings fit in shared memory: 128 registers (the window's 28
// sums and 25 weights; at 80 ptxas reloaded the weights from shared memory
// for every row).
__global__ void __launch_bounds__(fc::kThreads / kCols, kCols == 2 ? 4 : kCo == 1 ? 3 : 2)
    fprop_few_channels_kernel(const __grid_constant__ CUtensorMap x_map, const ConvParams p,
                                const float* __restrict__ x, const float* __restrict__ w,
                                const float* __restrict__ bias, float* __restrict__ y,
                                WeightOrder order, bool vec, bool tma, int halo_rows,
                                int pitch, int narrow_tile_cols) {
  constexpr int kRowGroups = fc::kSlots / kCoGroups;
  constexpr int kTileRows = kRows * kRowGroups;
  constexpr int kCoTile = kCo * kCoGroups;
  extern __shared__ __align__(128) float4 smem4[];
  __shared__ uint64_t staged[kStages];
  // Geometry in 32 bits (the entry checks the sizes): ConvParams holds
  // 64-bit fields, and per-item arithmetic on them was part of the
  // overhead that, with the divisions and cursor steps, made up half of
  // the depthwise forward's instructions per item.
  const int cin_g = p.in_channels_per_group();
  const int cout_g = p.out_channels_per_group();
  const int groups = p.groups, batch = p.batch;
  const int pad_h = p.pad_h, pad_w = p.pad_w;
  const int KH = static_or<KH_T>(p.kernel_h), KW = static_or<KW_T>(p.kernel_w);
  const int taps = KH * KW;
  // A ring of kStages buffers (two or three, fc::fprop_stages), each an
  // item's halo [ci][halo_rows][pitch] and, for narrow tiles, its weights
  // and biases (fc::fprop_smem_bytes): the next items' copies fly while one
  // computes. Wide tiles keep their weights after the ring.
  constexpr bool kRingWeights = kCoGroups == 1;
  const int w_floats = static_cast<int>(fc::fprop_weight_floats(cin_g, taps, kCoTile));
  const int halo_floats = static_cast<int>(fc::fprop_buffer_floats(cin_g, halo_rows * pitch));
  const int buf_floats =
      halo_floats + (kRingWeights ? static_cast<int>(fc::aligned_floats(w_floats)) : 0);
  float* s_buf = reinterpret_cast<float*>(smem4);
  float* const s_wide_w = s_buf + kStages * buf_floats;  // wide: [ci][kh][kw][kCoTile], bias

  const int H = p.in_h, W = p.in_w, Ho = p.out_h, Wo = p.out_w;
  const int sh = p.stride_h, sw = p.stride_w, dh = p.dilation_h, dw = p.dilation_w;
  // fc::fprop_tile_cols; a constant for wide tiles (a register less: their
  // spills grew with it).
  const int tile_cols = kCoGroups == 1 ? narrow_tile_cols : fc::kTileCols;
  const int tiles_w = (Wo + tile_cols - 1) / tile_cols;
  const int halo_cols = (tile_cols - 1) * sw + (KW - 1) * dw + 1;

  // A slot's threads: one per column of the tile, kTileCols, or for narrow
  // tiles, the tile's columns (the launch sizes the block), so that no
  // thread computes columns past the edge (dw_5x5's 56 of 64 spent an
  // eighth of its multiply-adds on them). Slots then straddle warps, which
  // only wide tiles' channel groups (cg) would mind. With two columns a
  // thread (kCols, tall depthwise tiles), a window row is a few 8-byte
  // loads for two outputs and each loaded value feeds both.
  static_assert(kCols == 1 || (kCoGroups == 1 && kCo == 1), "column pairs: depthwise only");
  static_assert(kCols == 2 || !kOddLead, "the lead's parity matters to column pairs only");
  // Column pairs run only the register window (the launch takes them at
  // unit stride and dilation and a compiled kernel size): the other paths
  // are left out of the binary, whose instruction fetches stalled the
  // two-column forward with them in.
  static_assert(kCols == 1 || (KH_T > 0 && KH_T * KW_T <= 98), "column pairs: the window only");
  const int threads = kCoGroups == 1 ? static_cast<int>(blockDim.x) : fc::kThreads;
  const int slot_threads = threads / fc::kSlots;
  const int col = threadIdx.x % slot_threads * kCols;
  const int slot = threadIdx.x / slot_threads;  // warp-uniform for wide tiles
  const int rg = slot % kRowGroups, cg = slot / kRowGroups;
  const int r0 = rg * kRows;  // first tile row of this thread
  const bool unit = sh == 1 && sw == 1 && dh == 1 && dw == 1;
  // Even rows from an 8-byte aligned output: a column pair is one store.
  const bool pair_stores = kCols == 2 && Wo % 2 == 0 && reinterpret_cast<uintptr_t>(y) % 8 == 0;

  // Blocks stride over the work items (Item), prefetching the items they
  // meet next into the ring. The launch picks the stride: one wave of
  // resident blocks for wide tiles, whose 64 channels' weights are worth
  // staging as few times as possible (with a block per tile and image the
  // RGB stem spent much of its time on them), and for narrow tiles that
  // cover a whole plane. Narrow tiles of larger planes keep a grid several
  // blocks deep, every (tile, channel tile) pair over a few images: on one
  // wave they were slower, apparently because neighbouring tiles, which
  // share halo rows, were then no longer staged at about the same time.
  const int co_tiles = (cout_g + kCoTile - 1) / kCoTile;
  const ItemRadix radix{tiles_w, (Ho + kTileRows - 1) / kTileRows, co_tiles, groups};
  const Item step = radix.item(gridDim.x);
  auto origin = [&](const Item& it) {
    return few_channels::halo_cols(it.tw * tile_cols * sw - pad_w, vec);
  };

  // With the tensor-copy engine (tma), one thread starts an item's box
  // (zeros outside the image) and every thread waits on the buffer's
  // barrier.
  few_channels::CopyRing<kStages> ring(staged, tma);
  const uint32_t box_bytes = 4u * cin_g * halo_rows * pitch;
  // Weights and biases of item `it`'s channel tile into `dst`
  // (fprop_weight_floats), zeros past the group's channels or without bias.
  auto copy_weights = [&](const Item& it, float* dst, auto async) {
    const int co0 = it.ct * kCoTile;
    for (int k = threadIdx.x; k < w_floats; k += threads) {
      int64_t i;
      const float* src;
      if (k < w_floats - kCoTile) {
        const int c = k % kCoTile;
        const int t = k / kCoTile;  // (ci * KH + kh) * KW + kw
        const int ci = t / taps, kh = (t % taps) / KW, kw = t % KW;
        i = weight_index(p, order, it.g, co0 + c, ci, kh, kw);
        src = w;
      } else {
        const int co = co0 + k - (w_floats - kCoTile);
        i = bias != nullptr && co < cout_g ? it.g * cout_g + co : -1;
        src = bias;
      }
      if constexpr (decltype(async)::value) {
        cp_async_4(dst + k, i < 0 ? w : src + i, i >= 0);
      } else {
        dst[k] = i < 0 ? 0.f : src[i];
      }
    }
  };
  auto stage = [&](const Item& it, int b) {
    const int g = it.g;
    const int ih0 = it.th * kTileRows * sh - pad_h;
    const HaloCols hc = origin(it);
    float* dst = s_buf + b * buf_floats;
    if constexpr (kRingWeights) copy_weights(it, dst + halo_floats, std::true_type{});
    if (tma) {
      if (threadIdx.x == 0) {
        mbarrier_arrive_expect_tx(&ring.barrier[b], box_bytes);
        tma_load_4d(dst, &x_map, hc.first - hc.lead, ih0, g * cin_g, it.n, &ring.barrier[b]);
      }
      return;
    }
    few_channels::stage_halo(dst, x + plane_offset(it.n, p.in_channels, g * cin_g, H * W),
                               cin_g, H, W, ih0, halo_rows, hc, halo_cols, pitch,
                               halo_rows * pitch, vec, threads);
  };
  // Groups are committed even when empty, so that the wait below counts
  // kStages - 2 groups younger than the current item's.
  Item ahead = radix.item(blockIdx.x);
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) {
    if (ahead.n < batch) stage(ahead, k);
    cp_async_commit();
    radix.advance(ahead, step);
  }
  int buf = 0;
  int staged_ct = -1, staged_g = -1;  // wide: the channel tile whose weights s_wide_w holds
  for (Item it = radix.item(blockIdx.x); it.n < batch; radix.advance(it, step)) {
    const int g = it.g;
    const int co0 = it.ct * kCoTile;
    if constexpr (!kRingWeights) {
      if (it.ct != staged_ct || g != staged_g) {  // free: the previous item ended on a barrier
        staged_ct = it.ct;
        staged_g = g;
        copy_weights(it, s_wide_w, std::false_type{});
      }
    }
    cp_async_wait<kStages - 2>();  // this item's group; the kStages - 2 after it may fly
    if (tma) ring.wait(buf);
    __syncthreads();  // every thread's copies; a new channel tile's weights
    // Refills the buffer the previous item consumed: every thread is past
    // it (the barrier above), so no barrier ends an item and warps drift
    // apart by up to an item instead of waiting for the block's slowest
    // twice per item.
    if (ahead.n < batch) stage(ahead, (buf + kStages - 1) % kStages);
    cp_async_commit();  // even when empty: the wait above counts groups
    radix.advance(ahead, step);
    const float* s_x = s_buf + buf * buf_floats;
    const float* s_w = kRingWeights ? s_x + halo_floats : s_wide_w;
    const float* s_bias = s_w + w_floats - kCoTile;
    const int oh0 = it.th * kTileRows, ow = it.tw * tile_cols + col, n = it.n;
    const HaloCols hc = origin(it);

    float acc[kRows][kCols][kCo];
#pragma unroll
    for (int c = 0; c < kCo; ++c)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int j = 0; j < kCols; ++j) acc[r][j][c] = s_bias[cg * kCo + c];
    for (int ci = 0; ci < cin_g; ++ci) {
      const float* sx = s_x + ci * halo_rows * pitch + hc.lead;
      const float* swt = s_w + ci * taps * kCoTile + cg * kCo;
      // The window holds a channel's weights of every tap (98 registers
      // for 7x7 x 2 channels; more would spill).
      if constexpr (KH_T > 0 && kCoGroups == 1 && KH_T * KW_T * kCo <= 98) {
        if (kCols == 2 || unit) {
          // Input row r0 + i feeds output rows r0 + i - kh: slide down
          // the column, each staged value read once per kernel column.
          float wr[KH_T][KW_T][kCo];
#pragma unroll
          for (int kh = 0; kh < KH_T; ++kh)
#pragma unroll
            for (int kw = 0; kw < KW_T; ++kw) tap_weights(swt + (kh * KW_T + kw) * kCoTile, wr[kh][kw]);
#pragma unroll
          for (int i = 0; i < kRows + KH_T - 1; ++i) {
            // Column pairs load 8-byte aligned pairs (the pitch and the
            // column are even), from one column before the window where
            // the staged columns' lead is odd (kOddLead: 16-byte copies
            // and an odd left padding).
            constexpr int kShift = kOddLead ? 1 : 0;
            constexpr int kSpan = KW_T + kCols - 1 + kShift;  // columns a row's taps read
            float v[kSpan + 1];
            const float* row = sx + (r0 + i) * pitch + col - kShift;
            if constexpr (kCols == 2) {
#pragma unroll
              for (int m = 0; m < kSpan; m += 2) {
                const float2 t = *reinterpret_cast<const float2*>(row + m);
                v[m] = t.x;
                v[m + 1] = t.y;
              }
            } else {
#pragma unroll
              for (int m = 0; m < kSpan; ++m) v[m] = row[m];
            }
#pragma unroll
            for (int kh = 0; kh < KH_T; ++kh) {
              const int r = i - kh;
              if (r < 0 || r >= kRows) continue;
#pragma unroll
              for (int kw = 0; kw < KW_T; ++kw)
#pragma unroll
                for (int j = 0; j < kCols; ++j)
#pragma unroll
                  for (int c = 0; c < kCo; ++c)
                    acc[r][j][c] = fmaf(v[kShift + kw + j], wr[kh][kw][c], acc[r][j][c]);
            }
          }
          continue;
        }
      }
      if constexpr (kCoGroups > 1) {
        // Wide tiles: 4 rows x 16 channels per thread, so each tap is 64
        // FFMA against 4 broadcast weight loads and 4 input loads. Rows
        // are pointers fixed per kernel row and, at unit dilation, taps
        // are immediate offsets from them: the RGB stem spent 7
        // instructions of index arithmetic per 32 FFMA when a tap
        // computed its addresses. A compiler barrier between taps keeps
        // each tap's weight loads in their tap (hoisted, they spilled).
        const int row_step = sh * pitch;
        auto taps_of_row = [&](const float* s, const float* wk, auto unit_dw) {
          const float* row[kRows];
#pragma unroll
          for (int r = 0; r < kRows; ++r) row[r] = s + r * row_step;
#pragma unroll(KW_T > 0 ? KW_T : 1)
          for (int kw = 0; kw < KW; ++kw) {
            const int off = decltype(unit_dw)::value ? kw : kw * dw;
            float wv[kCo];
            tap_weights(wk + kw * kCoTile, wv);
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
              const float v = row[r][off];
#pragma unroll
              for (int c = 0; c < kCo; ++c) acc[r][0][c] = fmaf(v, wv[c], acc[r][0][c]);
            }
            asm volatile("" ::: "memory");
          }
        };
        const float* s = sx + r0 * row_step + col * sw;
#pragma unroll 1
        for (int kh = 0; kh < KH; ++kh, s += dh * pitch) {
          const float* wk = swt + kh * KW * kCoTile;
          if (dw == 1) {
            taps_of_row(s, wk, std::true_type{});
          } else {
            taps_of_row(s, wk, std::false_type{});
          }
        }
        continue;
      }
      if constexpr (kCols == 2) continue;  // the window took every tap
      // Narrow tiles keep per-tap indices: in the stepping form above the
      // 7x7 two-channel tile spilled 56 bytes instead of 12.
#pragma unroll(KH_T > 0 ? KH_T : 1)
      for (int kh = 0; kh < KH; ++kh) {
#pragma unroll(KW_T > 0 ? KW_T : 1)
        for (int kw = 0; kw < KW; ++kw) {
          float wv[kCo];
          tap_weights(swt + (kh * KW + kw) * kCoTile, wv);
          const float* s = sx + (r0 * sh + kh * dh) * pitch + col * sw + kw * dw;
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            const float v = s[r * sh * pitch];
#pragma unroll
            for (int c = 0; c < kCo; ++c) acc[r][0][c] = fmaf(v, wv[c], acc[r][0][c]);
          }
        }
      }
    }
    if (ow < Wo) {
      const int rows_left = Ho - (oh0 + r0);  // rows of this thread's column inside
#pragma unroll
      for (int c = 0; c < kCo; ++c) {
        const int co = co0 + cg * kCo + c;
        if (co >= cout_g) continue;
        float* y_col = y + plane_offset(n, p.out_channels, g * cout_g + co, Ho * Wo) +
                       (oh0 + r0) * Wo + ow;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (r < rows_left) {
            if constexpr (kCols == 2) {
              if (pair_stores) {
                // One 8-byte store: ptxas split the plain float2 store into
                // two 4-byte ones (the pair's registers not adjacent).
                asm volatile("st.global.v2.f32 [%0], {%1, %2};" ::"l"(y_col), "f"(acc[r][0][c]),
                             "f"(acc[r][1][c])
                             : "memory");
              } else {
                y_col[0] = acc[r][0][c];
                if (ow + 1 < Wo) y_col[1] = acc[r][1][c];
              }
            } else {
              *y_col = acc[r][0][c];
            }
          }
          y_col += Wo;
        }
      }
    }
    // Wide tiles rewrite their weights before the next item's barrier.
    if constexpr (!kRingWeights) __syncthreads();
    buf = (buf + 1) % kStages;
  }
}

template <int KH, int KW, int kCo, int kRows, int kCoGroups, int kCols = 1,
          bool kOddLead = false>
void launch(const ConvParams& p, const CUtensorMap& x_map, const float* x, const float* w,
            const float* bias, float* y, WeightOrder order, bool vec, bool tma) {
  constexpr int kTileRows = kRows * (fc::kSlots / kCoGroups);
  const fc::Halo h = fc::fprop_halo(p);
  const size_t smem = static_cast<size_t>(fc::fprop_smem_bytes(p));
  const int tile_cols = static_cast<int>(fc::fprop_tile_cols(p, kCoGroups == 1));
  const int64_t tiles = ceil_div(p.out_h, kTileRows) * ceil_div(p.out_w, tile_cols);
  const int64_t channel_tiles = p.groups * ceil_div(p.out_channels_per_group(), kCo * kCoGroups);
  const int64_t items = p.batch * channel_tiles * tiles;
  // Item::n steps by up to the block count past the batch: both below 2^30
  // keep it in an int (checked at the entry).
  constexpr int64_t kMaxBlocks = int64_t(1) << 30;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  // Narrow tiles: a thread per column (or column pair) of the tile.
  const int threads =
      kCoGroups == 1 ? fc::kSlots * static_cast<int>(ceil_div(tile_cols, kCols)) : fc::kThreads;
  auto run = [&](auto kernel) {
    ensure_dynamic_smem(kernel, smem);
    int64_t blocks = 0;
    if (kCoGroups > 1 || tiles == 1) {  // one wave of resident blocks
      const int per_sm = max_blocks_per_sm(kernel, threads, smem);
      blocks = std::min({items, int64_t(std::max(per_sm, 1)) * sms, kMaxBlocks});
    } else {
      // Narrow tiles of larger planes: every (tile, channel tile) pair,
      // over as many images as needed to fill the GPU several blocks deep.
      const int64_t images = std::min(p.batch, ceil_div(8 * int64_t(sms), tiles * channel_tiles));
      blocks = std::min(tiles * channel_tiles * images, kMaxBlocks);
    }
    kernel<<<static_cast<unsigned>(blocks), threads, smem, at::cuda::getCurrentCUDAStream()>>>(
        x_map, p, x, w, bias, y, order, vec, tma, h.rows, h.pitch, tile_cols);
  };
  static_assert(fc::kFpropStages == 3, "one instantiation per stage count");
  if (fc::fprop_stages(p) == 3) {
    run(fprop_few_channels_kernel<KH, KW, kCo, kRows, kCoGroups, 3, kCols, kOddLead>);
  } else {
    run(fprop_few_channels_kernel<KH, KW, kCo, kRows, kCoGroups, 2, kCols, kOddLead>);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void launch_fprop_few_channels(const ConvParams& p, const at::Tensor& x, const at::Tensor& w,
                                 const float* bias, at::Tensor& y, WeightOrder order) {
  TORCH_CHECK(fc::fprop_fits(p), "conv2d_ext: internal error: few-channel forward does not fit");
  TORCH_CHECK(ceil_div(p.out_h, fc::fprop_tile_rows(p)) * ceil_div(p.out_w, fc::kTileCols) <
                  (int64_t(1) << 31),
              "conv2d_ext: output plane too large for the few-channel forward");
  TORCH_CHECK(p.batch < (int64_t(1) << 30), "conv2d_ext: batch too large for the few-channel forward");
  const bool vec = few_channels::can_vectorise(x.data_ptr(), p.in_w);
  // On Hopper the tensor-copy engine stages the halo: one instruction per
  // image instead of a loop of copies (a large share of the instructions).
  // It reads the rows that 16-byte copies would (vec).
  const fc::Halo h = fc::fprop_halo(p);
  const bool tma = few_channels::tma_stages(vec, h);
  CUtensorMap x_map{};  // not read without tma
  if (tma) {
    x_map = nchw_tensor_map(x, static_cast<uint32_t>(h.pitch), static_cast<uint32_t>(h.rows),
                            static_cast<uint32_t>(p.in_channels_per_group()), 1);
  }
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  dispatch_few_channels_kernel_size(p.kernel_h, p.kernel_w, [&](auto kh, auto kw) {
    constexpr int KH = decltype(kh)::value, KW = decltype(kw)::value;
    if (!fc::fprop_narrow(p)) {
      launch<KH, KW, fc::kWideCo, fc::kWideRows, fc::kSlots>(p, x_map, xp, wp, bias, yp, order,
                                                             vec, tma);
    } else {
      few_channels::dispatch_narrow_channels(p.out_channels_per_group(), [&](auto co) {
        constexpr int kCo = decltype(co)::value;
        if constexpr (kCo == 1 && KH * KW <= fc::kTallMaxTaps) {  // KH = 0: any size
          if (fc::fprop_tall(p)) {
            // Two columns a thread where the register window runs (unit
            // stride and dilation, a compiled size). 16-byte copies and
            // the tensor copy (whose boxes start 16-byte aligned) stage
            // from the 4-aligned column at or before the tile's first
            // (HaloCols): an odd lead where the left padding is odd.
            if constexpr (KH > 0) {
              if (p.stride_h == 1 && p.stride_w == 1 && p.dilation_h == 1 && p.dilation_w == 1) {
                if (vec && p.pad_w % 2 != 0) {
                  launch<KH, KW, 1, fc::kTallRows, 1, 2, true>(p, x_map, xp, wp, bias, yp, order,
                                                              vec, tma);
                } else {
                  launch<KH, KW, 1, fc::kTallRows, 1, 2>(p, x_map, xp, wp, bias, yp, order, vec,
                                                         tma);
                }
                return;
              }
            }
            launch<KH, KW, 1, fc::kTallRows, 1>(p, x_map, xp, wp, bias, yp, order, vec, tma);
            return;
          }
        }
        launch<KH, KW, kCo, fc::kNarrowRows, 1>(p, x_map, xp, wp, bias, yp, order, vec, tma);
      });
    }
  });
}

}  // namespace cuda
}  // namespace conv2d_ext
