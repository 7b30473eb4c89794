// The tensor operators the kernels' host code needs (common.cuh declares
// them), in the one CUDA file besides the pass files that includes ATen.h:
// the kernels' files see tensors as TensorBase only.
#include <ATen/ATen.h>

#include <cstdint>

#include "common.cuh"

namespace conv2d_ext {
namespace cuda {

at::TensorBase aligned_16(const at::TensorBase& t, at::MemoryFormat format) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 ? t : at::Tensor(t).clone(format);
}

void copy_into(const at::TensorBase& dst, const at::TensorBase& src) {
  at::Tensor(dst).copy_(at::Tensor(src));
}

}  // namespace cuda
}  // namespace conv2d_ext
