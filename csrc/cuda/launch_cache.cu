// The launch facts of common.cuh, remembered per (kernel, device), and
// the PyTorch calls the kernels' files make (device properties, scratch).
#include <ATen/cuda/CUDAContextLight.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/cuda/CUDAFunctions.h>

#include <map>
#include <mutex>
#include <tuple>

#include "common.cuh"

namespace conv2d_ext {
namespace cuda {
namespace {

struct SmemLimit {
  size_t static_bytes = 0;
  size_t dynamic_allowed = 0;  // the largest dynamic size opted into so far
};

std::mutex g_mutex;
std::map<std::pair<const void*, int>, SmemLimit> g_smem;
std::map<std::tuple<const void*, int, int, size_t>, int> g_occupancy;

}  // namespace

const cudaDeviceProp* device_properties() { return at::cuda::getCurrentDeviceProperties(); }

at::TensorBase scratch(c10::IntArrayRef sizes, at::ScalarType dtype) {
  return at::detail::empty_cuda(sizes, dtype, at::Device(at::kCUDA, c10::cuda::current_device()),
                                c10::nullopt);
}

void ensure_dynamic_smem(const void* kernel, size_t bytes) {
  // Without the opt-in, static and dynamic shared memory together may not
  // pass 48 KB: a ring of exactly 48 KB next to a few static barriers
  // failed to launch ("invalid argument").
  constexpr size_t kDefaultLimit = 48 * 1024;
  const int device = c10::cuda::current_device();
  const std::lock_guard<std::mutex> lock(g_mutex);
  auto found = g_smem.find({kernel, device});
  if (found == g_smem.end()) {
    cudaFuncAttributes attr{};
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    SmemLimit limit;
    limit.static_bytes = attr.sharedSizeBytes;
    found = g_smem.emplace(std::make_pair(kernel, device), limit).first;
  }
  SmemLimit& limit = found->second;
  if (bytes + limit.static_bytes <= kDefaultLimit || bytes <= limit.dynamic_allowed) return;
  const cudaDeviceProp* prop = device_properties();
  TORCH_CHECK(bytes + limit.static_bytes <= prop->sharedMemPerBlockOptin,
              "conv2d_ext: this kernel size needs ", bytes + limit.static_bytes,
              " bytes of shared memory per block, more than the ",
              prop->sharedMemPerBlockOptin, " this GPU allows");
  // Only ever raised: a smaller launch on another thread stays valid.
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(bytes)));
  limit.dynamic_allowed = bytes;
}

int max_blocks_per_sm(const void* kernel, int threads, size_t dynamic_smem) {
  const int device = c10::cuda::current_device();
  const std::lock_guard<std::mutex> lock(g_mutex);
  const auto key = std::make_tuple(kernel, device, threads, dynamic_smem);
  const auto found = g_occupancy.find(key);
  if (found != g_occupancy.end()) return found->second;
  int blocks = 0;
  C10_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, dynamic_smem));
  g_occupancy.emplace(key, blocks);
  return blocks;
}

}  // namespace cuda
}  // namespace conv2d_ext
