// The packed-group kernels (grouped.h): the forward here, wgrad below.
//
// With q input and q output channels a group, output channels [b, b + kVL)
// (kVL / q whole groups, b a multiple of q) read input channels [b, b + kVL)
// only: lane l's output channel b + l sums input channels
// b + (l / q) * q + c over c < q. So one vector load of an input pixel's
// channels [b, b + kVL) serves the whole block: for each c a shuffle
// spreads channel (l / q) * q + c of each group across that group's lanes
// (within 128-bit lanes for q <= 4), times a vector of packed weights
// (lane l: w[b + l][c][tap]). A task is one output row of one image: runs
// of kP pixels, every block of channels of each run before the next (the
// run's input pixels stay in L1 across the blocks). Taps in the padding are
// skipped, so the input is not copied. Each output's sum runs in a fixed
// order, whatever the thread count.
#include "grouped.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "isa.h"

namespace conv2d_ext {
namespace cpu {
namespace {

// kVL floats a vector, kP pixels a run (kP accumulators beside q weight
// vectors, an input vector and its spread, within the registers).
#define CONV2D_EXT_GROUPED_TRAITS(Name, lanes, pixels)                                      \
  struct Name {                                                                             \
    static constexpr int kVL = lanes, kP = pixels;                                          \
    typedef float vec __attribute__((vector_size(lanes * sizeof(float))));                  \
    typedef float unaligned __attribute__((vector_size(lanes * sizeof(float)), aligned(4))); \
    typedef int ivec __attribute__((vector_size(lanes * sizeof(int))));                     \
  };
CONV2D_EXT_GROUPED_TRAITS(Avx512, 16, 12)
CONV2D_EXT_GROUPED_TRAITS(Avx2, 8, 6)
CONV2D_EXT_GROUPED_TRAITS(Baseline, 4, 6)
#undef CONV2D_EXT_GROUPED_TRAITS

struct Problem {
  const ConvParams& p;
  const float *x, *wpk, *bias;  // x [N][H][W][C]; wpk [block][tap][c][kVL]
  float* y;                     // [N][P][Q][K]
};

// The first channel of block b: blocks of kVL channels, the last one ending
// at the last channel (overlapping the one before it: its first lanes are
// computed again, to the same bits).
inline int64_t block_start(int64_t b, int64_t vl, int64_t channels) {
  return std::min(b * vl, channels - vl);
}

template <typename T>
__attribute__((always_inline)) inline typename T::vec load(const float* at) {
  return *reinterpret_cast<const typename T::unaligned*>(at);
}

// Lane l: channel (l / kQ) * kQ + kC of the vector.
template <typename T, int kQ, int kC, int... kL>
__attribute__((always_inline)) inline typename T::vec spread(typename T::vec x,
                                                            std::integer_sequence<int, kL...>) {
  return CONV2D_EXT_SHUFFLE(x, x, typename T::ivec, ((kL / kQ) * kQ + kC)...);
}

// acc += sum over c < kQ of spread(x, c) * w[c].
template <typename T, int kQ, int... kC>
__attribute__((always_inline)) inline void multiply_add(typename T::vec& acc,
                                                        typename T::vec x,
                                                        const typename T::vec* w,
                                                        std::integer_sequence<int, kC...>) {
  const auto lanes = std::make_integer_sequence<int, T::kVL>{};
  ((acc += spread<T, kQ, kC>(x, lanes) * w[kC]), ...);
}

// kP pixels of output row oh from ow0, channels [b, b + kVL). kEdge: the
// run reaches past the input's ends or the output row's, so each tap checks
// its column and pixels past the row are skipped.
template <typename T, int kQ, bool kEdge>
__attribute__((always_inline)) inline void run(const Problem& a, int64_t n, int64_t oh,
                                               int64_t ow0, int64_t b, const float* wb) {
  typedef typename T::vec vec;
  constexpr int kP = T::kP, kVL = T::kVL;
  const ConvParams& p = a.p;
  const int64_t C = p.in_channels;
  const int64_t npix = kEdge ? std::min<int64_t>(kP, p.out_w - ow0) : kP;
  vec acc[kP];
  const vec bias = a.bias ? load<T>(a.bias + b) : vec{};
  for (int j = 0; j < kP; ++j) acc[j] = bias;
  for (int64_t r = 0; r < p.kernel_h; ++r) {
    const int64_t ih = oh * p.stride_h - p.pad_h + r * p.dilation_h;
    if (ih < 0 || ih >= p.in_h) continue;
    const float* xrow = a.x + ((n * p.in_h + ih) * p.in_w) * C + b;
    for (int64_t s = 0; s < p.kernel_w; ++s) {
      vec w[kQ];
      const float* wt = wb + (r * p.kernel_w + s) * kQ * kVL;
      for (int c = 0; c < kQ; ++c) w[c] = load<T>(wt + c * kVL);
      const int64_t iw0 = ow0 * p.stride_w - p.pad_w + s * p.dilation_w;
#pragma GCC unroll 16
      for (int j = 0; j < kP; ++j) {
        const int64_t iw = iw0 + j * p.stride_w;
        if (kEdge && (j >= npix || iw < 0 || iw >= p.in_w)) continue;
        multiply_add<T, kQ>(acc[j], load<T>(xrow + iw * C), w,
                            std::make_integer_sequence<int, kQ>{});
      }
    }
  }
  float* yrow = a.y + ((n * p.out_h + oh) * p.out_w + ow0) * p.out_channels + b;
  for (int64_t j = 0; j < npix; ++j)
    *reinterpret_cast<typename T::unaligned*>(yrow + j * p.out_channels) = acc[j];
}

template <typename T, int kQ>
__attribute__((always_inline)) inline void row(const Problem& a, int64_t n, int64_t oh) {
  constexpr int kP = T::kP, kVL = T::kVL;
  const ConvParams& p = a.p;
  const int64_t C = p.in_channels, blocks = (C + kVL - 1) / kVL, taps = p.taps();
  // The columns every tap of a run reads: a run is interior where both
  // ends of its reach are in the input and all its pixels in the row.
  const int64_t reach = (kP - 1) * p.stride_w + (p.kernel_w - 1) * p.dilation_w;
  for (int64_t ow0 = 0; ow0 < p.out_w; ow0 += kP) {
    const int64_t iw0 = ow0 * p.stride_w - p.pad_w;
    const bool edge = iw0 < 0 || iw0 + reach >= p.in_w || ow0 + kP > p.out_w;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t b = block_start(blk, kVL, C);
      const float* wb = a.wpk + blk * taps * kQ * kVL;
      if (edge) {
        run<T, kQ, true>(a, n, oh, ow0, b, wb);
      } else {
        run<T, kQ, false>(a, n, oh, ow0, b, wb);
      }
    }
  }
}

// Tasks [begin, end): output row t % P of image t / P.
template <typename T>
__attribute__((always_inline)) inline void rows(const Problem& a, int64_t begin, int64_t end) {
  const ConvParams& p = a.p;
  const int64_t q = p.in_channels_per_group();
  for (int64_t t = begin; t < end; ++t) {
    const int64_t n = t / p.out_h, oh = t % p.out_h;
    if (q == 2) {
      row<T, 2>(a, n, oh);
    } else if (q == 4) {
      row<T, 4>(a, n, oh);
    } else if constexpr (T::kVL >= 16) {  // (q == 8: half an AVX-512 vector)
      row<T, 8>(a, n, oh);
    }
  }
}
CONV2D_EXT_ISA_VARIANTS(grouped, Problem, rows)

// ---- wgrad. With q channels a group, rotate grad_output's vector within
// each group by d (lane m: channel (m / q) * q + (m % q + d) % q): lane m of
// its product with the input's vector (lane m: channel b + m, channel
// m % q of its group) is the term of grad_w[b + (m / q) * q + (m % q + d)
// % q][m % q] for that pixel and tap. So a pixel's grad_output vector,
// rotated, serves every tap of a kernel row, each tap one unshuffled input
// vector times the rotations: a pass over a chunk of output rows holds one
// kernel row's kS x kDN sums (kDN of the q rotations, as many as the
// registers hold beside them). Chunks are a fixed number of rows (not a
// share of the threads), their sums added in chunk order afterwards, so the
// result does not depend on the threads.
struct WgradProblem {
  const ConvParams& p;
  const float *x, *go;  // [N][H][W][C], [N][P][Q][C]
  float* partial;       // [chunk][tap][d][C]
  int64_t chunk_rows;   // output rows (over the batch) a chunk
};

// Rotations a pass takes: the most (a divisor of q) whose kS x kDN sums,
// kDN rotations and an input vector fit the registers.
template <typename T>
constexpr int rotations_per_pass(int q, int s) {
  const int regs = T::kVL == 16 ? 32 : 16;
  int dn = q;
  while (dn > 1 && dn * (s + 1) + 2 > regs) dn /= 2;
  return dn;
}

template <typename T, int kQ, int kD, int... kL>
__attribute__((always_inline)) inline typename T::vec rotate(typename T::vec v,
                                                            std::integer_sequence<int, kL...>) {
  return CONV2D_EXT_SHUFFLE(v, v, typename T::ivec, ((kL / kQ) * kQ + (kL % kQ + kD) % kQ)...);
}

// r[i] = rotation kD0 + i of g.
template <typename T, int kQ, int kD0, int... kI>
__attribute__((always_inline)) inline void rotations(typename T::vec g, typename T::vec* r,
                                                     std::integer_sequence<int, kI...>) {
  const auto lanes = std::make_integer_sequence<int, T::kVL>{};
  ((r[kI] = rotate<T, kQ, kD0 + kI>(g, lanes)), ...);
}

// Output pixel ow of a row: its grad_output rotations kD0 .. kD0 + kDN
// times the kS taps' input vectors. kChecked: taps outside the input are
// skipped.
template <typename T, int kQ, int kS, int kD0, int kDN, bool kChecked>
__attribute__((always_inline)) inline void wgrad_pixel(const ConvParams& p, const float* xrow,
                                                       const float* gorow, int64_t ow,
                                                       typename T::vec (*acc)[kDN]) {
  typedef typename T::vec vec;
  const int64_t C = p.in_channels;
  vec r[kDN];
  rotations<T, kQ, kD0>(load<T>(gorow + ow * C), r, std::make_integer_sequence<int, kDN>{});
  const int64_t iw0 = ow * p.stride_w - p.pad_w;
#pragma GCC unroll 8
  for (int s = 0; s < kS; ++s) {
    const int64_t iw = iw0 + s * p.dilation_w;
    if (kChecked && (iw < 0 || iw >= p.in_w)) continue;
    const vec xv = load<T>(xrow + iw * C);
#pragma GCC unroll 8
    for (int d = 0; d < kDN; ++d) acc[s][d] += r[d] * xv;
  }
}

// What a block's passes share: its chunk of rows, channels [b, b + kVL)
// (storing lanes lane0 on: the lanes below are another task's where the
// last block overlaps the one before), and the output columns [lo, hi)
// whose every tap of a row reads inside the input.
struct WgradBlock {
  int64_t chunk, t0, t1, b, lane0, lo, hi;
};

// Rotations kD0 .. kD0 + kDN of the block, kernel row by kernel row; then
// the next kDN rotations.
template <typename T, int kQ, int kS, int kD0, int kDN>
__attribute__((always_inline)) inline void wgrad_passes(const WgradProblem& a,
                                                        const WgradBlock& k) {
  typedef typename T::vec vec;
  const ConvParams& p = a.p;
  const int64_t C = p.in_channels, taps = p.taps();
  for (int64_t r = 0; r < p.kernel_h; ++r) {
    // Each output row's sums from zero, then added to the chunk's
    // (`total`): no chain over a whole chunk. (Runs of a few rows, behind a
    // branch, were no faster.)
    vec acc[kS][kDN];
    for (int s = 0; s < kS; ++s)
      for (int d = 0; d < kDN; ++d) acc[s][d] = vec{};
    alignas(64) float total[kS * kDN * T::kVL] = {};
    for (int64_t t = k.t0; t < k.t1; ++t) {
      const int64_t n = t / p.out_h, oh = t % p.out_h;
      const int64_t ih = oh * p.stride_h - p.pad_h + r * p.dilation_h;
      if (ih < 0 || ih >= p.in_h) continue;
      const float* xrow = a.x + ((n * p.in_h + ih) * p.in_w) * C + k.b;
      const float* gorow = a.go + t * p.out_w * C + k.b;
      for (int64_t ow = 0; ow < k.lo; ++ow)
        wgrad_pixel<T, kQ, kS, kD0, kDN, true>(p, xrow, gorow, ow, acc);
      for (int64_t ow = k.lo; ow < k.hi; ++ow)
        wgrad_pixel<T, kQ, kS, kD0, kDN, false>(p, xrow, gorow, ow, acc);
      for (int64_t ow = k.hi; ow < p.out_w; ++ow)
        wgrad_pixel<T, kQ, kS, kD0, kDN, true>(p, xrow, gorow, ow, acc);
      add_to_sums<typename T::vec, kS, kDN, T::kVL>(acc, total);
    }
    for (int s = 0; s < kS; ++s)
      for (int d = 0; d < kDN; ++d) {
        float* out = a.partial + ((k.chunk * taps + r * kS + s) * kQ + kD0 + d) * C + k.b;
        const float* sum = total + (s * kDN + d) * T::kVL;
        for (int64_t l = k.lane0; l < T::kVL; ++l) out[l] = sum[l];
      }
  }
  if constexpr (kD0 + kDN < kQ) wgrad_passes<T, kQ, kS, kD0 + kDN, kDN>(a, k);
}

template <typename T, int kQ, int kS>
__attribute__((always_inline)) inline void wgrad_blocks(const WgradProblem& a, int64_t begin,
                                                        int64_t end) {
  const ConvParams& p = a.p;
  const int64_t C = p.in_channels, blocks = (C + T::kVL - 1) / T::kVL;
  const int64_t reach = (kS - 1) * p.dilation_w;
  const int64_t lo = std::min<int64_t>(p.out_w, (p.pad_w + p.stride_w - 1) / p.stride_w);
  const int64_t last = p.in_w - 1 - reach + p.pad_w;  // interior: ow * stride_w <= last
  const int64_t hi =
      std::max<int64_t>(lo, last < 0 ? 0 : std::min<int64_t>(p.out_w, last / p.stride_w + 1));
  for (int64_t t = begin; t < end; ++t) {
    const int64_t chunk = t / blocks, blk = t % blocks;
    const int64_t b = block_start(blk, T::kVL, C), t0 = chunk * a.chunk_rows;
    const WgradBlock k{chunk, t0, std::min<int64_t>(t0 + a.chunk_rows, p.batch * p.out_h),
                       b,     blk * T::kVL - b, lo, hi};
    wgrad_passes<T, kQ, kS, 0, rotations_per_pass<T>(kQ, kS)>(a, k);
  }
}

// Whether (q, s) is (kQ, kS): then the tasks run. (No lambda: it would not
// carry the instruction set's target.)
template <typename T, int kQ, int kS>
__attribute__((always_inline)) inline bool wgrad_take(const WgradProblem& a, int64_t begin,
                                                      int64_t end, int q, int s) {
  if constexpr (2 * kQ <= T::kVL) {
    if (q == kQ && s == kS) {
      wgrad_blocks<T, kQ, kS>(a, begin, end);
      return true;
    }
  }
  return false;
}

template <typename T, int kQ>
__attribute__((always_inline)) inline bool wgrad_take_q(const WgradProblem& a, int64_t begin,
                                                        int64_t end, int q, int s) {
  return wgrad_take<T, kQ, 1>(a, begin, end, q, s) || wgrad_take<T, kQ, 3>(a, begin, end, q, s) ||
         wgrad_take<T, kQ, 5>(a, begin, end, q, s) || wgrad_take<T, kQ, 7>(a, begin, end, q, s);
}

// Tasks [begin, end): task t is vector t % blocks of the channels over
// chunk t / blocks (grouped_wgrad_nhwc_fits: q 2, 4 or 8; 1, 3, 5 or 7
// columns of taps).
template <typename T>
__attribute__((always_inline)) inline void wgrad_tasks(const WgradProblem& a, int64_t begin,
                                                       int64_t end) {
  const int q = int(a.p.in_channels_per_group()), s = int(a.p.kernel_w);
  (void)(wgrad_take_q<T, 2>(a, begin, end, q, s) || wgrad_take_q<T, 4>(a, begin, end, q, s) ||
         wgrad_take_q<T, 8>(a, begin, end, q, s));
}
CONV2D_EXT_ISA_VARIANTS(grouped_wgrad, WgradProblem, wgrad_tasks)

int vector_floats(Isa i) { return pick(i, Avx512::kVL, Avx2::kVL, Baseline::kVL); }

}  // namespace

bool grouped_nhwc_fits(const ConvParams& p) {
  const int64_t q = p.in_channels_per_group(), vl = vector_floats(isa());
  return p.groups > 1 && p.out_channels_per_group() == q && (q == 2 || q == 4 || q == 8) &&
         2 * q <= vl && p.in_channels >= vl;
}

bool grouped_wgrad_nhwc_fits(const ConvParams& p) {
  const int64_t s = p.kernel_w;
  return grouped_nhwc_fits(p) && (s == 1 || s == 3 || s == 5 || s == 7);
}

void wgrad_grouped_nhwc(const ConvParams& p, const float* grad_out, const float* x,
                        float* grad_w) {
  const Isa i = isa();
  const int64_t vl = vector_floats(i), C = p.in_channels, q = p.in_channels_per_group();
  const int64_t taps = p.taps(), rows = p.batch * p.out_h, blocks = (C + vl - 1) / vl;
  const int64_t chunk_rows = nhwc_wgrad_chunk_rows(C, p.out_w, p.in_w, p.stride_h);
  const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
  std::vector<float> partial(size_t(chunks * taps * q * C));
  const WgradProblem a{p, x, grad_out, partial.data(), chunk_rows};
  auto* run = pick(i, &grouped_wgrad_avx512, &grouped_wgrad_avx2, &grouped_wgrad_baseline);
  at::parallel_for(0, chunks * blocks, 1, [&](int64_t begin, int64_t end) { run(a, begin, end); });
  // grad_w [K][R][S][q] (channels_last): weight (k, tap, c) is rotation
  // d = (k % q - c) mod q of lane channel (k / q) * q + c, summed over the
  // chunks in order.
  at::parallel_for(0, C, 16, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      const int64_t base = ch / q * q, c = ch % q;
      for (int64_t d = 0; d < q; ++d) {
        const int64_t k = base + (c + d) % q;
        for (int64_t t = 0; t < taps; ++t) {
          float sum = 0.f;
          for (int64_t j = 0; j < chunks; ++j)
            sum += partial[size_t(((j * taps + t) * q + d) * C + ch)];
          grad_w[(k * taps + t) * q + c] = sum;
        }
      }
    }
  });
}

void fprop_grouped_nhwc(const ConvParams& p, const float* x, const float* w, const float* bias,
                        float* y) {
  const Isa i = isa();
  const int64_t vl = vector_floats(i), C = p.in_channels, q = p.in_channels_per_group();
  const int64_t taps = p.taps(), blocks = (C + vl - 1) / vl;
  // [block][tap][c][lane]: lane l of block b the weight of output channel
  // b + l for its group's input channel c.
  std::vector<float> wpk(size_t(blocks * taps * q * vl));
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t b = block_start(blk, vl, C);
    for (int64_t t = 0; t < taps; ++t)
      for (int64_t c = 0; c < q; ++c)
        for (int64_t l = 0; l < vl; ++l)
          wpk[size_t(((blk * taps + t) * q + c) * vl + l)] = w[((b + l) * q + c) * taps + t];
  }
  const Problem a{p, x, wpk.data(), bias, y};
  auto* run = pick(i, &grouped_avx512, &grouped_avx2, &grouped_baseline);
  at::parallel_for(0, p.batch * p.out_h, 1,
                   [&](int64_t begin, int64_t end) { run(a, begin, end); });
}

}  // namespace cpu
}  // namespace conv2d_ext
