// Tensor-core and async-copy primitives (sm_80 and newer) for the
// implicit-GEMM kernels, and the float32 operand treatments of the two
// precision modes.
#pragma once

#include <cstdint>

#include "../math_mode.h"

namespace conv2d_ext {
namespace cuda {

// x as a TF32 tensor-core operand, rounded to nearest (ties away, as
// cvt.rna): the tensor cores read an operand's top 19 bits and ignore the
// low 13, so adding half a TF32 ulp to the bits is enough (cvt.rna also
// clears them: three instructions where this takes two). Inf and NaN are
// left alone: a carry out of a NaN's mantissa (CUDA's NaN is 0x7fffffff)
// would make it a signed zero. Only for values the tensor cores read: the
// low bits stay, so the result is not x rounded as a float.
__device__ __forceinline__ uint32_t tf32_operand(float x) {
  const uint32_t bits = __float_as_uint(x);
  return isfinite(x) ? bits + 0x1000u : bits;
}

// tf32_operand without a predicate: half a TF32 ulp (x's sign and leading
// power of two, times 2^-11) added in floating point, where Inf and NaN
// stay what they are. For normal x the tensor cores read the same TF32
// value (a carry into the exponent truncates to the same power of two);
// subnormal x is left to their truncation. As many instructions as
// tf32_operand's compare and predicated add, but long runs of these
// interleave, where the compares queue for the seven predicate registers.
__device__ __forceinline__ uint32_t tf32_operand_fma(float x) {
  const float lead = __uint_as_float(__float_as_uint(x) & 0xff800000u);
  return __float_as_uint(fmaf(lead, 0x1p-11f, x));
}

// x = big + small, both tensor-core operands: big is x truncated to TF32
// (kRoundBig: rounded to nearest), an exact TF32 value; small the residual,
// rounded as an operand. big*big + big*small + small*big misses only
// small*small. A truncated big leaves up to 2^-10 of x to small (rounding
// small then leaves 2^-21 of x) and misses a small*small of up to 2^-20 of
// the product, with its sign; a rounded big leaves 2^-11 (2^-22) and up
// to 2^-22 of either sign, for one addition more. wgrad, whose long
// reductions need the margin against cuDNN's FP32, rounds. The flat
// forward (and dgrad through it) truncates for K from 512 to 2047, where
// rounding cost time and truncation already stays below cuDNN's error. It
// rounds where truncation would not: K below 512 (1x1 dgrad) and K from
// 2048 on, where it also cuts its accumulation into segments
// (sm90/config.h, kLongK; docs/kernels.md, "Precision: what every kernel
// shares").
// !kRoundSmall leaves small for the tensor cores to truncate: up to 2^-21
// of x after a rounded big, of either sign (small's), two instructions
// fewer. The sm_90 wgrad takes that: faster, for errors that stay below
// cuDNN's.
// Non-finite x: clamping to the largest finite TF32 first makes big that
// and small x itself (Inf) or NaN, so Inf*b stays Inf even where b's small
// part is zero (Inf as big would give Inf*0 = NaN there), and NaN stays
// NaN. Rounding a clamped value cannot carry past the largest TF32.
template <bool kRoundBig = false, bool kRoundSmall = true>
__device__ __forceinline__ void tf32_split(float x, uint32_t& big, uint32_t& small) {
  constexpr float kMax = 0x1.ff8p127f;  // (2 - 2^-10) * 2^127, the largest TF32
  const uint32_t clamped = __float_as_uint(fminf(fmaxf(x, -kMax), kMax));
  big = (kRoundBig ? clamped + 0x1000u : clamped) & 0xffffe000u;
  const float rest = x - __uint_as_float(big);
  small = kRoundSmall ? tf32_operand(rest) : __float_as_uint(rest);
}

// tf32_split with small rounded by tf32_operand_fma: the same operands for
// every x whose small part is normal or zero.
template <bool kRoundBig>
__device__ __forceinline__ void tf32_split_fma(float x, uint32_t& big, uint32_t& small) {
  tf32_split<kRoundBig, false>(x, big, small);
  small = tf32_operand_fma(__uint_as_float(small));
}

// tf32_split of a 16-byte piece of a staged tile.
template <bool kRoundBig, bool kRoundSmall>
__device__ __forceinline__ void tf32_split4(float4 v, uint32_t (&big)[4], uint32_t (&small)[4]) {
  tf32_split<kRoundBig, kRoundSmall>(v.x, big[0], small[0]);
  tf32_split<kRoundBig, kRoundSmall>(v.y, big[1], small[1]);
  tf32_split<kRoundBig, kRoundSmall>(v.z, big[2], small[2]);
  tf32_split<kRoundBig, kRoundSmall>(v.w, big[3], small[3]);
}

// D += A * B for one m16n8k8 TF32 tile (A row-major 16x8, B column-major
// 8x8, FP32 accumulators), fragments as the PTX ISA lays them out. Not
// volatile: a function of its registers, which the compiler may schedule
// among the loads (volatile kept every fragment load after the previous
// tile's products, and the few-channel wgrad waited on each).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();  // the plan never picks tensor-core kernels below sm_80
#endif
}

// D = A * B for one m16n8k8 TF32 tile: a zero accumulator (RZ), for the
// first product of a temporary without clearing it first.
__device__ __forceinline__ void mma_tf32_to(float (&d)[4], const uint32_t (&a)[4],
                                            const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.f));
#else
  __trap();  // the plan never picks tensor-core kernels below sm_80
#endif
}

// One 3xTF32 k8 step over MT x NT tiles (NT of d's first NTMAX): small
// products first, each pass over every tile before the next, since a
// tile's three products depend on each other; the big one last, so that
// the tensor cores' truncation at the big products' size happens once.
// kFresh: the first product starts each tile from zero.
template <bool kFresh, int NT, int MT, int NTMAX>
__device__ __forceinline__ void mma_3xtf32(float (&d)[MT][NTMAX][4], const uint32_t (&a_big)[MT][4],
                                           const uint32_t (&a_small)[MT][4],
                                           const uint32_t (&b_big)[NT][2],
                                           const uint32_t (&b_small)[NT][2]) {
  static_assert(NT <= NTMAX, "tiles past the accumulators");
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if constexpr (kFresh) {
        mma_tf32_to(d[i][j], a_small[i], b_big[j]);
      } else {
        mma_tf32(d[i][j], a_small[i], b_big[j]);
      }
    }
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) mma_tf32(d[i][j], a_big[i], b_small[j]);
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) mma_tf32(d[i][j], a_big[i], b_big[j]);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 matrices of 16-bit elements from shared memory, one per
// register; lanes 8i to 8i + 7 give the 16-byte rows of matrix i. For TF32
// a row is 4 floats and lane (gq, tq) gets float tq of row gq: matrices of
// rows 0-7 and 8-15 at k 0-3, then both at k 4-7, are an m16k8 A fragment.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_byte_addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_byte_addr));
#else
  __trap();  // the plan never picks tensor-core kernels below sm_80
#endif
}

// The same four matrices transposed: lane (g, t) gets elements (2t, g) and
// (2t + 1, g) of each, so rows stored k-major ([k][m], 8 rows of k at
// one m offset) give the m16n8k16 fragments of A (row-major) and B
// (column-major) without a transposing copy.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_byte_addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_byte_addr));
#else
  __trap();  // the plan never picks tensor-core kernels below sm_80
#endif
}

// D += A * B for one m16n8k16 tile of 16-bit operands (kBf16: bfloat16,
// else float16; A row-major 16x16, B column-major 16x8, float32
// accumulators): register i of A holds rows g / g + 8 (i odd) at k pairs
// 2t / 2t + 8 (i >= 2), B's registers k pairs 2t and 2t + 8 of column g.
template <bool kBf16>
__device__ __forceinline__ void mma_16bit(float (&d)[4], const uint32_t (&a)[4],
                                          const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kBf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  __trap();  // the plan never picks tensor-core kernels below sm_80
#endif
}

// A float at a 32-bit shared address.
__device__ __forceinline__ float lds_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr));
  return v;
}

// Two 32-bit words at an 8-byte aligned shared address.
__device__ __forceinline__ void lds_u32x2(uint32_t addr, uint32_t& a, uint32_t& b) {
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(a), "=r"(b) : "r"(addr));
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

__device__ __forceinline__ void sts_f32x2(uint32_t addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b) : "memory");
}

// One 16-byte shared store of four operands. nvcc splits some uint4
// stores through a float pointer into four 4-byte ones.
__device__ __forceinline__ void st_shared_16(void* smem, uint32_t a, uint32_t b, uint32_t c,
                                             uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(smem)), "r"(a),
               "r"(b), "r"(c), "r"(d));
}

// 16-byte async copy that writes zeros instead when !valid (src is not
// read, but must still be a valid address to form).
__device__ __forceinline__ void cp_async_16_or_zero(void* smem, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
               "l"(src), "r"(valid ? 16 : 0));
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

// ---- Hopper (sm_90a) warpgroup MMA -------------------------------------
// Compiled only where the architecture-specific features exist; the plan
// picks the wgmma kernels only on sm_90 in a build that has sm_90a code.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CONV2D_EXT_WGMMA 1
#endif

// Shared-memory matrix descriptor of a K-major TF32 operand without
// swizzle, stored as 8-row x 16-byte core matrices: (n-block, k-block) at
// (2 * n-block + k-block) * 128 bytes, so the two k-halves of a k8 step are
// 128 bytes apart (leading offset) and n-blocks 256 bytes (stride offset).
// General form: `leading` bytes between the two k-halves (4 channels each)
// of a k8 step, `stride` bytes between groups of 8 rows of M or N.
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t smem_byte_addr, uint32_t leading,
                                               uint32_t stride) {
  return uint64_t((smem_byte_addr >> 4) & 0x3fff) |
         (uint64_t((leading >> 4) & 0x3fff) << 16) |
         (uint64_t((stride >> 4) & 0x3fff) << 32);
}

// Descriptor of a K-major TF32 operand in the 128-byte swizzle (as a TMA
// box of 32-float rows with CU_TENSOR_MAP_SWIZZLE_128B writes it): rows of
// 128 bytes, 8-row atoms 1024 bytes apart and 1024-byte aligned, 16-byte
// chunk c of row r stored at chunk c ^ (r % 8). A k8 step k of the atom
// starts 32 * k bytes in; the leading offset is unused (1 by convention).
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t smem_byte_addr) {
  return wgmma_desc(smem_byte_addr, 16, 1024) | (uint64_t(1) << 62);
}

__device__ __forceinline__ uint64_t wgmma_desc_k8(uint32_t smem_byte_addr) {
  return wgmma_desc(smem_byte_addr, 128, 256);
}

__device__ __forceinline__ void wgmma_fence() {
#ifdef CONV2D_EXT_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#ifdef CONV2D_EXT_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#ifdef CONV2D_EXT_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Makes shared memory written through the generic proxy (cp.async, st)
// visible to wgmma's operand reads.
__device__ __forceinline__ void fence_proxy_async_smem() {
#ifdef CONV2D_EXT_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// ---- Hopper (sm_90) bulk copies completing on an mbarrier ---------------
// One thread starts a copy and announces its byte count on the barrier;
// the barrier's phase completes when every byte has landed, and threads
// that wait on it then see the data (no further fence for ordinary loads).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define CONV2D_EXT_BULK_COPY 1
#endif

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
#ifdef CONV2D_EXT_BULK_COPY
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
#endif
}

// Makes initialised barriers visible to the copy engine (a barrier follows).
__device__ __forceinline__ void fence_mbarrier_init() {
#ifdef CONV2D_EXT_BULK_COPY
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#ifdef CONV2D_EXT_BULK_COPY
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   smem_addr(bar)),
               "r"(bytes)
               : "memory");
#endif
}

// Waits until the barrier's phase with this parity (0 for its 1st, 3rd, ...
// completion) has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
#ifdef CONV2D_EXT_BULK_COPY
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
#endif
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to
// shared memory, completing on `bar`.
__device__ __forceinline__ void bulk_copy_to_smem(void* dst, const void* src, uint32_t bytes,
                                                  uint64_t* bar) {
#ifdef CONV2D_EXT_BULK_COPY
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
      "[%3];\n" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
#endif
}

// Programmatic dependent launch (sm_90): a kernel launched with
// programmatic stream serialisation may start while the kernel before it
// runs, once that one's blocks have all called launch_dependents (or
// exited); it must call grid_dependency_wait before reading what the
// earlier kernel writes. Without that launch attribute the wait returns at
// once.
__device__ __forceinline__ void launch_dependents() {
#ifdef CONV2D_EXT_BULK_COPY
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dependency_wait() {
#ifdef CONV2D_EXT_BULK_COPY
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// The box of a 4-D tensor map at coordinates (c0 innermost .. c3) into
// shared memory, completing on `bar`; elements outside the tensor read as
// zeros. `tensor_map` is the address of a __grid_constant__ parameter.
__device__ __forceinline__ void tma_load_4d(void* dst, const void* tensor_map, int c0, int c1,
                                            int c2, int c3, uint64_t* bar) {
#ifdef CONV2D_EXT_BULK_COPY
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(smem_addr(bar))
      : "memory");
#endif
}

// The box at `src` (shared memory, laid out as the map's box) to the 4-D
// tensor map's coordinates (c0 innermost), in this thread's bulk group;
// elements outside the tensor are not written.
__device__ __forceinline__ void tma_store_4d(const void* tensor_map, const void* src, int c0,
                                             int c1, int c2, int c3) {
#ifdef CONV2D_EXT_BULK_COPY
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::
          "l"(reinterpret_cast<uint64_t>(tensor_map)),
      "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
#endif
}

__device__ __forceinline__ void bulk_commit() {
#ifdef CONV2D_EXT_BULK_COPY
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most kPending of this thread's bulk groups are still
// reading their shared memory (kRead) or still writing at all.
template <int kPending, bool kRead>
__device__ __forceinline__ void bulk_wait() {
#ifdef CONV2D_EXT_BULK_COPY
  if constexpr (kRead) {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
  } else {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
  }
#endif
}

// Zeroes a register array of MMA accumulator fragments, [tiles][frags][4].
template <int kTiles, int kFrags>
__device__ __forceinline__ void zero_fragments(float (&d)[kTiles][kFrags][4]) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int j = 0; j < kFrags; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) d[t][j][i] = 0.f;
}

// Keeps the compiler from moving accesses of registers an in-flight wgmma
// owns across the wait that ends it.
template <int kFrags>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[kFrags][4]) {
#pragma unroll
  for (int j = 0; j < kFrags; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(d[j][i])::"memory");
}

// 3xTF32: adds a retired wgmma temporary to the accumulators with FADDs
// (rounded to nearest, where the tensor cores truncate).
template <int kFrags>
__device__ __forceinline__ void wgmma_add_temporary(float (&acc)[kFrags][4],
                                                    float (&tmp)[kFrags][4]) {
  wgmma_fence_operands(tmp);
#pragma unroll
  for (int j = 0; j < kFrags; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] += tmp[j][i];
}

// D (64 x 64 per warpgroup; this warp's 16 rows as eight n8 fragments laid
// out like mma.sync's) = A * B (+ D if accumulate). A: this warp's 16 x 8
// TF32 fragment in registers (mma.sync m16n8k8 layout); B: 8 x 64 at desc.
__device__ __forceinline__ void wgmma_m64n64k8_tf32(float (&d)[8][4],
                                                    const uint32_t (&a)[4],
                                                    uint64_t desc, bool accumulate) {
#ifdef CONV2D_EXT_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "{%32,%33,%34,%35}, %36, p, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc),
        "r"(int(accumulate)));
#else
  __trap();  // the plan never picks wgmma kernels without sm_90a code
#endif
}

// 3xTF32 step into temporary d: small * big and big * small first, then
// big * big, so that the tensor cores' truncation falls once per step at
// the big products' size. `accumulate` false starts a fresh temporary.
__device__ __forceinline__ void wgmma_m64n64k8_3xtf32(float (&d)[8][4], const uint32_t (&a_big)[4],
                                                      const uint32_t (&a_small)[4],
                                                      uint64_t big, uint64_t small,
                                                      bool accumulate) {
  wgmma_m64n64k8_tf32(d, a_small, big, accumulate);
  wgmma_m64n64k8_tf32(d, a_big, small, true);
  wgmma_m64n64k8_tf32(d, a_big, big, true);
}

// D (64 x 256 per warpgroup; this warp's 16 rows as 32 n8 fragments laid
// out like mma.sync's) = A * B (+ D if accumulate), both operands from
// shared memory: A (64 x 8) at desc_a, B (8 x 256) at desc_b. With A in
// shared memory a warp issues a stage's wgmmas back to back, without
// waiting for one to finish before it can refill A registers.
__device__ __forceinline__ void wgmma_m64n256k8_tf32_ss(float (&d)[32][4], uint64_t desc_a,
                                                        uint64_t desc_b, bool accumulate) {
#ifdef CONV2D_EXT_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "
      "%128, %129, p, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
        "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]),
        "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]),
        "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),
        "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]),
        "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]),
        "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]),
        "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]),
        "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]),
        "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]),
        "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]),
        "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]),
        "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]),
        "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]),
        "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]),
        "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]),
        "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]),
        "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
#else
  __trap();  // the plan never picks wgmma kernels without sm_90a code
#endif
}

// The same with N = 128 and N = 64 (16 and 8 n8 fragments per warp).
__device__ __forceinline__ void wgmma_m64n128k8_tf32_ss(float (&d)[16][4], uint64_t desc_a,
                                                        uint64_t desc_b, bool accumulate) {
#ifdef CONV2D_EXT_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
      "%64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
        "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
#else
  __trap();  // the plan never picks wgmma kernels without sm_90a code
#endif
}

__device__ __forceinline__ void wgmma_m64n64k8_tf32_ss(float (&d)[8][4], uint64_t desc_a,
                                                        uint64_t desc_b, bool accumulate) {
#ifdef CONV2D_EXT_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "%32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
#else
  __trap();  // the plan never picks wgmma kernels without sm_90a code
#endif
}

// A 64 x (8 * kFrags) wgmma with both operands in shared memory.
template <int kFrags>
__device__ __forceinline__ void wgmma_tf32_ss(float (&d)[kFrags][4], uint64_t desc_a,
                                              uint64_t desc_b, bool accumulate) {
  static_assert(kFrags == 8 || kFrags == 16 || kFrags == 32, "N is 64, 128 or 256");
  if constexpr (kFrags == 8) {
    wgmma_m64n64k8_tf32_ss(d, desc_a, desc_b, accumulate);
  } else if constexpr (kFrags == 16) {
    wgmma_m64n128k8_tf32_ss(d, desc_a, desc_b, accumulate);
  } else {
    wgmma_m64n256k8_tf32_ss(d, desc_a, desc_b, accumulate);
  }
}

// ---- 16-bit wgmma: float16 or bfloat16 operands, float32 accumulators ----
// D (64 x 8 * kFrags per warpgroup, laid out as the TF32 ones) = A (64 x 16)
// * B (16 x 8 * kFrags) (+ D if accumulate), both operands K-major in shared
// memory. A k16 step is 32 bytes of a 128-byte row, as TF32's k8 step, so
// the same swizzled stages and descriptors (wgmma_desc_sw128) serve both.
// The four trailing immediates: operand scales 1, neither operand
// transposed (K-major).
#define CONV2D_EXT_WGMMA_16BIT_SS(N, TYPE, REGS, DESC_A, DESC_B, PRED, ...)                  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                             \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " REGS ", " \
               DESC_A ", " DESC_B ", p, 1, 1, 0, 0;\n}\n"                                   \
               : __VA_ARGS__                                                                 \
               : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)))
// The accumulator operands of 8, 16 or 32 n8 fragments (each list extends
// the one before it), and their register lists.
#define CONV2D_EXT_WGMMA_FRAG(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define CONV2D_EXT_WGMMA_ACC_8 \
  CONV2D_EXT_WGMMA_FRAG(0), CONV2D_EXT_WGMMA_FRAG(1), CONV2D_EXT_WGMMA_FRAG(2), \
  CONV2D_EXT_WGMMA_FRAG(3), CONV2D_EXT_WGMMA_FRAG(4), CONV2D_EXT_WGMMA_FRAG(5), \
  CONV2D_EXT_WGMMA_FRAG(6), CONV2D_EXT_WGMMA_FRAG(7)
#define CONV2D_EXT_WGMMA_ACC_16 \
  CONV2D_EXT_WGMMA_ACC_8, \
  CONV2D_EXT_WGMMA_FRAG(8), CONV2D_EXT_WGMMA_FRAG(9), CONV2D_EXT_WGMMA_FRAG(10), \
  CONV2D_EXT_WGMMA_FRAG(11), CONV2D_EXT_WGMMA_FRAG(12), CONV2D_EXT_WGMMA_FRAG(13), \
  CONV2D_EXT_WGMMA_FRAG(14), CONV2D_EXT_WGMMA_FRAG(15)
#define CONV2D_EXT_WGMMA_ACC_32 \
  CONV2D_EXT_WGMMA_ACC_16, \
  CONV2D_EXT_WGMMA_FRAG(16), CONV2D_EXT_WGMMA_FRAG(17), CONV2D_EXT_WGMMA_FRAG(18), \
  CONV2D_EXT_WGMMA_FRAG(19), CONV2D_EXT_WGMMA_FRAG(20), CONV2D_EXT_WGMMA_FRAG(21), \
  CONV2D_EXT_WGMMA_FRAG(22), CONV2D_EXT_WGMMA_FRAG(23), CONV2D_EXT_WGMMA_FRAG(24), \
  CONV2D_EXT_WGMMA_FRAG(25), CONV2D_EXT_WGMMA_FRAG(26), CONV2D_EXT_WGMMA_FRAG(27), \
  CONV2D_EXT_WGMMA_FRAG(28), CONV2D_EXT_WGMMA_FRAG(29), CONV2D_EXT_WGMMA_FRAG(30), \
  CONV2D_EXT_WGMMA_FRAG(31)
#define CONV2D_EXT_WGMMA_LIST_8 \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15" \
  ",%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define CONV2D_EXT_WGMMA_LIST_16 \
  CONV2D_EXT_WGMMA_LIST_8 \
  ",%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47" \
  ",%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define CONV2D_EXT_WGMMA_LIST_32 \
  CONV2D_EXT_WGMMA_LIST_16 \
  ",%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79" \
  ",%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95" \
  ",%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111" \
  ",%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
#define CONV2D_EXT_WGMMA_REGS_8 "{" CONV2D_EXT_WGMMA_LIST_8 "}"
#define CONV2D_EXT_WGMMA_REGS_16 "{" CONV2D_EXT_WGMMA_LIST_16 "}"
#define CONV2D_EXT_WGMMA_REGS_32 "{" CONV2D_EXT_WGMMA_LIST_32 "}"
// The same wgmma in either 16-bit type, kBf16's.
#define CONV2D_EXT_WGMMA_16BIT_EITHER(N, REGS, DESC_A, DESC_B, PRED, ...)               \
  if constexpr (kBf16) {                                                              \
    CONV2D_EXT_WGMMA_16BIT_SS(N, "bf16", REGS, DESC_A, DESC_B, PRED, __VA_ARGS__);    \
  } else {                                                                            \
    CONV2D_EXT_WGMMA_16BIT_SS(N, "f16", REGS, DESC_A, DESC_B, PRED, __VA_ARGS__);     \
  }

// kBf16: bfloat16 operands, else float16.
template <int kFrags, bool kBf16>
__device__ __forceinline__ void wgmma_16bit_ss(float (&d)[kFrags][4], uint64_t desc_a,
                                               uint64_t desc_b, bool accumulate) {
  static_assert(kFrags == 8 || kFrags == 16 || kFrags == 32, "N is 64, 128 or 256");
#ifdef CONV2D_EXT_WGMMA
  if constexpr (kFrags == 8) {
    CONV2D_EXT_WGMMA_16BIT_EITHER(64, CONV2D_EXT_WGMMA_REGS_8, "%32", "%33", "%34",
                                  CONV2D_EXT_WGMMA_ACC_8)
  } else if constexpr (kFrags == 16) {
    CONV2D_EXT_WGMMA_16BIT_EITHER(128, CONV2D_EXT_WGMMA_REGS_16, "%64", "%65", "%66",
                                  CONV2D_EXT_WGMMA_ACC_16)
  } else {
    CONV2D_EXT_WGMMA_16BIT_EITHER(256, CONV2D_EXT_WGMMA_REGS_32, "%128", "%129", "%130",
                                  CONV2D_EXT_WGMMA_ACC_32)
  }
#else
  __trap();  // the plan never picks wgmma kernels without sm_90a code
#endif
}

}  // namespace cuda
}  // namespace conv2d_ext
