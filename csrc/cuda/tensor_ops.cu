// The tensor operators the kernels' host code needs (common.cuh declares
// them), in the one CUDA file besides the pass files that includes ATen.h:
// the kernels' files see tensors as TensorBase only.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <vector>

#include "common.cuh"

namespace conv2d_ext {
namespace cuda {

at::TensorBase aligned_16(const at::TensorBase& t, at::MemoryFormat format) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 ? t : at::Tensor(t).clone(format);
}

void copy_into(const at::TensorBase& dst, const at::TensorBase& src) {
  at::Tensor(dst).copy_(at::Tensor(src));
}

void for_each_work(int count, bool side_by_side, const std::function<void(int)>& run) {
  if (!side_by_side || count <= 1) {
    for (int i = 0; i < count; ++i) run(i);
    return;
  }
  // Side streams start after everything the caller's stream has queued
  // (the operands, and tensors made before this call), and the caller's
  // stream waits for them before anything queued after: frees of such
  // tensors stay ordered after their last use, and graph capture sees one
  // fork and one join.
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream();
  at::cuda::CUDAEvent forked;
  forked.record(caller);
  std::vector<at::cuda::CUDAEvent> joined(count - 1);
  run(0);
  for (int i = 1; i < count; ++i) {
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
    forked.block(side);
    {
      c10::cuda::CUDAStreamGuard guard(side);
      run(i);
    }
    joined[i - 1].record(side);
  }
  for (at::cuda::CUDAEvent& e : joined) e.block(caller);
}

}  // namespace cuda
}  // namespace conv2d_ext
