// Tensor-core and async-copy primitives (sm_80 and newer) for the
// implicit-GEMM kernels, and the float32 operand treatments of the two
// precision modes.
#pragma once

#include <cstdint>

namespace conv2d_ext {
namespace cuda {

// How float32 operands reach the TF32 tensor cores.
enum class TcMath {
  kTF32,     // each operand rounded to nearest TF32: one product
  k3xTF32,   // big + small split: three products, FP32-accurate
};

__device__ __forceinline__ uint32_t tf32_round(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// x = big + small: big is x truncated to TF32, small the residual rounded
// to TF32. big*big + big*small + small*big misses only small*small, about
// 2^-22 of the product.
// Non-finite x: clamping first makes big the largest finite TF32 and small
// x itself (Inf) or NaN, so Inf*b stays Inf even where b's small part is
// zero (Inf as big would give Inf*0 = NaN there), and NaN stays NaN.
__device__ __forceinline__ void tf32_split(float x, uint32_t& big,
                                           uint32_t& small) {
  constexpr float kMax = 3.40282347e38f;  // FLT_MAX
  big = __float_as_uint(fminf(fmaxf(x, -kMax), kMax)) & 0xffffe000u;
  small = tf32_round(x - __uint_as_float(big));
}

// D += A * B for one m16n8k8 TF32 tile (A row-major 16x8, B column-major
// 8x8, FP32 accumulators), fragments as the PTX ISA lays them out.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();  // the plan never picks tensor-core kernels below sm_80
#endif
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 4-byte async copy; copies zeros instead when !valid (src is not read).
__device__ __forceinline__ void cp_async_4(void* smem, const float* src,
                                           bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(
                   smem_addr(smem)),
               "l"(src), "r"(valid ? 4 : 0));
#endif
}

__device__ __forceinline__ void cp_async_16(void* smem, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                   smem_addr(smem)),
               "l"(src));
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

}  // namespace cuda
}  // namespace conv2d_ext
