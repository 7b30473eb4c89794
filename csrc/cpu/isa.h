// The CPU kernels' instruction sets: each micro-kernel is written once over
// GCC/Clang vector extensions and compiled for AVX-512, AVX2 + FMA and
// baseline x86-64, in functions with the matching target attribute; the
// widest the CPU has (and the options allow) runs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

// x86-64 compiles the wider variants with target attributes; elsewhere
// (aarch64) they are the baseline code, never chosen.
#if defined(__x86_64__) || defined(__i386__)
#define CONV2D_EXT_TARGET(isa) __attribute__((target(isa)))
#else
#define CONV2D_EXT_TARGET(isa)
#endif

// name_avx512, name_avx2 and name_baseline(const Problem&, begin, end):
// range<Traits>(...) compiled once per instruction set, each in a function
// with its target attribute (a lambda or template instance would not carry
// the target), over the file's traits types Avx512, Avx2 and Baseline;
// pick() chooses the one to run.
#define CONV2D_EXT_ISA_VARIANTS(name, Problem, range)                                       \
  CONV2D_EXT_TARGET("avx512f")                                                              \
  void name##_avx512(const Problem& a, int64_t begin, int64_t end) {                        \
    range<Avx512>(a, begin, end);                                                           \
  }                                                                                         \
  CONV2D_EXT_TARGET("avx2,fma")                                                             \
  void name##_avx2(const Problem& a, int64_t begin, int64_t end) {                          \
    range<Avx2>(a, begin, end);                                                             \
  }                                                                                         \
  void name##_baseline(const Problem& a, int64_t begin, int64_t end) {                      \
    range<Baseline>(a, begin, end);                                                         \
  }

// Lanes (indices...) of the concatenation of vectors a and b, the indices
// constant: GCC spells it __builtin_shuffle with a mask vector of type
// `mask` (its __builtin_shufflevector is newer than the GCC we support),
// Clang __builtin_shufflevector.
#if defined(__clang__)
#define CONV2D_EXT_SHUFFLE(a, b, mask, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define CONV2D_EXT_SHUFFLE(a, b, mask, ...) __builtin_shuffle(a, b, mask{__VA_ARGS__})
#endif

namespace conv2d_ext {
namespace cpu {

// An int vector of kLanes lanes, the mask type of CONV2D_EXT_SHUFFLE for
// a float vector of as many (one typedef per width: a vector_size that
// depends on a template parameter loses the vector type).
template <int kLanes>
struct IntVector;
template <>
struct IntVector<16> {
  typedef int type __attribute__((vector_size(64)));
};
template <>
struct IntVector<8> {
  typedef int type __attribute__((vector_size(32)));
};
template <>
struct IntVector<4> {
  typedef int type __attribute__((vector_size(16)));
};

// v's lanes rotated down by kH: lane l holds v[(l + kH) % kVL].
template <typename V, int kVL, int kH, int... kL>
__attribute__((always_inline)) inline V rotate_lanes(V v, std::integer_sequence<int, kL...>) {
  return CONV2D_EXT_SHUFFLE(v, v, typename IntVector<kVL>::type, ((kL + kH) % kVL)...);
}

// The sum of v's kVL lanes as a tree of pairs (halves added, then their
// halves): a tree's rounding rather than a chain's, in log2(kVL) vector
// adds.
template <typename V, int kVL>
__attribute__((always_inline)) inline float pairwise_lane_sum(V v) {
  static_assert(kVL == 4 || kVL == 8 || kVL == 16, "the rotations below sum 4, 8 or 16 lanes");
  const auto lanes = std::make_integer_sequence<int, kVL>{};
  if constexpr (kVL >= 16) v += rotate_lanes<V, kVL, 8>(v, lanes);
  if constexpr (kVL >= 8) v += rotate_lanes<V, kVL, 4>(v, lanes);
  v += rotate_lanes<V, kVL, 2>(v, lanes);
  v += rotate_lanes<V, kVL, 1>(v, lanes);
  return v[0];
}

// acc (kE x kN vectors V of kVL floats) added to `sums` ([kE][kN * kVL]),
// and zeroed: long reductions summed in runs, each run's sums from zero
// and then added to the total, so that no float32 chain runs long (one
// chain over a whole reduction lost a few times PyTorch's accuracy).
template <typename V, int kE, int kN, int kVL>
__attribute__((always_inline)) inline void add_to_sums(V (*acc)[kN], float* sums) {
  for (int e = 0; e < kE; ++e)
    for (int v = 0; v < kN; ++v) {
      V total;
      std::memcpy(&total, sums + (e * kN + v) * kVL, sizeof(total));
      total += acc[e][v];
      std::memcpy(sums + (e * kN + v) * kVL, &total, sizeof(total));
      acc[e][v] = V{};
    }
}

// Output rows (over the batch) a chunk of a channels_last wgrad sums before
// its partial sums are set aside: about 256 KiB of grad_output and input,
// so that a chunk and the next one fetched beside it both stay in a core's
// L2; a count fixed by the shape, not the threads, so that the chunks'
// sums, added in order, do not depend on the thread count.
inline int64_t nhwc_wgrad_chunk_rows(int64_t channels, int64_t out_w, int64_t in_w,
                                     int64_t stride_h) {
  constexpr int64_t kChunkBytes = 256 << 10;
  const int64_t row_bytes = int64_t(sizeof(float)) * channels * (out_w + in_w * stride_h);
  return std::max<int64_t>(1, kChunkBytes / row_bytes);
}

// A depthwise weight [C][taps] as [taps][C]: a tap's weights for a vector
// of channels contiguous.
inline std::vector<float> tap_major(const float* w, int64_t channels, int64_t taps) {
  std::vector<float> wt(size_t(taps * channels));
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t t = 0; t < taps; ++t) wt[size_t(t * channels + c)] = w[c * taps + t];
  return wt;
}

enum class Isa { kAvx512, kAvx2, kBaseline };

// The widest the CPU has and the options allow (tests switch the wider ones
// off to cover the others).
Isa isa();

template <typename F>
F pick(Isa i, F avx512, F avx2, F baseline) {
  return i == Isa::kAvx512 ? avx512 : i == Isa::kAvx2 ? avx2 : baseline;
}

}  // namespace cpu
}  // namespace conv2d_ext
