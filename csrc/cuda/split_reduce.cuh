// The fixed-order reduction behind split-K wgrad: partial sums of `splits`
// slices of the reduction, [splits][numel], summed in slice order. No
// atomics, so a result is bitwise identical from run to run.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "common.cuh"

namespace conv2d_ext {
namespace cuda {

template <typename T>
__global__ void __launch_bounds__(kThreads)
    reduce_splits_kernel(const T* __restrict__ partial, T* __restrict__ out, int64_t numel,
                         int splits) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    T sum = T(0);
    for (int s = 0; s < splits; ++s) sum += partial[s * numel + i];
    out[i] = sum;
  }
}

template <typename T>
void reduce_splits(const at::Tensor& partial, at::Tensor& out, int64_t numel, int splits) {
  const int blocks = static_cast<int>(std::min<int64_t>(ceil_div(numel, kThreads), 65535));
  reduce_splits_kernel<T><<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      partial.data_ptr<T>(), out.data_ptr<T>(), numel, splits);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace conv2d_ext
