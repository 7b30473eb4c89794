// Device pieces shared by the direct kernels for few input channels per
// group (fprop/dgrad/few_channels/wgrad.cu): staging an input tile with
// its halo in shared memory.
#pragma once


#include <algorithm>

#include "../../plan.h"
#include "../common.cuh"
#include "../kernel_sizes.cuh"
#include "../mma.cuh"
#include "config.h"

namespace conv2d_ext {
namespace cuda {
namespace few_channels {

using conv2d_ext::few_channels::kThreads;

// Where a staged tile's columns sit: image column c is at shared column
// c - first + lead. With 16-byte copies the staged columns start at the
// 4-aligned column at or before `first`, so lead = first mod 4; otherwise
// lead = 0.
struct HaloCols {
  int first, lead;
};

__device__ __forceinline__ HaloCols halo_cols(int first, bool vec) {
  // & ~3 rounds down for negative columns too (two's complement).
  return {first, vec ? first - (first & ~3) : 0};
}

// Starts async copies of `planes` planes (consecutive in the image, `H` x `W`
// each, from `src`) into shared `dst` ([plane][plane_stride floats], each
// [rows][pitch]): image rows
// [row0, row0 + rows) and columns [first, first + cols) of each, zeros
// outside the image. 16-byte copies when `vec` (W % 4 == 0 and a 16-byte
// aligned base, so a 4-aligned group of columns lies wholly inside or
// outside a row); the block's `threads` threads share the copies; the
// caller commits and waits.
template <int kWidth>  // floats per copy: 4 or 1
__device__ __forceinline__ void stage_halo_by(float* dst, const float* src, int planes, int H,
                                              int W, int row0, int rows, HaloCols hc, int cols,
                                              int pitch, int plane_stride, int threads) {
  const int64_t plane = int64_t(H) * W;
  const int c0 = hc.first - hc.lead;  // 4-aligned for 16-byte copies
  const int copies = (hc.lead + cols + kWidth - 1) / kWidth;
  const int per_plane = rows * copies;
  for (int i = threadIdx.x; i < planes * per_plane; i += threads) {
    const int pl = i / per_plane;
    const int rem = i - pl * per_plane;
    const int r = rem / copies;
    const int k = rem - r * copies;
    const int ih = row0 + r, iw = c0 + kWidth * k;
    const bool inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
    const float* g = inside ? src + pl * plane + int64_t(ih) * W + iw : src;
    float* d = dst + pl * plane_stride + r * pitch + kWidth * k;
    if constexpr (kWidth == 4) {
      cp_async_16_or_zero(d, g, inside);
    } else {
      cp_async_4(d, g, inside);
    }
  }
}

__device__ __forceinline__ void stage_halo(float* dst, const float* src, int planes, int H,
                                           int W, int row0, int rows, HaloCols hc, int cols,
                                           int pitch, int plane_stride, bool vec,
                                           int threads = kThreads) {
  if (vec) {
    stage_halo_by<4>(dst, src, planes, H, W, row0, rows, hc, cols, pitch, plane_stride, threads);
  } else {
    stage_halo_by<1>(dst, src, planes, H, W, row0, rows, hc, cols, pitch, plane_stride, threads);
  }
}

// A ring of kStages shared buffers that the tensor-copy engine fills: each
// buffer completes on its own mbarrier (one arrival, by the thread that
// starts its copies, plus the bytes), and a bit per buffer tracks the phase
// to wait for next. Built by every thread of the block (it synchronises).
template <int kStages>
struct CopyRing {
  static_assert(kStages <= 32, "one phase bit per buffer");
  uint64_t* barrier;  // [kStages], in shared memory
  uint32_t phases = 0;

  __device__ __forceinline__ CopyRing(uint64_t* barriers, bool tma) : barrier(barriers) {
    if (tma && threadIdx.x == 0) {
#pragma unroll
      for (int k = 0; k < kStages; ++k) mbarrier_init(&barrier[k], 1);
      fence_mbarrier_init();
    }
    __syncthreads();
  }
  __device__ __forceinline__ void wait(int b) {
    mbarrier_wait(&barrier[b], (phases >> b) & 1);
    phases ^= 1u << b;
  }
};

// The tensor-core kernels' operands from a staged buffer, once per block
// instead of once per warp that reads them: `pieces` 16-byte pieces of
// `raw`, rounded to TF32 in place, or (kTf32x3, 3xTF32) split into a big
// part rounded to nearest and a small part, laid out as kLayout says.
// Then a barrier; where the tensor-copy engine refills `raw` later (tma),
// a proxy fence first orders these generic-proxy writes before its
// async-proxy ones.
enum class OperandLayout {
  kApart,  // big in place, small at the same piece of `out` (read apart)
  kPairs,  // [big, small] pairs in `out`, twice the floats (one 8-byte load)
};
template <bool kTf32x3, OperandLayout kLayout, bool kRoundSmall, int kBatch>
__device__ __forceinline__ void tensor_core_operands(float4* raw, float4* out, int pieces,
                                                     bool tma) {
  auto convert = [&](int e, float4 v) {
    if constexpr (kTf32x3) {
      uint32_t big[4], small[4];
      tf32_split4</*kRoundBig=*/true, kRoundSmall>(v, big, small);
      if constexpr (kLayout == OperandLayout::kPairs) {
        st_shared_16(out + 2 * e, big[0], small[0], big[1], small[1]);
        st_shared_16(out + 2 * e + 1, big[2], small[2], big[3], small[3]);
      } else {
        st_shared_16(raw + e, big[0], big[1], big[2], big[3]);
        st_shared_16(out + e, small[0], small[1], small[2], small[3]);
      }
    } else {
      st_shared_16(raw + e, tf32_operand(v.x), tf32_operand(v.y), tf32_operand(v.z),
                   tf32_operand(v.w));
    }
  };
  // kBatch pieces' loads at a time: one at a time, each load-convert-store
  // chain ran back to back, and the pass dominated the RGB wgrad's stalls
  // at one block an SM. Kernels of two blocks an SM take 1 (no registers
  // to spare).
  for (int e0 = threadIdx.x; e0 < pieces; e0 += kBatch * kThreads) {
    float4 v[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (e0 + i * kThreads < pieces) v[i] = raw[e0 + i * kThreads];
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (e0 + i * kThreads < pieces) convert(e0 + i * kThreads, v[i]);
    }
  }
  if (tma) fence_proxy_async_smem();
  __syncthreads();
}

// The tensor-core kernels' tables of k offsets (k8 steps of a gathered
// operand): k's slot, so that lane tq of a step t reads the offsets of k =
// 8t + tq and 8t + tq + 4 as one 8-byte word, at k8_offsets(table, t, tq).
__device__ __forceinline__ int k_offset_slot(int k) {
  return (k >> 3) * 8 + (k & 3) * 2 + ((k >> 2) & 1);
}
__device__ __forceinline__ int2 k8_offsets(const int* table, int t, int tq) {
  return reinterpret_cast<const int2*>(table)[t * 4 + tq];
}

// Calls fn(Int<kCo>{}) for a narrow tile's output channels per group (1 to
// kNarrowMaxCo): the tiles hold exactly the group's channels.
template <typename Fn>
void dispatch_narrow_channels(int64_t cout_g, Fn&& fn) {
  static_assert(conv2d_ext::few_channels::kNarrowMaxCo == 4, "one case per channel count");
  switch (cout_g) {
    case 1: return fn(Int<1>{});
    case 2: return fn(Int<2>{});
    case 3: return fn(Int<3>{});
    default: return fn(Int<4>{});
  }
}

// wgrad: `stages` steps of each of `tiles` blocks' weight-gradient tiles,
// split into slices so that tiles * slices blocks fill the GPU `waves`
// times; each slice sums into its own row of `partial` (grad_w itself when
// there is one slice). Depends only on the shape and the GPU: results are
// reproducible.
struct Split {
  int per_slice, slices;
  at::TensorBase partial;
};

inline Split split_stages(int64_t tiles, int64_t stages, int waves, const at::TensorBase& grad_w,
                          int64_t numel) {
  const int sms = device_properties()->multiProcessorCount;
  const int64_t want = ceil_div(int64_t(waves) * sms, tiles);
  const int64_t slices = std::max<int64_t>(1, std::min<int64_t>({want, stages, kMaxGridYZ}));
  Split sp;
  sp.per_slice = static_cast<int>(ceil_div(stages, slices));
  sp.slices = static_cast<int>(ceil_div(stages, sp.per_slice));
  sp.partial = sp.slices == 1 ? grad_w : scratch({sp.slices, numel}, grad_w.scalar_type());
  return sp;
}

// Whether the tensor-copy engine stages halos of `h` on this GPU: it reads
// the rows 16-byte copies would (vec), in boxes of at most kMaxTmaBox.
inline bool tma_stages(bool vec, const conv2d_ext::few_channels::Halo& h) {
  return vec && hopper_kernels(current_sm()) && h.pitch <= kMaxTmaBox && h.rows <= kMaxTmaBox;
}

// Whether 16-byte copies may stage rows of width W from `base`.
inline bool can_vectorise(const void* base, int64_t W) {
  return W % 4 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0;
}

}  // namespace few_channels
}  // namespace cuda
}  // namespace conv2d_ext
