// The CPU kernels' instruction sets: each micro-kernel is written once over
// GCC/Clang vector extensions and compiled for AVX-512, AVX2 + FMA and
// baseline x86-64, in functions with the matching target attribute; the
// widest the CPU has (and the options allow) runs.
#pragma once

#include <cstdint>

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
