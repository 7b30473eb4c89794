#include "tensor_map.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAMiscFunctions.h>
#include <cuda_runtime.h>

#include <mutex>

namespace conv2d_ext {
namespace cuda {
namespace {

// The driver's tensor-map encoder, looked up through the runtime so that the
// extension needs no link to the driver library.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion,
                                   CUtensorMapFloatOOBfill);

void* driver_entry(const char* name) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
  C10_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &ptr, 12000, cudaEnableDefault, &found));
#else
  C10_CUDA_CHECK(cudaGetDriverEntryPoint(name, &ptr, cudaEnableDefault, &found));
#endif
  TORCH_CHECK(found == cudaDriverEntryPointSuccess && ptr != nullptr,
              "conv2d_ext: the CUDA driver has no ", name);
  return ptr;
}

EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn =
      reinterpret_cast<EncodeTiledFn>(driver_entry("cuTensorMapEncodeTiled"));
  return fn;
}

// The encoder is a driver call and needs a current context. A thread that
// has made no runtime call that needs one has none: autograd's worker
// thread, say, when the caching allocator serves every allocation of the
// backward pass (the encoder then fails with CUDA_ERROR_INVALID_CONTEXT).
// cudaFree(nullptr) binds the current device's primary context, as PyTorch
// does before its own driver calls (under the allocator's free mutex).
void ensure_current_context() {
  using GetCurrentFn = CUresult (*)(CUcontext*);
  static const GetCurrentFn get_current =
      reinterpret_cast<GetCurrentFn>(driver_entry("cuCtxGetCurrent"));
  CUcontext context = nullptr;
  if (get_current(&context) == CUDA_SUCCESS && context != nullptr) return;
  const std::lock_guard<std::mutex> lock(*c10::cuda::getFreeMutex());
  C10_CUDA_CHECK(cudaFree(nullptr));
}

// The 4-D map of contiguous NCHW `t` with its dimensions in `order`
// (indices of NCHW dimensions, innermost first; W first).
CUtensorMap encode(const at::TensorBase& t, const int (&order)[4], const uint32_t (&box)[4],
                   uint32_t row_step, bool swizzle_128b) {
  const cuuint64_t bytes[4] = {cuuint64_t(t.size(1)) * t.size(2) * t.size(3) * 4,
                               cuuint64_t(t.size(2)) * t.size(3) * 4,
                               cuuint64_t(t.size(3)) * 4, 4};  // per step of each dimension
  cuuint64_t dims[4], strides[3];
  for (int i = 0; i < 4; ++i) {
    dims[i] = cuuint64_t(t.size(order[i]));
    if (i > 0) strides[i - 1] = bytes[order[i]];
  }
  const cuuint32_t element_strides[4] = {1, order[1] == 2 ? row_step : 1, 1, 1};
  CUtensorMap map;
  ensure_current_context();
  const CUresult r = encode_tiled()(
      &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, t.data_ptr(), dims, strides, box,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      swizzle_128b ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TORCH_CHECK(r == CUDA_SUCCESS, "conv2d_ext: internal error: cuTensorMapEncodeTiled failed (",
              int(r), ") for a tensor of shape ", t.sizes(), " and box ", box[0], "x", box[1],
              "x", box[2]);
  return map;
}

}  // namespace

CUtensorMap nchw_tensor_map(const at::TensorBase& t, uint32_t box_w, uint32_t box_h, uint32_t box_c,
                            uint32_t row_step, bool swizzle_128b) {
  return encode(t, {3, 2, 1, 0}, {box_w, box_h, box_c, 1}, row_step, swizzle_128b);
}

CUtensorMap nwch_box_tensor_map(const at::TensorBase& t, uint32_t box_w, uint32_t box_c,
                                uint32_t box_h, bool swizzle_128b) {
  return encode(t, {3, 1, 2, 0}, {box_w, box_c, box_h, 1}, 1, swizzle_128b);
}

}  // namespace cuda
}  // namespace conv2d_ext
