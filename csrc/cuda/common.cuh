// Small device helpers shared by the CUDA passes.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#include <ATen/core/TensorBase.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include "../conv_params.h"

namespace conv2d_ext {
namespace cuda {

constexpr int kThreads = 256;

// Largest grid y/z extent; kernels loop over the rest.
constexpr int64_t kMaxGridYZ = 65535;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Offset of plane (n, c) of an NCHW tensor with `channels` channels: the
// only 64-bit product a kernel needs (tensors may exceed 2^31 elements),
// since one plane, the padded extents and the image and channel counts stay
// below kMaxIndex32 (checked in make_*_params). Offsets within a plane then
// fit in int.
__device__ __forceinline__ int64_t plane_offset(int n, int channels, int c,
                                                int plane_size) {
  return (static_cast<int64_t>(n) * channels + c) * plane_size;
}

// Reads a compile-time tile of N values from 16-byte aligned shared memory
// with 16-byte loads: all threads read the same address, so each load is a
// broadcast.
template <typename T, int N>
__device__ __forceinline__ void load_tile(const T* s, T (&v)[N]) {
  using Vec = typename std::conditional<sizeof(T) == 4, float4, double2>::type;
  constexpr int kPerVec = 16 / sizeof(T);
  static_assert(N % kPerVec == 0, "tile must be whole 16-byte vectors");
#pragma unroll
  for (int i = 0; i < N / kPerVec; ++i) {
    const Vec t = reinterpret_cast<const Vec*>(s)[i];
    memcpy(&v[i * kPerVec], &t, sizeof(Vec));
  }
}

// Compile-time value when the template argument is non-zero, else the
// run-time one: lets one kernel body serve specialised and generic sizes.
template <int kStatic>
__device__ __forceinline__ int static_or(int dynamic_value) {
  return kStatic > 0 ? kStatic : dynamic_value;
}

// Element e of a rearranged weight workspace laid out as [group][co tile]
// [chunk][kh][kw][k step][step_floats]: where it sits. Both tensor-core
// forwards use this order (one k step per chunk in the pixels-as-M kernel)
// and differ only in the order within a step.
struct WeightTileIndex {
  int within, kstep, kw, kh, chunk, co_tile, g;
};

__device__ __forceinline__ WeightTileIndex decode_weight_tile_index(
    int64_t e, int step_floats, int ksteps, int KH, int KW, int chunks, int co_tiles) {
  WeightTileIndex t;
  t.within = static_cast<int>(e % step_floats);
  int64_t q = e / step_floats;
  t.kstep = q % ksteps;
  q /= ksteps;
  t.kw = q % KW;
  q /= KW;
  t.kh = q % KH;
  q /= KH;
  t.chunk = q % chunks;
  q /= chunks;
  t.co_tile = q % co_tiles;
  t.g = static_cast<int>(q / co_tiles);
  return t;
}

// Index in `w` of the forward problem `p`'s weight at (group, co, ci, kh,
// kw) of a group's channels, or -1 past the group's channels (tiles are
// padded with zeros; weight_or_zero reads it).
// kFprop: `w` is [Cout][Cin/g][KH][KW]. kDgrad: `p` is dgrad_as_fprop() of
// the layer, whose weight `w` is then [Cin][Cout/g][KH][KW] in p's terms,
// read transposed within the group and rotated by 180 degrees.
__device__ __forceinline__ int64_t weight_index(const ConvParams& p, WeightOrder order, int g,
                                                int co, int ci, int kh, int kw) {
  const int cin_g = p.in_channels_per_group(), cout_g = p.out_channels_per_group();
  if (co >= cout_g || ci >= cin_g) return -1;
  const int KH = p.kernel_h, KW = p.kernel_w;
  if (order == WeightOrder::kDgrad) {
    return ((int64_t(g) * cin_g + ci) * cout_g + co) * KH * KW + (KH - 1 - kh) * KW +
           (KW - 1 - kw);
  }
  return ((int64_t(g) * cout_g + co) * cin_g + ci) * KH * KW + kh * KW + kw;
}
__device__ __forceinline__ float weight_or_zero(const ConvParams& p, const float* w,
                                                WeightOrder order, int g, int co, int ci,
                                                int kh, int kw) {
  const int64_t i = weight_index(p, order, g, co, ci, kh, kw);
  return i < 0 ? 0.f : w[i];
}

// The kernels' files reach PyTorch through TensorBase and these few
// calls (launch_cache.cu, tensor_ops.cu) rather than ATen.h and
// CUDAContext.h, whose headers would cost each of them most of its host
// compile time.
//
// The current device's properties (PyTorch's cached copy).
const cudaDeviceProp* device_properties();
// Scratch memory on the current device from PyTorch's caching allocator,
// freed memory reused in stream order as at::empty's; never filled (not
// even under deterministic mode's fill of uninitialized memory), so the
// kernels must write all of it before they read it.
at::TensorBase scratch(c10::IntArrayRef sizes, at::ScalarType dtype);
// The stream PyTorch's current operation runs on.
inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream(); }
// `t` itself where its data starts 16-byte aligned (TMA and 16-byte copies
// need it), else a copy in `format` (tensor_ops.cu).
at::TensorBase aligned_16(const at::TensorBase& t, at::MemoryFormat format);
// dst.copy_(src) (tensor_ops.cu).
void copy_into(const at::TensorBase& dst, const at::TensorBase& src);
// A strided dgrad's phases that some tap reaches; the pixels of the others
// (no tap, so zeros) zeroed in grad_in here (tensor_ops.cu).
std::vector<DgradPhase> reached_phases(const ConvParams& p, const at::TensorBase& grad_in);
// run(0), ..., run(count - 1): with `side_by_side`, run(i > 0) on a stream
// of PyTorch's pool (the current stream while it runs, so its scratch is
// that stream's), forked from the caller's stream and joined back before
// this returns; otherwise all on the caller's stream. For work items that
// write disjoint memory and each leave SMs idle (tensor_ops.cu).
void for_each_work(int count, bool side_by_side, const std::function<void(int)>& run);

// Compute capability of the current device as 10*major + minor.
inline int current_sm() {
  const cudaDeviceProp* prop = device_properties();
  return prop->major * 10 + prop->minor;
}

// Width of a block's 2-D pixel tile (kThreads pixels, one per thread).
// Narrow rows would waste most of a 32-wide tile, so trade width for height.
inline int pick_pixel_tile_w(int64_t row_width) {
  if (row_width >= 24) return 32;
  if (row_width >= 12) return 16;
  return 8;
}

// Launch facts of a kernel on the current device, asked of the runtime once
// per (kernel, device) and remembered (launch_cache.cu): the attribute and
// occupancy queries cost as much host time per call as the rest of a small
// layer's dispatch.
//
// Raises the kernel's dynamic shared-memory limit to `bytes` when the
// launch needs more than the default 48 KiB with its static shared memory.
void ensure_dynamic_smem(const void* kernel, size_t bytes);
// cudaOccupancyMaxActiveBlocksPerMultiprocessor for this launch shape.
int max_blocks_per_sm(const void* kernel, int threads, size_t dynamic_smem);

template <typename Kernel>
void ensure_dynamic_smem(Kernel* kernel, size_t bytes) {
  ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}
template <typename Kernel>
int max_blocks_per_sm(Kernel* kernel, int threads, size_t dynamic_smem) {
  return max_blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, dynamic_smem);
}

}  // namespace cuda
}  // namespace conv2d_ext
