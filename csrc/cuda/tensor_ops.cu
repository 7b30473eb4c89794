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

std::vector<DgradPhase> reached_phases(const ConvParams& p, const at::TensorBase& grad_in) {
  std::vector<DgradPhase> reached;
  for (const DgradPhase& ph : dgrad_phases(p)) {
    if (ph.fprop.kernel_h == 0 || ph.fprop.kernel_w == 0) {
      at::Tensor(grad_in).slice(2, ph.row0, p.in_h, p.stride_h)
          .slice(3, ph.col0, p.in_w, p.stride_w)
          .zero_();
    } else {
      reached.push_back(ph);
    }
  }
  return reached;
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
  // fork and one join. The joins are a destructor's, so that they hold
  // when a work item throws too (the tensors freed on the way out may
  // still be in use on a side stream).
  struct Joins {
    const c10::cuda::CUDAStream caller;
    std::vector<c10::cuda::CUDAStream> sides;
    ~Joins() {
      for (const c10::cuda::CUDAStream& side : sides) {
        try {
          at::cuda::CUDAEvent joined;
          joined.record(side);
          joined.block(caller);
        } catch (...) {  // a destructor must not throw; the error surfaces on the next check
        }
      }
    }
  } joins{c10::cuda::getCurrentCUDAStream(), {}};
  at::cuda::CUDAEvent forked;
  forked.record(joins.caller);
  run(0);
  for (int i = 1; i < count; ++i) {
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
    forked.block(side);
    joins.sides.push_back(side);
    c10::cuda::CUDAStreamGuard guard(side);
    run(i);
  }
}

}  // namespace cuda
}  // namespace conv2d_ext
