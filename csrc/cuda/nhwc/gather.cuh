// The channels_last engine's K-tile gather, shared by its mma.sync and
// wgmma forwards: a K tile is one tap's 128 bytes of channels (32 float32
// or 64 16-bit ones, of element type E), so each of its rows
// (an output pixel's input channels, or an output channel's weights) is a
// run of 16-byte chunks, copied asynchronously, zeros where the tap falls
// in the padding or past C. Rows are stored 128 bytes wide with chunk c of
// row r at c ^ (r % 8): the 128-byte swizzle, which spreads a row's copies
// and ldmatrix's 8-row reads over distinct bank groups and is the layout
// wgmma's swizzled descriptors read.
#pragma once

#include <cstdint>

#include "../../conv_params.h"
#include "../mma.cuh"
#include "config.h"

namespace conv2d_ext {
namespace cuda {
namespace nhwc {

namespace cfg = igemm_nhwc;
constexpr int kChunks = cfg::kRowBytes / 16;  // 16-byte chunks of a smem row
template <typename E>
constexpr int kRowElems = cfg::kRowBytes / int(sizeof(E));  // a K tile's channels
template <typename E>
constexpr int kChunkElems = 16 / int(sizeof(E));

// Element offset of (row, 16-byte chunk) in a swizzled tile of E.
template <typename E = float>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * kRowElems<E> + (chunk ^ (row & 7)) * kChunkElems<E>;
}

// Where K tile kt lies: tap (r, s) and its first channel c0.
struct KTile {
  int r, s, c0;
};
template <typename E = float>
__device__ __forceinline__ KTile k_tile(const ConvParams& p, int c_tiles, int kt) {
  const int tap = kt / c_tiles;
  const int r = tap / static_cast<int>(p.kernel_w);
  return {r, tap - r * static_cast<int>(p.kernel_w), (kt - tap * c_tiles) * kRowElems<E>};
}

// The input rows (output pixels) a thread copies: image base and the
// window's top-left corner, fixed for the whole K walk.
// T names kARows and kBRows, the rows each thread copies per K tile.
template <typename T>
struct ARows {
  int64_t base[T::kARows];  // offset of the pixel's image
  int h0[T::kARows], w0[T::kARows];
  bool live[T::kARows];

  __device__ __forceinline__ ARows(const ConvParams& p, int m0, int row0) {
    const int pq = static_cast<int>(p.out_h * p.out_w);
#pragma unroll
    for (int i = 0; i < T::kARows; ++i) {
      const int64_t m = int64_t(m0) + row0 + i * (cfg::kThreads / kChunks);
      live[i] = m < p.gemm_m();
      const int img = live[i] ? static_cast<int>(m / pq) : 0;
      const int rest = live[i] ? static_cast<int>(m - int64_t(img) * pq) : 0;
      const int oh = rest / static_cast<int>(p.out_w), ow = rest - oh * static_cast<int>(p.out_w);
      base[i] = int64_t(img) * p.in_h * p.in_w * p.in_channels;
      h0[i] = oh * static_cast<int>(p.stride_h) - static_cast<int>(p.pad_h);
      w0[i] = ow * static_cast<int>(p.stride_w) - static_cast<int>(p.pad_w);
    }
  }
};

// One K tile's copies into a stage: A (pixels x the tap's channels of
// the tile) and B (output channels x the same channels' weights).
template <typename T, int BM, int BN, typename E>
__device__ __forceinline__ void load_stage(E* stage, const ConvParams& p, const ARows<T>& a,
                                           const E* __restrict__ x, const E* __restrict__ w,
                                           int n0, KTile k, int row0, int chunk) {
  const int c = k.c0 + kChunkElems<E> * chunk;
  const bool c_live = c < p.in_channels;
  const int H = static_cast<int>(p.in_h), W = static_cast<int>(p.in_w);
  const int ih_off = k.r * static_cast<int>(p.dilation_h);
  const int iw_off = k.s * static_cast<int>(p.dilation_w);
#pragma unroll
  for (int i = 0; i < T::kARows; ++i) {
    const int row = row0 + i * (cfg::kThreads / kChunks);
    const int ih = a.h0[i] + ih_off, iw = a.w0[i] + iw_off;
    const bool live = a.live[i] && c_live && ih >= 0 && ih < H && iw >= 0 && iw < W;
    const E* src = live ? x + a.base[i] + (int64_t(ih) * W + iw) * p.in_channels + c : x;
    cp_async_16_or_zero(stage + swizzled<E>(row, chunk), src, live);
  }
  E* const sb = stage + BM * kRowElems<E>;
  const int64_t tap = int64_t(k.r) * p.kernel_w + k.s;
#pragma unroll
  for (int i = 0; i < T::kBRows; ++i) {
    const int row = row0 + i * (cfg::kThreads / kChunks);
    const int n = n0 + row;
    const bool live = c_live && n < p.out_channels;
    const E* src = live ? w + (int64_t(n) * p.taps() + tap) * p.in_channels + c : w;
    cp_async_16_or_zero(sb + swizzled<E>(row, chunk), src, live);
  }
}

// Where output row m (a pixel of the GEMM's M) starts in y.
__device__ __forceinline__ int64_t out_offset(const cfg::OutMap& o, const ConvParams& p,
                                              int64_t m) {
  const int64_t pq = p.out_h * p.out_w;
  const int64_t img = m / pq, rest = m - img * pq;
  const int64_t oh = rest / p.out_w, ow = rest - oh * p.out_w;
  return o.base + img * o.image + oh * o.row + ow * o.col;
}

}  // namespace nhwc
}  // namespace cuda
}  // namespace conv2d_ext
