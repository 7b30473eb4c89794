// The fixed-order reduction behind split-K wgrad: partial sums of `splits`
// slices of the reduction, [splits][numel], summed in slice order. No
// atomics, so a result is bitwise identical from run to run.
#pragma once

#include <algorithm>
#include <type_traits>


#include "common.cuh"

namespace conv2d_ext {
namespace cuda {

// K slices of a split-K launch of `tiles` blocks per slice over `k_tiles`
// K tiles: one wave at `blocks_per_sm`, none empty. The count depends only
// on the shape and the GPU, so results repeat.
struct KSplit {
  int64_t splits, tiles_per_split;
};
inline KSplit one_wave_k_split(int64_t tiles, int64_t k_tiles, int blocks_per_sm) {
  const int64_t slots = int64_t(std::max(blocks_per_sm, 1)) *
                        device_properties()->multiProcessorCount;
  const int64_t splits = std::min({std::max<int64_t>(1, slots / tiles), k_tiles, kMaxGridYZ});
  KSplit k;
  k.tiles_per_split = ceil_div(k_tiles, splits);
  k.splits = ceil_div(k_tiles, k.tiles_per_split);
  return k;
}

// Block-wide sums of each thread's A x B accumulators in a fixed order:
// a butterfly within each warp, then the warps in index order. Leaves
// s_red[warp][a * B + b] for sum_warps(); the caller syncs in between.
template <typename T, int A, int B, int kWarps>
__device__ __forceinline__ void warp_sums(const T (&acc)[A][B], T (&s_red)[kWarps][A * B]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int a = 0; a < A; ++a) {
#pragma unroll
    for (int b = 0; b < B; ++b) {
      T v = acc[a][b];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) s_red[warp][a * B + b] = v;
    }
  }
}

template <typename T, int N, int kWarps>
__device__ __forceinline__ T sum_warps(const T (&s_red)[kWarps][N], int e) {
  T sum = T(0);
#pragma unroll
  for (int w = 0; w < kWarps; ++w) sum += s_red[w][e];
  return sum;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    reduce_splits_kernel(const T* __restrict__ partial, T* __restrict__ out, int64_t numel,
                         int splits) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    using Acc = std::conditional_t<std::is_same_v<T, float>, double, T>;
    Acc sum = Acc(0);
    for (int s = 0; s < splits; ++s) sum += partial[s * numel + i];
    out[i] = static_cast<T>(sum);
  }
}

template <typename T>
void reduce_splits(const at::TensorBase& partial, at::TensorBase& out, int64_t numel, int splits) {
  const int blocks = static_cast<int>(std::min<int64_t>(ceil_div(numel, kThreads), 65535));
  reduce_splits_kernel<T><<<blocks, kThreads, 0, current_stream()>>>(
      partial.data_ptr<T>(), out.data_ptr<T>(), numel, splits);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace conv2d_ext
