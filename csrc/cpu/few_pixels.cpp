// The few-pixel kernels (few_pixels.h).
//
// GEMM view per group g: M = output pixels of all images, K = output
// channels of the group, J = C per group * R * S; the weight W_g is
// [K][J] as stored. The input is first gathered into col_g [M][J] (each
// pixel's receptive field, zeros in the padding), and grad_output into
// go_g [K][M]. Then
//   fprop  y[m][k]     = sum_j W_g[k][j] col_g[m][j]  dot products along J
//                       (or, where the pixels fill most of their vectors,
//                       pixels in vectors over col_g transposed),
//   dgrad  dcol[m][j]  = sum_k W_g[k][j] go_g[k][m]   rows of W along J,
//                       added back into grad_input's pixels (col2im),
//   wgrad  gw[k][j]    = sum_m go_g[k][m] col_g[m][j] rows of gw along J,
// every one vectorised along J, where the weight's rows are contiguous. M
// is small, so col_g and go_g stay in cache and the weight is read once.
// Each output's sum runs in a fixed order, whatever the thread count.
// channels_last operands (`nhwc`) order J as a channels_last weight holds
// its rows, (tap, channel), so that the layer's weight (or grad_weight) is
// read (written) in place: copying a large weight to NCHW would cost more
// than the pass.
#include "few_pixels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "isa.h"

namespace conv2d_ext {
namespace cpu {
namespace {

// kVL floats a vector (a typedef with a vector size that depends on a
// template parameter would lose its vector type, so each is spelled out).
#define CONV2D_EXT_VECTOR_TRAITS(Name, lanes)                                                \
  struct Name {                                                                             \
    static constexpr int kVL = lanes;                                                       \
    typedef float vec __attribute__((vector_size(lanes * sizeof(float))));                  \
    typedef float vec_unaligned __attribute__((vector_size(lanes * sizeof(float)), aligned(4))); \
  };
CONV2D_EXT_VECTOR_TRAITS(Avx512, 16)
CONV2D_EXT_VECTOR_TRAITS(Avx2, 8)
CONV2D_EXT_VECTOR_TRAITS(Baseline, 4)
#undef CONV2D_EXT_VECTOR_TRAITS

// A tile: kRows weight rows (or kRows output channels) x kPix pixels, or
// kPix pixels x kCols vectors along J; 16 accumulators, within every
// instruction set's registers.
constexpr int kRows = 4, kPix = 4, kCols = 4;

// Sums over a long reduction run a few terms at a time, each run from zero
// and then added to the total: one chain lost up to a few times PyTorch's
// accuracy. dgrad's over K take kRunK terms a run, wgrad's over pixels
// kRunM.
constexpr int64_t kRunK = 128, kRunM = 32;

// Columns J are walked kCols vectors at a time in dgrad and wgrad; each
// task owns one such chunk (the last one partial, its tail scalar).
template <typename T>
constexpr int64_t chunk_floats() {
  return int64_t(T::kVL) * kCols;
}

struct Geometry {
  int64_t m, j, kg, groups;
  bool nhwc;  // channels_last operands; J = (tap, channel)
};
Geometry geometry(const ConvParams& p, bool nhwc) {
  return {p.batch * p.out_h * p.out_w, p.in_channels_per_group() * p.taps(),
          p.out_channels_per_group(), p.groups, nhwc};
}

// Column j of (channel c of the group, tap (r, s)).
inline int64_t column(const ConvParams& p, bool nhwc, int64_t c, int64_t r, int64_t s) {
  return nhwc ? (r * p.kernel_w + s) * p.in_channels_per_group() + c
              : (c * p.kernel_h + r) * p.kernel_w + s;
}

// Where input pixel (n, ih, iw) of channel ci (of all C) lies in x.
inline int64_t x_offset(const ConvParams& p, bool nhwc, int64_t n, int64_t ci, int64_t ih,
                        int64_t iw) {
  return nhwc ? ((n * p.in_h + ih) * p.in_w + iw) * p.in_channels + ci
              : ((n * p.in_channels + ci) * p.in_h + ih) * p.in_w + iw;
}

// col [group][M][J]: pixel m's receptive field, zeros in the padding.
std::vector<float> gather_columns(const ConvParams& p, const float* x, bool nhwc) {
  const Geometry G = geometry(p, nhwc);
  const int64_t cin = p.in_channels_per_group(), pq = p.out_h * p.out_w;
  std::vector<float> col(size_t(G.groups * G.m * G.j));
  at::parallel_for(0, G.groups * G.m, 1, [&](int64_t begin, int64_t end) {
    for (int64_t gm = begin; gm < end; ++gm) {
      const int64_t g = gm / G.m, m = gm % G.m;
      const int64_t n = m / pq, oh = (m % pq) / p.out_w, ow = m % p.out_w;
      float* const row = col.data() + gm * G.j;
      for (int64_t r = 0; r < p.kernel_h; ++r) {
        const int64_t ih = oh * p.stride_h - p.pad_h + r * p.dilation_h;
        for (int64_t s = 0; s < p.kernel_w; ++s) {
          const int64_t iw = ow * p.stride_w - p.pad_w + s * p.dilation_w;
          const bool in = ih >= 0 && ih < p.in_h && iw >= 0 && iw < p.in_w;
          if (nhwc) {  // the tap's channels: one run
            float* dst = row + column(p, true, 0, r, s);
            if (in) {
              std::memcpy(dst, x + x_offset(p, true, n, g * cin, ih, iw),
                          size_t(cin) * sizeof(float));
            } else {
              std::fill(dst, dst + cin, 0.f);
            }
            continue;
          }
          for (int64_t c = 0; c < cin; ++c)
            row[column(p, false, c, r, s)] = in ? x[x_offset(p, false, n, g * cin + c, ih, iw)]
                                                : 0.f;
        }
      }
    }
  });
  return col;
}

// The same transposed, colT [group][J][mpad]: row j = (channel, tap) holds
// every pixel's value under that tap, zeros past M. Each (tap, pixel)'s
// input offset (channel 0 of group 0; -1 in the padding) is found once,
// not once per channel: the divisions that split a pixel index into
// (image, row, column) would cost more than the copy.
std::vector<float> gather_columns_t(const ConvParams& p, const float* x, int64_t mpad,
                                    bool nhwc) {
  const Geometry G = geometry(p, nhwc);
  const int64_t cin = p.in_channels_per_group(), pq = p.out_h * p.out_w;
  const int64_t taps = p.taps();
  std::vector<int64_t> offset(size_t(taps * G.m));
  for (int64_t m = 0; m < G.m; ++m) {
    const int64_t n = m / pq, oh = (m % pq) / p.out_w, ow = m % p.out_w;
    for (int64_t r = 0; r < p.kernel_h; ++r)
      for (int64_t s = 0; s < p.kernel_w; ++s) {
        const int64_t ih = oh * p.stride_h - p.pad_h + r * p.dilation_h;
        const int64_t iw = ow * p.stride_w - p.pad_w + s * p.dilation_w;
        const bool in = ih >= 0 && ih < p.in_h && iw >= 0 && iw < p.in_w;
        offset[size_t((r * p.kernel_w + s) * G.m + m)] = in ? x_offset(p, nhwc, n, 0, ih, iw) : -1;
      }
  }
  const int64_t channel_step = nhwc ? 1 : p.in_h * p.in_w;
  std::vector<float> colt(size_t(G.groups * G.j * mpad), 0.f);
  at::parallel_for(0, G.groups * cin, 1, [&](int64_t begin, int64_t end) {
    for (int64_t gc = begin; gc < end; ++gc) {
      const int64_t g = gc / cin, c = gc % cin;
      const float* xc = x + (g * cin + c) * channel_step;
      for (int64_t r = 0; r < p.kernel_h; ++r)
        for (int64_t s = 0; s < p.kernel_w; ++s) {
          float* dst = colt.data() + (g * G.j + column(p, nhwc, c, r, s)) * mpad;
          const int64_t* off = offset.data() + (r * p.kernel_w + s) * G.m;
          for (int64_t m = 0; m < G.m; ++m)
            if (off[m] >= 0) dst[m] = xc[off[m]];
        }
    }
  });
  return colt;
}

// grad_output as [group][K][M].
std::vector<float> gather_grad_out(const ConvParams& p, const float* go, bool nhwc) {
  const Geometry G = geometry(p, nhwc);
  const int64_t pq = p.out_h * p.out_w;
  std::vector<float> out(size_t(p.out_channels * G.m));
  if (nhwc) {  // [M][K]: a transpose
    for (int64_t m = 0; m < G.m; ++m)
      for (int64_t k = 0; k < p.out_channels; ++k) out[k * G.m + m] = go[m * p.out_channels + k];
    return out;
  }
  for (int64_t k = 0; k < p.out_channels; ++k)
    for (int64_t n = 0; n < p.batch; ++n)
      std::memcpy(out.data() + k * G.m + n * pq, go + (n * p.out_channels + k) * pq,
                  size_t(pq) * sizeof(float));
  return out;
}

// Where output pixel m of output channel 0 lies in y, for every m (output
// channel k at k * out_step(p, nhwc) from there): found once, not by
// dividing m for every value written.
std::vector<int64_t> y_offsets(const ConvParams& p, bool nhwc) {
  const int64_t pq = p.out_h * p.out_w, m = p.batch * pq;
  std::vector<int64_t> at(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i)
    at[size_t(i)] = nhwc ? i * p.out_channels : (i / pq) * p.out_channels * pq + i % pq;
  return at;
}
inline int64_t out_step(const ConvParams& p, bool nhwc) {
  return nhwc ? 1 : p.out_h * p.out_w;
}

template <typename T>
using vec = typename T::vec;

template <typename T>
__attribute__((always_inline)) inline vec<T> load(const float* at) {
  return *reinterpret_cast<const typename T::vec_unaligned*>(at);
}
template <typename T>
__attribute__((always_inline)) inline void store(float* at, vec<T> v) {
  *reinterpret_cast<typename T::vec_unaligned*>(at) = v;
}
template <typename T>
__attribute__((always_inline)) inline float lane_sum(vec<T> v) {
  return pairwise_lane_sum<vec<T>, T::kVL>(v);
}

// ---- fprop: a task is kRows output channels of one group, every pixel.
struct Fprop {
  const ConvParams& p;
  const float *col, *w, *bias;
  float* y;
  Geometry G;
  const int64_t* y_at;  // y_offsets
  int64_t k_step;       // out_step
};

template <typename T>
__attribute__((always_inline)) inline void fprop_tile(const Fprop& a, int64_t g, int64_t k0,
                                                      int64_t m0) {
  const Geometry& G = a.G;
  const int64_t jv = G.j - G.j % T::kVL;
  // Rows and pixels past the end repeat the last and are dropped.
  const float* wr[kRows];
  const float* cr[kPix];
  for (int r = 0; r < kRows; ++r)
    wr[r] = a.w + (g * G.kg + std::min<int64_t>(k0 + r, G.kg - 1)) * G.j;
  for (int q = 0; q < kPix; ++q)
    cr[q] = a.col + (g * G.m + std::min<int64_t>(m0 + q, G.m - 1)) * G.j;
  vec<T> acc[kRows][kPix];
  for (int r = 0; r < kRows; ++r)
    for (int q = 0; q < kPix; ++q) acc[r][q] = vec<T>{};
  for (int64_t j = 0; j < jv; j += T::kVL) {
    vec<T> wv[kRows], cv[kPix];
    for (int r = 0; r < kRows; ++r) wv[r] = load<T>(wr[r] + j);
    for (int q = 0; q < kPix; ++q) cv[q] = load<T>(cr[q] + j);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
      for (int q = 0; q < kPix; ++q) acc[r][q] += wv[r] * cv[q];
  }
  for (int q = 0; q < kPix && m0 + q < G.m; ++q)
    for (int r = 0; r < kRows && k0 + r < G.kg; ++r) {
      const int64_t k = g * G.kg + k0 + r;
      float sum = lane_sum<T>(acc[r][q]);
      for (int64_t j = jv; j < G.j; ++j) sum += wr[r][j] * cr[q][j];
      a.y[a.y_at[m0 + q] + k * a.k_step] = sum + (a.bias ? a.bias[k] : 0.f);
    }
}

template <typename T>
__attribute__((always_inline)) inline void fprop_range(const Fprop& a, int64_t begin,
                                                       int64_t end) {
  const int64_t kblocks = (a.G.kg + kRows - 1) / kRows;
  for (int64_t t = begin; t < end; ++t)
    for (int64_t m0 = 0; m0 < a.G.m; m0 += kPix)
      fprop_tile<T>(a, t / kblocks, (t % kblocks) * kRows, m0);
}
CONV2D_EXT_ISA_VARIANTS(fprop, Fprop, fprop_range)

// ---- fprop with the pixels as the vectors: with the columns transposed,
// colT [group][J][mpad] (pixels padded with zeros to whole groups of kCols
// vectors), each step along J is kRows broadcast weights times kCols
// vectors of pixels, and no lanes are added at the end. Taken where the
// pixels fill most of their vectors: the dot products along J above spend
// as much on adding lanes as on the math where J is short.
struct FpropT {
  const ConvParams& p;
  const float *colt, *w, *bias;
  float* y;
  Geometry G;
  int64_t mpad;
  const int64_t* y_at;  // y_offsets
  int64_t k_step;       // out_step
};

template <typename T>
__attribute__((always_inline)) inline void fprop_t_tile(const FpropT& a, int64_t g, int64_t k0,
                                                        int64_t m0) {
  const Geometry& G = a.G;
  // Rows past the group's end repeat its last and are dropped.
  const float* wr[kRows];
  for (int r = 0; r < kRows; ++r)
    wr[r] = a.w + (g * G.kg + std::min<int64_t>(k0 + r, G.kg - 1)) * G.j;
  const float* const ct = a.colt + g * G.j * a.mpad + m0;
  vec<T> acc[kRows][kCols];
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) acc[r][c] = vec<T>{};
  for (int64_t j = 0; j < G.j; ++j) {
    vec<T> cv[kCols];
    for (int c = 0; c < kCols; ++c) cv[c] = load<T>(ct + j * a.mpad + c * T::kVL);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const float wv = wr[r][j];
#pragma GCC unroll 4
      for (int c = 0; c < kCols; ++c) acc[r][c] += wv * cv[c];
    }
  }
  float out[kRows][kCols * T::kVL];
  std::memcpy(out, acc, sizeof(out));
  const int64_t rows = std::min<int64_t>(kRows, G.kg - k0);
  const int64_t pixels = std::min<int64_t>(kCols * T::kVL, G.m - m0);
  float b[kRows];
  for (int r = 0; r < kRows; ++r) b[r] = a.bias && r < rows ? a.bias[g * G.kg + k0 + r] : 0.f;
  // A pixel's rows together: adjacent in channels_last (not a line apart
  // as each row's pixels are).
  for (int64_t q = 0; q < pixels; ++q) {
    float* yq = a.y + a.y_at[m0 + q] + (g * G.kg + k0) * a.k_step;
    for (int64_t r = 0; r < rows; ++r) yq[r * a.k_step] = out[r][q] + b[r];
  }
}

template <typename T>
__attribute__((always_inline)) inline void fprop_t_range(const FpropT& a, int64_t begin,
                                                         int64_t end) {
  const int64_t kblocks = (a.G.kg + kRows - 1) / kRows;
  for (int64_t t = begin; t < end; ++t)
    for (int64_t m0 = 0; m0 < a.G.m; m0 += kCols * T::kVL)
      fprop_t_tile<T>(a, t / kblocks, (t % kblocks) * kRows, m0);
}
CONV2D_EXT_ISA_VARIANTS(fprop_t, FpropT, fprop_t_range)

// ---- dgrad: a task is one chunk of J of one group, every pixel; the
// columns' gradients go to dcol [group][M][J].
struct Dgrad {
  const float *go, *w;  // go: [group][K][M]
  float* dcol;
  Geometry G;
};

template <typename T>
__attribute__((always_inline)) inline void dgrad_tile(const Dgrad& a, int64_t g, int64_t j0,
                                                      int64_t m0) {
  const Geometry& G = a.G;
  constexpr int64_t kWidth = chunk_floats<T>();
  const float* const wg = a.w + g * G.kg * G.j;
  const float* const gog = a.go + g * G.kg * G.m;
  const int64_t mq = std::min<int64_t>(kPix, G.m - m0);
  // The sum over K in runs of kRunK, each from zero and then added to the
  // total in dcol: one chain over a long K lost a few times PyTorch's
  // accuracy.
  if (j0 + kWidth <= G.j) {
    for (int64_t k0 = 0; k0 < G.kg; k0 += kRunK) {
      vec<T> acc[kPix][kCols];
      for (int q = 0; q < kPix; ++q)
        for (int c = 0; c < kCols; ++c) acc[q][c] = vec<T>{};
      for (int64_t k = k0; k < std::min(G.kg, k0 + kRunK); ++k) {
        vec<T> wv[kCols];
        for (int c = 0; c < kCols; ++c) wv[c] = load<T>(wg + k * G.j + j0 + c * T::kVL);
        // Pixels past the end repeat the last and are dropped.
        float gv[kPix];
        for (int q = 0; q < kPix; ++q) gv[q] = gog[k * G.m + m0 + std::min<int64_t>(q, mq - 1)];
#pragma GCC unroll 4
        for (int q = 0; q < kPix; ++q)
#pragma GCC unroll 4
          for (int c = 0; c < kCols; ++c) acc[q][c] += gv[q] * wv[c];
      }
      for (int64_t q = 0; q < mq; ++q)
        for (int c = 0; c < kCols; ++c) {
          float* at = a.dcol + (g * G.m + m0 + q) * G.j + j0 + c * T::kVL;
          store<T>(at, k0 == 0 ? acc[q][c] : load<T>(at) + acc[q][c]);
        }
    }
    return;
  }
  // The last, partial chunk: the same sums, one column at a time.
  for (int64_t q = 0; q < mq; ++q)
    for (int64_t j = j0; j < G.j; ++j) {
      float total = 0.f;
      for (int64_t k0 = 0; k0 < G.kg; k0 += kRunK) {
        float sum = 0.f;
        for (int64_t k = k0; k < std::min(G.kg, k0 + kRunK); ++k)
          sum += wg[k * G.j + j] * gog[k * G.m + m0 + q];
        total = k0 == 0 ? sum : total + sum;
      }
      a.dcol[(g * G.m + m0 + q) * G.j + j] = total;
    }
}

template <typename T>
__attribute__((always_inline)) inline void dgrad_range(const Dgrad& a, int64_t begin,
                                                       int64_t end) {
  const int64_t chunks = (a.G.j + chunk_floats<T>() - 1) / chunk_floats<T>();
  for (int64_t t = begin; t < end; ++t)
    for (int64_t m0 = 0; m0 < a.G.m; m0 += kPix)
      dgrad_tile<T>(a, t / chunks, (t % chunks) * chunk_floats<T>(), m0);
}
CONV2D_EXT_ISA_VARIANTS(dgrad, Dgrad, dgrad_range)

// ---- wgrad: a task is kRows output channels x one chunk of J of one
// group, summed over every pixel.
struct Wgrad {
  const float *go, *col;  // go: [group][K][M]
  float* gw;
  Geometry G;
};

// Pixels [m0, m1) of a tile's products (kr rows of grad_output from gor,
// the chunk of J from j0), summed from zero into acc.
template <typename T>
__attribute__((always_inline)) inline void wgrad_run(const Geometry& G, const float* gor,
                                                     const float* colg, int64_t kr, int64_t j0,
                                                     int64_t m0, int64_t m1,
                                                     vec<T> (&acc)[kRows][kCols]) {
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) acc[r][c] = vec<T>{};
  for (int64_t m = m0; m < m1; ++m) {
    vec<T> cv[kCols];
    for (int c = 0; c < kCols; ++c) cv[c] = load<T>(colg + m * G.j + j0 + c * T::kVL);
    // Rows past the end repeat the last and are dropped.
    float gv[kRows];
    for (int r = 0; r < kRows; ++r) gv[r] = gor[std::min<int64_t>(r, kr - 1) * G.m + m];
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
      for (int c = 0; c < kCols; ++c) acc[r][c] += gv[r] * cv[c];
  }
}

template <typename T>
__attribute__((always_inline)) inline void wgrad_tile(const Wgrad& a, int64_t g, int64_t k0,
                                                      int64_t j0) {
  const Geometry& G = a.G;
  constexpr int64_t kWidth = chunk_floats<T>();
  const int64_t kr = std::min<int64_t>(kRows, G.kg - k0);
  const float* const gor = a.go + (g * G.kg + k0) * G.m;
  const float* const colg = a.col + g * G.m * G.j;
  float* const gwr = a.gw + (g * G.kg + k0) * G.j;
  if (j0 + kWidth <= G.j) {
    vec<T> acc[kRows][kCols];
    // The pixels in runs of kRunM, each summed from zero and then added to
    // the tile's total in gw. A single run (few pixels, where tiles are
    // many and short) keeps the loop of one: the runs' loop cost those
    // tiles twice their time.
    if (G.m <= kRunM) {
      wgrad_run<T>(G, gor, colg, kr, j0, 0, G.m, acc);
      for (int64_t r = 0; r < kr; ++r)
        for (int c = 0; c < kCols; ++c) store<T>(gwr + r * G.j + j0 + c * T::kVL, acc[r][c]);
      return;
    }
    for (int64_t m0 = 0; m0 < G.m; m0 += kRunM) {
      wgrad_run<T>(G, gor, colg, kr, j0, m0, std::min<int64_t>(G.m, m0 + kRunM), acc);
      for (int64_t r = 0; r < kr; ++r)
        for (int c = 0; c < kCols; ++c) {
          float* const out = gwr + r * G.j + j0 + c * T::kVL;
          store<T>(out, m0 == 0 ? acc[r][c] : load<T>(out) + acc[r][c]);
        }
    }
    return;
  }
  for (int64_t r = 0; r < kr; ++r)
    for (int64_t j = j0; j < G.j; ++j) {
      float total = 0.f;
      for (int64_t m0 = 0; m0 < G.m; m0 += kRunM) {
        float sum = 0.f;
        for (int64_t m = m0; m < std::min<int64_t>(G.m, m0 + kRunM); ++m)
          sum += gor[r * G.m + m] * colg[m * G.j + j];
        total += sum;
      }
      gwr[r * G.j + j] = total;
    }
}

template <typename T>
__attribute__((always_inline)) inline void wgrad_range(const Wgrad& a, int64_t begin,
                                                       int64_t end) {
  const int64_t chunks = (a.G.j + chunk_floats<T>() - 1) / chunk_floats<T>();
  const int64_t kblocks = (a.G.kg + kRows - 1) / kRows;
  for (int64_t t = begin; t < end; ++t) {
    const int64_t chunk = t % chunks, rest = t / chunks;
    wgrad_tile<T>(a, rest / kblocks, (rest % kblocks) * kRows, chunk * chunk_floats<T>());
  }
}
CONV2D_EXT_ISA_VARIANTS(wgrad, Wgrad, wgrad_range)

// dgrad's col2im into channels_last grad_input: a task takes `planes`
// channels of one image, each pixel's taps added in the order of the NCHW
// path (pixels ascending, then taps).
void col2im_nhwc(const ConvParams& p, const Geometry& G, const float* dcol, float* grad_in,
                 int64_t planes) {
  const int64_t cin = p.in_channels_per_group(), pq = p.out_h * p.out_w;
  const int64_t blocks = (p.in_channels + planes - 1) / planes;
  at::parallel_for(0, p.batch * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t n = task / blocks, ci0 = (task % blocks) * planes;
      const int64_t ci1 = std::min<int64_t>(p.in_channels, ci0 + planes);
      for (int64_t ih = 0; ih < p.in_h; ++ih)
        for (int64_t iw = 0; iw < p.in_w; ++iw) {
          float* dst = grad_in + x_offset(p, true, n, 0, ih, iw);
          std::fill(dst + ci0, dst + ci1, 0.f);
        }
      for (int64_t m = n * pq; m < (n + 1) * pq; ++m) {
        const int64_t oh = (m % pq) / p.out_w, ow = m % p.out_w;
        for (int64_t r = 0; r < p.kernel_h; ++r) {
          const int64_t ih = oh * p.stride_h - p.pad_h + r * p.dilation_h;
          if (ih < 0 || ih >= p.in_h) continue;
          for (int64_t s = 0; s < p.kernel_w; ++s) {
            const int64_t iw = ow * p.stride_w - p.pad_w + s * p.dilation_w;
            if (iw < 0 || iw >= p.in_w) continue;
            float* dst = grad_in + x_offset(p, true, n, 0, ih, iw);
            for (int64_t ci = ci0; ci < ci1; ++ci) {
              const int64_t g = ci / cin, c = ci % cin;
              dst[ci] += dcol[(g * G.m + m) * G.j + column(p, true, c, r, s)];
            }
          }
        }
      }
    }
  });
}

int64_t chunks(Isa i, int64_t j) {
  const int64_t width = pick(i, chunk_floats<Avx512>(), chunk_floats<Avx2>(),
                             chunk_floats<Baseline>());
  return (j + width - 1) / width;
}

}  // namespace

void fprop_few_pixels(const ConvParams& p, const float* x, const float* w, const float* bias,
                      float* y, bool nhwc) {
  const Geometry G = geometry(p, nhwc);
  if (G.m == 0) return;
  const Isa i = isa();
  const int64_t width =
      pick(i, chunk_floats<Avx512>(), chunk_floats<Avx2>(), chunk_floats<Baseline>());
  const int64_t mpad = (G.m + width - 1) / width * width;
  const int64_t kblocks = (G.kg + kRows - 1) / kRows;
  const std::vector<int64_t> y_at = y_offsets(p, nhwc);
  // Pixels filling at least 3/4 of their vectors, and a short J (longer
  // ones amortise the lanes' sum, and the pixel form's broadcasts from four
  // weight rows cost more than its math saves).
  if (4 * G.m >= 3 * mpad && G.j <= 256) {
    const std::vector<float> colt = gather_columns_t(p, x, mpad, nhwc);
    const FpropT a{p, colt.data(), w, bias, y, G, mpad, y_at.data(), out_step(p, nhwc)};
    auto* run = pick(i, &fprop_t_avx512, &fprop_t_avx2, &fprop_t_baseline);
    at::parallel_for(0, G.groups * kblocks, 1,
                     [&](int64_t begin, int64_t end) { run(a, begin, end); });
    return;
  }
  const std::vector<float> col = gather_columns(p, x, nhwc);
  const Fprop a{p, col.data(), w, bias, y, G, y_at.data(), out_step(p, nhwc)};
  auto* run = pick(i, &fprop_avx512, &fprop_avx2, &fprop_baseline);
  at::parallel_for(0, G.groups * ((G.kg + kRows - 1) / kRows), 1,
                   [&](int64_t begin, int64_t end) { run(a, begin, end); });
}

void dgrad_few_pixels(const ConvParams& p, const float* grad_out, const float* w,
                      float* grad_in, bool nhwc) {
  const Geometry G = geometry(p, nhwc);
  const int64_t cin = p.in_channels_per_group(), pq = p.out_h * p.out_w;
  const int64_t in_plane = p.in_h * p.in_w;
  std::vector<float> dcol(size_t(G.groups * G.m * G.j));
  if (G.m > 0) {
    const std::vector<float> go = gather_grad_out(p, grad_out, nhwc);
    const Dgrad a{go.data(), w, dcol.data(), G};
    const Isa i = isa();
    auto* run = pick(i, &dgrad_avx512, &dgrad_avx2, &dgrad_baseline);
    at::parallel_for(0, G.groups * chunks(i, G.j), 1,
                     [&](int64_t begin, int64_t end) { run(a, begin, end); });
  }
  // Each input plane adds the columns that read it, pixel by pixel, tap by
  // tap (col2im), into zeros. A task takes kPlanes planes of one image at
  // once, so that each pixel's column is read as one run rather than a
  // float per plane.
  constexpr int64_t kPlanes = 16;
  const int64_t blocks = (p.in_channels + kPlanes - 1) / kPlanes;
  if (nhwc) {
    col2im_nhwc(p, G, dcol.data(), grad_in, kPlanes);
    return;
  }
  at::parallel_for(0, p.batch * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t n = task / blocks, ci0 = (task % blocks) * kPlanes;
      const int64_t ci1 = std::min<int64_t>(p.in_channels, ci0 + kPlanes);
      std::fill(grad_in + (n * p.in_channels + ci0) * in_plane,
                grad_in + (n * p.in_channels + ci1) * in_plane, 0.f);
      for (int64_t m = n * pq; m < (n + 1) * pq; ++m) {
        const int64_t oh = (m % pq) / p.out_w, ow = m % p.out_w;
        for (int64_t ci = ci0; ci < ci1; ++ci) {
          const int64_t g = ci / cin, c = ci % cin;
          float* dst = grad_in + (n * p.in_channels + ci) * in_plane;
          const float* src = dcol.data() + (g * G.m + m) * G.j + c * p.taps();
          for (int64_t r = 0; r < p.kernel_h; ++r) {
            const int64_t ih = oh * p.stride_h - p.pad_h + r * p.dilation_h;
            if (ih < 0 || ih >= p.in_h) continue;
            for (int64_t s = 0; s < p.kernel_w; ++s) {
              const int64_t iw = ow * p.stride_w - p.pad_w + s * p.dilation_w;
              if (iw >= 0 && iw < p.in_w) dst[ih * p.in_w + iw] += src[r * p.kernel_w + s];
            }
          }
        }
      }
    }
  });
}

void wgrad_few_pixels(const ConvParams& p, const float* grad_out, const float* x,
                      float* grad_w, bool nhwc) {
  const Geometry G = geometry(p, nhwc);
  const std::vector<float> col = gather_columns(p, x, nhwc);
  const std::vector<float> go = gather_grad_out(p, grad_out, nhwc);
  const Wgrad a{go.data(), col.data(), grad_w, G};
  const Isa i = isa();
  auto* run = pick(i, &wgrad_avx512, &wgrad_avx2, &wgrad_baseline);
  at::parallel_for(0, G.groups * ((G.kg + kRows - 1) / kRows) * chunks(i, G.j), 1,
                   [&](int64_t begin, int64_t end) { run(a, begin, end); });
}

}  // namespace cpu
}  // namespace conv2d_ext
