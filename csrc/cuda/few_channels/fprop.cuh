// The few-channel forward's kernels and the launch of one kernel size (the
// design: fprop.cu). Included only by the instantiation files, one per
// kernel size (instantiations/fprop_*.cu).
#pragma once

#include "../kernel_sizes.cuh"
#include "few_channels.cuh"
#include "fprop.h"

namespace conv2d_ext {
namespace cuda {
namespace few_channels_fprop {
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

// A forward kernel's compile-time tile: kCo output channels x kRows rows x
// kCols columns per thread; kCoGroups slots split the channel tile, the
// others stack rows.
template <int KH_T, int KW_T, int kCo_, int kRows_, int kCoGroups_, int kCols_, bool kOddLead_>
struct FpropTile {
  static constexpr int kKH = KH_T, kKW = KW_T;
  static constexpr int kCo = kCo_, kRows = kRows_, kCoGroups = kCoGroups_, kCols = kCols_;
  static constexpr bool kOddLead = kOddLead_;
  static constexpr int kRowGroups = fc::kSlots / kCoGroups;
  static constexpr int kTileRows = kRows * kRowGroups;
  static constexpr int kCoTile = kCo * kCoGroups;
  // Narrow tiles stage each item's weights and biases in the ring; wide
  // tiles keep theirs after it.
  static constexpr bool kRingWeights = kCoGroups == 1;
  // The register window holds a channel's weights of every tap (98
  // registers for 7x7 x 2 channels; more would spill).
  static constexpr bool kWindow = KH_T > 0 && kCoGroups == 1 && KH_T * KW_T * kCo <= 98;
  using Acc = float[kRows][kCols][kCo];

  // A slot's threads: one per column of the tile, kTileCols, or for narrow
  // tiles, the tile's columns (the launch sizes the block), so that no
  // thread computes columns past the edge (a 56-column plane in 64-column
  // tiles would spend an eighth of its multiply-adds on them). Slots then
  // straddle warps, which only wide tiles' channel groups (cg) would mind.
  // With two columns a thread (kCols, tall depthwise tiles), a window row
  // is a few 8-byte loads for two outputs and each loaded value feeds both.
  static_assert(kCols == 1 || (kCoGroups == 1 && kCo == 1), "column pairs: depthwise only");
  static_assert(kCols == 2 || !kOddLead, "the lead's parity matters to column pairs only");
  // Column pairs run only the register window (the launch takes them at
  // unit stride and dilation and a compiled kernel size): the other paths
  // are left out of the binary, whose instruction fetches stalled the
  // two-column forward with them in.
  static_assert(kCols == 1 || (KH_T > 0 && KH_T * KW_T <= 98), "column pairs: the window only");
};

// A block's geometry and its thread's place in the tile, in 32 bits (the
// entry checks the sizes): ConvParams holds 64-bit fields, and per-item
// arithmetic on them was, with the divisions and cursor steps, a large
// share of the depthwise forward's instructions per item (docs/kernels.md,
// "Few channels on FFMA").
struct FpropBlock {
  int cin_g, cout_g, groups, batch, pad_h, pad_w, KH, KW, taps;
  // A ring buffer's floats: an item's halo [ci][halo_rows][pitch] and, for
  // narrow tiles, its weights and biases (fc::fprop_smem_bytes).
  int w_floats, halo_floats, buf_floats;
  int H, W, Ho, Wo, sh, sw, dh, dw;
  int halo_rows, pitch, tile_cols, tiles_w, halo_cols;
  int threads, col, rg, cg, r0;
  bool vec, unit, pair_stores;

  // Where item `it`'s staged columns sit.
  __device__ __forceinline__ HaloCols origin(const Item& it) const {
    return few_channels::halo_cols(it.tw * tile_cols * sw - pad_w, vec);
  }
};

// Built once per block, before the items.
template <class T>
__device__ __forceinline__ FpropBlock fprop_block(const ConvParams& p, const float* y, bool vec,
                                                  int halo_rows, int pitch,
                                                  int narrow_tile_cols) {
  FpropBlock b;
  b.cin_g = p.in_channels_per_group();
  b.cout_g = p.out_channels_per_group();
  b.groups = p.groups, b.batch = p.batch;
  b.pad_h = p.pad_h, b.pad_w = p.pad_w;
  b.KH = static_or<T::kKH>(p.kernel_h), b.KW = static_or<T::kKW>(p.kernel_w);
  b.taps = b.KH * b.KW;
  b.w_floats = static_cast<int>(fc::fprop_weight_floats(b.cin_g, b.taps, T::kCoTile));
  b.halo_floats = static_cast<int>(fc::fprop_buffer_floats(b.cin_g, halo_rows * pitch));
  b.buf_floats =
      b.halo_floats + (T::kRingWeights ? static_cast<int>(fc::aligned_floats(b.w_floats)) : 0);
  b.H = p.in_h, b.W = p.in_w, b.Ho = p.out_h, b.Wo = p.out_w;
  b.sh = p.stride_h, b.sw = p.stride_w, b.dh = p.dilation_h, b.dw = p.dilation_w;
  b.halo_rows = halo_rows, b.pitch = pitch;
  // fc::fprop_tile_cols; a constant for wide tiles (a register less: their
  // spills grew with it).
  b.tile_cols = T::kCoGroups == 1 ? narrow_tile_cols : fc::kTileCols;
  b.tiles_w = (b.Wo + b.tile_cols - 1) / b.tile_cols;
  b.halo_cols = (b.tile_cols - 1) * b.sw + (b.KW - 1) * b.dw + 1;
  b.threads = T::kCoGroups == 1 ? static_cast<int>(blockDim.x) : fc::kThreads;
  const int slot_threads = b.threads / fc::kSlots;
  b.col = threadIdx.x % slot_threads * T::kCols;
  const int slot = threadIdx.x / slot_threads;  // warp-uniform for wide tiles
  b.rg = slot % T::kRowGroups, b.cg = slot / T::kRowGroups;
  b.r0 = b.rg * T::kRows;  // first tile row of this thread
  b.vec = vec;
  b.unit = b.sh == 1 && b.sw == 1 && b.dh == 1 && b.dw == 1;
  // Even rows from an 8-byte aligned output: a column pair is one store.
  b.pair_stores =
      T::kCols == 2 && b.Wo % 2 == 0 && reinterpret_cast<uintptr_t>(y) % 8 == 0;
  return b;
}

// Starts the copies of the items' staged buffers, a ring of kStages (two
// or three, fc::fprop_stages): the next items' copies fly while one
// computes. With the tensor-copy engine (tma), one thread starts an item's
// box (zeros outside the image) and every thread waits on the buffer's
// barrier.
template <class T, int kStages>
struct FpropStager {
  const FpropBlock& b;
  const ConvParams& p;
  const CUtensorMap& x_map;
  const float* x;
  const float* w;
  const float* bias;
  WeightOrder order;
  bool tma;
  float* s_buf;
  few_channels::CopyRing<kStages>& ring;
  uint32_t box_bytes;

  // Weights and biases of item `it`'s channel tile into `dst`
  // (fprop_weight_floats), zeros past the group's channels or without bias.
  template <bool kAsync>
  __device__ __forceinline__ void copy_weights(const Item& it, float* dst) const {
    const int co0 = it.ct * T::kCoTile;
    for (int k = threadIdx.x; k < b.w_floats; k += b.threads) {
      int64_t i;
      const float* src;
      if (k < b.w_floats - T::kCoTile) {
        const int c = k % T::kCoTile;
        const int t = k / T::kCoTile;  // (ci * KH + kh) * KW + kw
        const int ci = t / b.taps, kh = (t % b.taps) / b.KW, kw = t % b.KW;
        i = weight_index(p, order, it.g, co0 + c, ci, kh, kw);
        src = w;
      } else {
        const int co = co0 + k - (b.w_floats - T::kCoTile);
        i = bias != nullptr && co < b.cout_g ? it.g * b.cout_g + co : -1;
        src = bias;
      }
      if constexpr (kAsync) {
        cp_async_4(dst + k, i < 0 ? w : src + i, i >= 0);
      } else {
        dst[k] = i < 0 ? 0.f : src[i];
      }
    }
  }

  // Item `it`'s halo (and narrow tiles' weights) into ring buffer `buf`.
  __device__ __forceinline__ void stage(const Item& it, int buf) const {
    const int g = it.g;
    const int ih0 = it.th * T::kTileRows * b.sh - b.pad_h;
    const HaloCols hc = b.origin(it);
    float* dst = s_buf + buf * b.buf_floats;
    if constexpr (T::kRingWeights) copy_weights<true>(it, dst + b.halo_floats);
    if (tma) {
      if (threadIdx.x == 0) {
        mbarrier_arrive_expect_tx(&ring.barrier[buf], box_bytes);
        tma_load_4d(dst, &x_map, hc.first - hc.lead, ih0, g * b.cin_g, it.n, &ring.barrier[buf]);
      }
      return;
    }
    few_channels::stage_halo(dst, x + plane_offset(it.n, p.in_channels, g * b.cin_g, b.H * b.W),
                             b.cin_g, b.H, b.W, ih0, b.halo_rows, hc, b.halo_cols, b.pitch,
                             b.halo_rows * b.pitch, b.vec, b.threads);
  }
};

// The register window's registers: a channel's weights of every tap and
// an input row. The kernel declares them, and apart from them the float2
// that loads a column pair: an inlined function's own arrays get lifetime
// markers around the call, and the compiler then builds other code for
// the loops around it; a float2 in this struct changed the two-column
// kernels' register allocation.
template <class T>
struct WindowRegs {
  static constexpr int kShift = T::kOddLead ? 1 : 0;  // see window_taps
  static constexpr int kSpan = T::kKW + T::kCols - 1 + kShift;  // columns a row's taps read
  float w[T::kWindow ? T::kKH : 1][T::kWindow ? T::kKW : 1][T::kCo];
  float v[kSpan + 1];
};

// Accumulators start at the thread's channels' biases (zeros without).
template <class T>
__device__ __forceinline__ void init_acc(typename T::Acc& acc, const float* s_bias, int cg) {
#pragma unroll
  for (int c = 0; c < T::kCo; ++c)
#pragma unroll
    for (int r = 0; r < T::kRows; ++r)
#pragma unroll
      for (int j = 0; j < T::kCols; ++j) acc[r][j][c] = s_bias[cg * T::kCo + c];
}

// One input channel's taps through the register window: input row r0 + i
// feeds output rows r0 + i - kh, so the thread slides down its column and
// reads each staged value once per kernel column.
template <class T>
__device__ __forceinline__ void window_taps(typename T::Acc& acc, WindowRegs<T>& regs,
                                            float2& pair, const FpropBlock& b, const float* sx,
                                            const float* swt) {
  constexpr int KH_T = T::kKH, KW_T = T::kKW, kCo = T::kCo, kCols = T::kCols;
  auto& wr = regs.w;
  auto& v = regs.v;
#pragma unroll
  for (int kh = 0; kh < KH_T; ++kh)
#pragma unroll
    for (int kw = 0; kw < KW_T; ++kw) tap_weights(swt + (kh * KW_T + kw) * T::kCoTile, wr[kh][kw]);
#pragma unroll
  for (int i = 0; i < T::kRows + KH_T - 1; ++i) {
    // Column pairs load 8-byte aligned pairs (the pitch and the column are
    // even), from one column before the window where the staged columns'
    // lead is odd (kOddLead: 16-byte copies and an odd left padding).
    constexpr int kShift = WindowRegs<T>::kShift, kSpan = WindowRegs<T>::kSpan;
    const float* row = sx + (b.r0 + i) * b.pitch + b.col - kShift;
    if constexpr (kCols == 2) {
#pragma unroll
      for (int m = 0; m < kSpan; m += 2) {
        pair = *reinterpret_cast<const float2*>(row + m);
        v[m] = pair.x;
        v[m + 1] = pair.y;
      }
    } else {
#pragma unroll
      for (int m = 0; m < kSpan; ++m) v[m] = row[m];
    }
#pragma unroll
    for (int kh = 0; kh < KH_T; ++kh) {
      const int r = i - kh;
      if (r < 0 || r >= T::kRows) continue;
#pragma unroll
      for (int kw = 0; kw < KW_T; ++kw)
#pragma unroll
        for (int j = 0; j < kCols; ++j)
#pragma unroll
          for (int c = 0; c < kCo; ++c)
            acc[r][j][c] = fmaf(v[kShift + kw + j], wr[kh][kw][c], acc[r][j][c]);
    }
  }
}

// Wide tiles, one kernel row's taps: rows are pointers fixed per kernel
// row and, at unit dilation, taps are immediate offsets from them (a tap
// that computed its own addresses spent a large share of its instructions
// on index arithmetic). A compiler barrier between taps keeps each tap's
// weight loads in their tap (hoisted, they spilled).
template <class T, bool kUnitDw>
__device__ __forceinline__ void wide_row_taps(typename T::Acc& acc, const float* s,
                                              const float* wk, int row_step, int KW, int dw) {
  const float* row[T::kRows];
#pragma unroll
  for (int r = 0; r < T::kRows; ++r) row[r] = s + r * row_step;
#pragma unroll(T::kKW > 0 ? T::kKW : 1)
  for (int kw = 0; kw < KW; ++kw) {
    const int off = kUnitDw ? kw : kw * dw;
    float wv[T::kCo];
    tap_weights(wk + kw * T::kCoTile, wv);
#pragma unroll
    for (int r = 0; r < T::kRows; ++r) {
      const float v = row[r][off];
#pragma unroll
      for (int c = 0; c < T::kCo; ++c) acc[r][0][c] = fmaf(v, wv[c], acc[r][0][c]);
    }
    asm volatile("" ::: "memory");
  }
}

// Wide tiles, one input channel's taps: 4 rows x 16 channels per thread,
// so each tap is 64 FFMA against 4 broadcast weight loads and 4 input
// loads.
template <class T>
__device__ __forceinline__ void wide_taps(typename T::Acc& acc, const FpropBlock& b,
                                          const float* sx, const float* swt) {
  const int row_step = b.sh * b.pitch;
  const float* s = sx + b.r0 * row_step + b.col * b.sw;
#pragma unroll 1
  for (int kh = 0; kh < b.KH; ++kh, s += b.dh * b.pitch) {
    const float* wk = swt + kh * b.KW * T::kCoTile;
    if (b.dw == 1) {
      wide_row_taps<T, true>(acc, s, wk, row_step, b.KW, b.dw);
    } else {
      wide_row_taps<T, false>(acc, s, wk, row_step, b.KW, b.dw);
    }
  }
}

// Stores the thread's tile: rows and channels inside the output, column
// pairs as one 8-byte store where they can.
template <class T>
__device__ __forceinline__ void store_tile(const typename T::Acc& acc, const FpropBlock& b,
                                           const ConvParams& p, float* y, int n, int g, int co0,
                                           int oh0, int ow) {
  if (ow < b.Wo) {
    const int rows_left = b.Ho - (oh0 + b.r0);  // rows of this thread's column inside
#pragma unroll
    for (int c = 0; c < T::kCo; ++c) {
      const int co = co0 + b.cg * T::kCo + c;
      if (co >= b.cout_g) continue;
      float* y_col = y + plane_offset(n, p.out_channels, g * b.cout_g + co, b.Ho * b.Wo) +
                     (oh0 + b.r0) * b.Wo + ow;
#pragma unroll
      for (int r = 0; r < T::kRows; ++r) {
        if (r < rows_left) {
          if constexpr (T::kCols == 2) {
            if (b.pair_stores) {
              // One 8-byte store: ptxas split the plain float2 store into
              // two 4-byte ones (the pair's registers not adjacent).
              asm volatile("st.global.v2.f32 [%0], {%1, %2};" ::"l"(y_col), "f"(acc[r][0][c]),
                           "f"(acc[r][1][c])
                           : "memory");
            } else {
              y_col[0] = acc[r][0][c];
              if (ow + 1 < b.Wo) y_col[1] = acc[r][1][c];
            }
          } else {
            *y_col = acc[r][0][c];
          }
        }
        y_col += b.Wo;
      }
    }
  }
}

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
  using T = FpropTile<KH_T, KW_T, kCo, kRows, kCoGroups, kCols, kOddLead>;
  extern __shared__ __align__(128) float4 smem4[];
  __shared__ uint64_t staged[kStages];
  const FpropBlock b = fprop_block<T>(p, y, vec, halo_rows, pitch, narrow_tile_cols);
  float* s_buf = reinterpret_cast<float*>(smem4);
  float* const s_wide_w = s_buf + kStages * b.buf_floats;  // wide: [ci][kh][kw][kCoTile], bias

  // Blocks stride over the work items (Item), prefetching the items they
  // meet next into the ring. The launch picks the stride (choose_grid).
  const int co_tiles = (b.cout_g + T::kCoTile - 1) / T::kCoTile;
  const ItemRadix radix{b.tiles_w, (b.Ho + T::kTileRows - 1) / T::kTileRows, co_tiles, b.groups};
  const Item step = radix.item(gridDim.x);
  few_channels::CopyRing<kStages> ring(staged, tma);
  const FpropStager<T, kStages> stager{
      b, p, x_map, x, w, bias, order, tma, s_buf, ring, 4u * b.cin_g * halo_rows * pitch};

  // Groups are committed even when empty, so that the wait below counts
  // kStages - 2 groups younger than the current item's.
  Item ahead = radix.item(blockIdx.x);
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) {
    if (ahead.n < b.batch) stager.stage(ahead, k);
    cp_async_commit();
    radix.advance(ahead, step);
  }
  int buf = 0;
  int staged_ct = -1, staged_g = -1;  // wide: the channel tile whose weights s_wide_w holds
  for (Item it = radix.item(blockIdx.x); it.n < b.batch; radix.advance(it, step)) {
    const int g = it.g;
    const int co0 = it.ct * T::kCoTile;
    if constexpr (!T::kRingWeights) {
      if (it.ct != staged_ct || g != staged_g) {  // free: the previous item ended on a barrier
        staged_ct = it.ct;
        staged_g = g;
        stager.template copy_weights<false>(it, s_wide_w);
      }
    }
    cp_async_wait<kStages - 2>();  // this item's group; the kStages - 2 after it may fly
    if (tma) ring.wait(buf);
    __syncthreads();  // every thread's copies; a new channel tile's weights
    // Refills the buffer the previous item consumed: every thread is past
    // it (the barrier above), so no barrier ends an item and warps drift
    // apart by up to an item instead of waiting for the block's slowest
    // twice per item.
    if (ahead.n < b.batch) stager.stage(ahead, (buf + kStages - 1) % kStages);
    cp_async_commit();  // even when empty: the wait above counts groups
    radix.advance(ahead, step);
    const float* s_x = s_buf + buf * b.buf_floats;
    const float* s_w = T::kRingWeights ? s_x + b.halo_floats : s_wide_w;
    const float* s_bias = s_w + b.w_floats - T::kCoTile;
    const int oh0 = it.th * T::kTileRows, ow = it.tw * b.tile_cols + b.col, n = it.n;
    const HaloCols hc = b.origin(it);

    typename T::Acc acc;
    init_acc<T>(acc, s_bias, b.cg);
    for (int ci = 0; ci < b.cin_g; ++ci) {
      const float* sx = s_x + ci * halo_rows * pitch + hc.lead;
      const float* swt = s_w + ci * b.taps * T::kCoTile + b.cg * kCo;
      if constexpr (T::kWindow) {
        if (kCols == 2 || b.unit) {  // the window needs unit stride and dilation
          WindowRegs<T> regs;
          float2 pair;
          window_taps<T>(acc, regs, pair, b, sx, swt);
          continue;
        }
      }
      if constexpr (kCoGroups > 1) {
        wide_taps<T>(acc, b, sx, swt);
        continue;
      }
      if constexpr (kCols == 2) continue;  // the window took every tap
      // Narrow tiles off the window: per-tap indices (in the stepping form
      // of wide tiles the 7x7 two-channel tile spilled more). Written out
      // here: as a device function beside window_taps, it changed the code
      // the compiler built for the window.
#pragma unroll(KH_T > 0 ? KH_T : 1)
      for (int kh = 0; kh < b.KH; ++kh) {
#pragma unroll(KW_T > 0 ? KW_T : 1)
        for (int kw = 0; kw < b.KW; ++kw) {
          float wv[kCo];
          tap_weights(swt + (kh * b.KW + kw) * T::kCoTile, wv);
          const float* s = sx + (b.r0 * b.sh + kh * b.dh) * pitch + b.col * b.sw + kw * b.dw;
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            const float v = s[r * b.sh * pitch];
#pragma unroll
            for (int c = 0; c < kCo; ++c) acc[r][0][c] = fmaf(v, wv[c], acc[r][0][c]);
          }
        }
      }
    }
    store_tile<T>(acc, b, p, y, n, g, co0, oh0, ow);
    // Wide tiles rewrite their weights before the next item's barrier.
    if constexpr (!T::kRingWeights) __syncthreads();
    buf = (buf + 1) % kStages;
  }
}

// Blocks of a forward launch. One wave of resident blocks (per_sm on each
// SM) for wide tiles, whose 64 channels' weights are worth staging as few
// times as possible (staged per tile and image, they took much of the RGB
// stem's time), and for narrow tiles that cover a whole plane. Narrow
// tiles of larger planes keep a grid several blocks deep, every (tile,
// channel tile) pair over a few images: on one wave they were slower,
// apparently because neighbouring tiles, which share halo rows, were then
// no longer staged at about the same time (docs/kernels.md, "Few channels
// on FFMA").
int64_t choose_grid(const ConvParams& p, bool wide, int64_t tiles, int64_t channel_tiles,
                    int per_sm, int sms) {
  // Item::n steps by up to the block count past the batch: both below 2^30
  // keep it in an int (checked at the entry).
  constexpr int64_t kMaxBlocks = int64_t(1) << 30;
  const int64_t items = p.batch * channel_tiles * tiles;
  if (wide || tiles == 1) {
    return std::min({items, int64_t(std::max(per_sm, 1)) * sms, kMaxBlocks});
  }
  const int64_t images = std::min(p.batch, ceil_div(8 * int64_t(sms), tiles * channel_tiles));
  return std::min(tiles * channel_tiles * images, kMaxBlocks);
}

template <int KH, int KW, int kCo, int kRows, int kCoGroups, int kCols = 1,
          bool kOddLead = false>
void launch(const FpropArgs& a) {
  const ConvParams& p = a.p;
  constexpr int kTileRows = kRows * (fc::kSlots / kCoGroups);
  const fc::Halo h = fc::fprop_halo(p);
  const size_t smem = static_cast<size_t>(fc::fprop_smem_bytes(p));
  const int tile_cols = static_cast<int>(fc::fprop_tile_cols(p, kCoGroups == 1));
  const int64_t tiles = ceil_div(p.out_h, kTileRows) * ceil_div(p.out_w, tile_cols);
  const int64_t channel_tiles = p.groups * ceil_div(p.out_channels_per_group(), kCo * kCoGroups);
  const int sms = device_properties()->multiProcessorCount;
  // Narrow tiles: a thread per column (or column pair) of the tile.
  const int threads =
      kCoGroups == 1 ? fc::kSlots * static_cast<int>(ceil_div(tile_cols, kCols)) : fc::kThreads;
  auto run = [&](auto kernel) {
    ensure_dynamic_smem(kernel, smem);
    const bool one_wave = kCoGroups > 1 || tiles == 1;
    const int per_sm = one_wave ? max_blocks_per_sm(kernel, threads, smem) : 0;
    const int64_t blocks = choose_grid(p, kCoGroups > 1, tiles, channel_tiles, per_sm, sms);
    kernel<<<static_cast<unsigned>(blocks), threads, smem, current_stream()>>>(
        a.x_map, p, a.x, a.w, a.bias, a.y, a.order, a.vec, a.tma, h.rows, h.pitch, tile_cols);
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

template <int KH, int KW>
void launch_size(const FpropArgs& a, const fc::FpropVariant& v) {
  if (!v.narrow) {
    launch<KH, KW, fc::kWideCo, fc::kWideRows, fc::kSlots>(a);
    return;
  }
  few_channels::dispatch_narrow_channels(a.p.out_channels_per_group(), [&](auto co) {
    constexpr int kCo = decltype(co)::value;
    // fprop_tall takes one output channel and at most kTallMaxTaps taps;
    // KH = 0: any size.
    if constexpr (kCo == 1 && KH * KW <= fc::kTallMaxTaps) {
      if (v.tall) {
        if constexpr (KH > 0) {  // column pairs run only compiled sizes
          if (v.pairs) {
            if (v.odd_lead) {
              launch<KH, KW, 1, fc::kTallRows, 1, 2, true>(a);
            } else {
              launch<KH, KW, 1, fc::kTallRows, 1, 2>(a);
            }
            return;
          }
        }
        launch<KH, KW, 1, fc::kTallRows, 1>(a);
        return;
      }
    }
    launch<KH, KW, kCo, fc::kNarrowRows, 1>(a);
  });
}

}  // namespace few_channels_fprop
}  // namespace cuda
}  // namespace conv2d_ext
