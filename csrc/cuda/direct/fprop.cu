// Forward pass (fprop) on FFMA: the direct convolution every dtype, shape
// and GPU can run.
//
// GEMM view per group: M = N*Ho*Wo output pixels, N = Cout/groups output
// channels, K = Cin/groups*KH*KW. A block owns 256 output pixels of one
// image and a tile of 16 output channels; each thread keeps one pixel's 16
// accumulators in registers. The weight tile is staged in shared memory one
// slab of (input channel, kernel row) pairs at a time and read back as
// broadcasts; input values come through the L1 cache, which catches the
// reuse between neighbouring taps.
#include <ATen/Dispatch.h>

#include "../common.cuh"
#include "../kernel_sizes.cuh"
#include "direct.h"

namespace conv2d_ext {
namespace cuda {
namespace {

constexpr int kCoTile = 16;
constexpr int kStageBytes = 16 * 1024;

template <typename T, int KH_T, int KW_T>
__global__ void __launch_bounds__(kThreads)
    fprop_direct_kernel(const ConvParams p, const T* __restrict__ x,
                        const T* __restrict__ w, const T* __restrict__ bias,
                        T* __restrict__ y, int tile_w, int rows_per_stage) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* s_w = reinterpret_cast<T*>(smem_raw);  // [row][kw][co]

  const int KH = static_or<KH_T>(p.kernel_h);
  const int KW = static_or<KW_T>(p.kernel_w);
  const int H = p.in_h, W = p.in_w, Ho = p.out_h, Wo = p.out_w;
  const int cin_g = p.in_channels_per_group();
  const int cout_g = p.out_channels_per_group();
  const int dh = p.dilation_h, dw = p.dilation_w;

  const int tiles_w = (Wo + tile_w - 1) / tile_w;
  const int tile_h = kThreads / tile_w;
  const int oh = (blockIdx.x / tiles_w) * tile_h + threadIdx.x / tile_w;
  const int ow = (blockIdx.x % tiles_w) * tile_w + threadIdx.x % tile_w;
  const bool active = oh < Ho && ow < Wo;
  const int ih0 = oh * p.stride_h - p.pad_h;
  const int iw0 = ow * p.stride_w - p.pad_w;

  // Weight layout [Cout][Cin/g][KH][KW] is [Cout][rows][KW] with one row
  // per (input channel, kernel row) pair.
  const int rows = cin_g * KH;
  const int co_tiles = (cout_g + kCoTile - 1) / kCoTile;

  for (int gy = blockIdx.y; gy < p.groups * co_tiles; gy += gridDim.y) {
    const int g = gy / co_tiles;
    const int co0 = (gy % co_tiles) * kCoTile;
    const int co_count = min(kCoTile, cout_g - co0);
    const T* w_tile =
        w + static_cast<int64_t>(g * cout_g + co0) * rows * KW;

    for (int n = blockIdx.z; n < p.batch; n += gridDim.z) {
      T acc[kCoTile];
#pragma unroll
      for (int c = 0; c < kCoTile; ++c) {
        acc[c] = (bias != nullptr && c < co_count) ? bias[g * cout_g + co0 + c]
                                                   : T(0);
      }
      for (int r0 = 0; r0 < rows; r0 += rows_per_stage) {
        const int nrows = min(rows_per_stage, rows - r0);
        const int per_co = nrows * KW;
        __syncthreads();  // previous slab fully consumed
        for (int i = threadIdx.x; i < kCoTile * per_co; i += kThreads) {
          const int c = i / per_co;
          const int j = i - c * per_co;
          s_w[j * kCoTile + c] =
              c < co_count ? w_tile[static_cast<int64_t>(c) * rows * KW +
                                    r0 * KW + j]
                           : T(0);
        }
        __syncthreads();
        if (!active) continue;
        for (int r = 0; r < nrows; ++r) {
          const int ci = (r0 + r) / KH;
          const int kh = (r0 + r) - ci * KH;
          const int ih = ih0 + kh * dh;
          if (ih < 0 || ih >= H) continue;
          const T* x_row =
              x + plane_offset(n, p.in_channels, g * cin_g + ci, H * W) +
              static_cast<int64_t>(ih) * W;
          const T* s_row = s_w + r * KW * kCoTile;
#pragma unroll
          for (int kw = 0; kw < KW; ++kw) {
            const int iw = iw0 + kw * dw;
            const T v = (iw >= 0 && iw < W) ? __ldg(x_row + iw) : T(0);
            T wv[kCoTile];
            load_tile(s_row + kw * kCoTile, wv);
#pragma unroll
            for (int c = 0; c < kCoTile; ++c) acc[c] = fma(v, wv[c], acc[c]);
          }
        }
      }
      if (active) {
        T* y_pix = y + plane_offset(n, p.out_channels, g * cout_g + co0,
                                    Ho * Wo) +
                   static_cast<int64_t>(oh) * Wo + ow;
#pragma unroll
        for (int c = 0; c < kCoTile; ++c) {
          if (c < co_count) y_pix[static_cast<int64_t>(c) * Ho * Wo] = acc[c];
        }
      }
    }
  }
}

template <typename T>
void launch_fprop_direct(const ConvParams& p, const at::TensorBase& x, const at::TensorBase& w,
                         const T* bias, at::TensorBase& y) {
  const int tile_w = pick_pixel_tile_w(p.out_w);
  const int tile_h = kThreads / tile_w;
  const int64_t rows = p.in_channels_per_group() * p.kernel_h;
  const int64_t row_bytes = p.kernel_w * kCoTile * sizeof(T);
  const int rows_per_stage = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(rows, kStageBytes / row_bytes)));
  const size_t smem = rows_per_stage * row_bytes;

  const dim3 grid(ceil_div(p.out_h, tile_h) * ceil_div(p.out_w, tile_w),
                  std::min(p.groups * ceil_div(p.out_channels_per_group(),
                                               kCoTile),
                           kMaxGridYZ),
                  std::min(p.batch, kMaxGridYZ));
  const bool specialise = std::is_same<T, float>::value;
  dispatch_kernel_size(p.kernel_h, p.kernel_w, specialise, [&](auto kh,
                                                               auto kw) {
    auto kernel = fprop_direct_kernel<T, decltype(kh)::value,
                                      decltype(kw)::value>;
    ensure_dynamic_smem(kernel, smem);
    kernel<<<grid, kThreads, smem, current_stream()>>>(
        p, x.data_ptr<T>(), w.data_ptr<T>(), bias, y.data_ptr<T>(), tile_w,
        rows_per_stage);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

void launch_fprop_direct(const ConvParams& p, const at::TensorBase& x, const at::TensorBase& w,
                         const at::TensorBase& b, at::TensorBase& y) {
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "conv2d_ext_fprop", [&] {
    launch_fprop_direct<scalar_t>(p, x, w, b.defined() ? b.data_ptr<scalar_t>() : nullptr, y);
  });
}

}  // namespace cuda
}  // namespace conv2d_ext
