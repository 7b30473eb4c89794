// Backward-data pass (dgrad) on FFMA: the direct gather every dtype, shape
// and GPU can run.
//
// GEMM view per group: M = N*H*W input pixels, N = Cin/groups input
// channels, K = Cout/groups*KH*KW. Each thread owns one input pixel and 16
// input channels and gathers the grad_output taps that reach it: tap
// (kh, kw) reaches input row ih from output row (ih + pad - kh*dil) / stride
// when that division is exact. The weight slab is staged in shared memory
// as [co, kh][kw][ci], the transpose the gather needs.
#include <ATen/Dispatch.h>

#include "../common.cuh"
#include "../kernel_sizes.cuh"
#include "direct.h"

namespace conv2d_ext {
namespace cuda {
namespace {

constexpr int kCiTile = 16;
constexpr int kStageBytes = 16 * 1024;

// Output coordinate that tap offset `k_off` (= kernel index * dilation)
// maps input coordinate `i` to, or -1 if none (not on the stride grid or
// out of range).
__device__ __forceinline__ int source_index(int i, int pad, int k_off,
                                            int stride, int out_extent) {
  const int num = i + pad - k_off;
  if (num < 0) return -1;
  const int o = stride == 1 ? num : num / stride;
  if (o * stride != num || o >= out_extent) return -1;
  return o;
}

template <typename T, int KH_T, int KW_T>
__global__ void __launch_bounds__(kThreads)
    dgrad_direct_kernel(const ConvParams p, const T* __restrict__ grad_out,
                        const T* __restrict__ w, T* __restrict__ grad_in,
                        int tile_w, int rows_per_stage) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* s_w = reinterpret_cast<T*>(smem_raw);  // [row][kw][ci]

  const int KH = static_or<KH_T>(p.kernel_h);
  const int KW = static_or<KW_T>(p.kernel_w);
  const int H = p.in_h, W = p.in_w, Ho = p.out_h, Wo = p.out_w;
  const int cin_g = p.in_channels_per_group();
  const int cout_g = p.out_channels_per_group();
  const int taps = KH * KW;

  const int tiles_w = (W + tile_w - 1) / tile_w;
  const int tile_h = kThreads / tile_w;
  const int ih = (blockIdx.x / tiles_w) * tile_h + threadIdx.x / tile_w;
  const int iw = (blockIdx.x % tiles_w) * tile_w + threadIdx.x % tile_w;
  const bool active = ih < H && iw < W;

  // One row per (output channel, kernel row) pair of the group.
  const int rows = cout_g * KH;
  const int ci_tiles = (cin_g + kCiTile - 1) / kCiTile;

  for (int gy = blockIdx.y; gy < p.groups * ci_tiles; gy += gridDim.y) {
    const int g = gy / ci_tiles;
    const int ci0 = (gy % ci_tiles) * kCiTile;
    const int ci_count = min(kCiTile, cin_g - ci0);

    for (int n = blockIdx.z; n < p.batch; n += gridDim.z) {
      T acc[kCiTile];
#pragma unroll
      for (int c = 0; c < kCiTile; ++c) acc[c] = T(0);

      for (int r0 = 0; r0 < rows; r0 += rows_per_stage) {
        const int nrows = min(rows_per_stage, rows - r0);
        const int per_ci = nrows * KW;
        __syncthreads();  // previous slab fully consumed
        for (int i = threadIdx.x; i < kCiTile * per_ci; i += kThreads) {
          const int c = i / per_ci;
          const int j = i - c * per_ci;
          const int r = r0 + j / KW;
          const int kw = j % KW;
          const int co = r / KH;
          const int kh = r - co * KH;
          T v = T(0);
          if (c < ci_count) {
            v = w[(static_cast<int64_t>(g * cout_g + co) * cin_g + ci0 + c) *
                      taps +
                  kh * KW + kw];
          }
          s_w[j * kCiTile + c] = v;
        }
        __syncthreads();
        if (!active) continue;
        for (int r = 0; r < nrows; ++r) {
          const int co = (r0 + r) / KH;
          const int kh = (r0 + r) - co * KH;
          const int oh =
              source_index(ih, p.pad_h, kh * p.dilation_h, p.stride_h, Ho);
          if (oh < 0) continue;
          const T* g_row = grad_out +
                           plane_offset(n, p.out_channels, g * cout_g + co,
                                        Ho * Wo) +
                           static_cast<int64_t>(oh) * Wo;
          const T* s_row = s_w + r * KW * kCiTile;
#pragma unroll
          for (int kw = 0; kw < KW; ++kw) {
            const int ow =
                source_index(iw, p.pad_w, kw * p.dilation_w, p.stride_w, Wo);
            // A tap that reaches no output is skipped, as the rows are, not
            // multiplied by zero: a NaN or Inf weight must not reach input
            // pixels it has no path to (0 * Inf = NaN).
            if (ow < 0) continue;
            const T v = __ldg(g_row + ow);
            T wv[kCiTile];
            load_tile(s_row + kw * kCiTile, wv);
#pragma unroll
            for (int c = 0; c < kCiTile; ++c) acc[c] = fma(v, wv[c], acc[c]);
          }
        }
      }
      if (active) {
        T* gi_pix = grad_in +
                    plane_offset(n, p.in_channels, g * cin_g + ci0, H * W) +
                    static_cast<int64_t>(ih) * W + iw;
#pragma unroll
        for (int c = 0; c < kCiTile; ++c) {
          if (c < ci_count) gi_pix[static_cast<int64_t>(c) * H * W] = acc[c];
        }
      }
    }
  }
}

template <typename T>
void launch_dgrad_direct(const ConvParams& p, const at::TensorBase& grad_out,
                         const at::TensorBase& w, at::TensorBase& grad_in) {
  const int tile_w = pick_pixel_tile_w(p.in_w);
  const int tile_h = kThreads / tile_w;
  const int64_t rows = p.out_channels_per_group() * p.kernel_h;
  const int64_t row_bytes = p.kernel_w * kCiTile * sizeof(T);
  const int rows_per_stage = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(rows, kStageBytes / row_bytes)));
  const size_t smem = rows_per_stage * row_bytes;

  const dim3 grid(
      ceil_div(p.in_h, tile_h) * ceil_div(p.in_w, tile_w),
      std::min(p.groups * ceil_div(p.in_channels_per_group(), kCiTile),
               kMaxGridYZ),
      std::min(p.batch, kMaxGridYZ));
  const bool specialise = std::is_same<T, float>::value;
  dispatch_kernel_size(p.kernel_h, p.kernel_w, specialise, [&](auto kh,
                                                               auto kw) {
    auto kernel =
        dgrad_direct_kernel<T, decltype(kh)::value, decltype(kw)::value>;
    ensure_dynamic_smem(kernel, smem);
    kernel<<<grid, kThreads, smem, current_stream()>>>(
        p, grad_out.data_ptr<T>(), w.data_ptr<T>(), grad_in.data_ptr<T>(),
        tile_w, rows_per_stage);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

void launch_dgrad_direct(const ConvParams& p, const at::TensorBase& grad_out,
                         const at::TensorBase& w, at::TensorBase& grad_in) {
  AT_DISPATCH_FLOATING_TYPES(grad_out.scalar_type(), "conv2d_ext_dgrad", [&] {
    launch_dgrad_direct<scalar_t>(p, grad_out, w, grad_in);
  });
}

}  // namespace cuda
}  // namespace conv2d_ext
