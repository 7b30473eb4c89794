// Backward-weight pass (wgrad) on FFMA: the direct reduction every dtype,
// shape and GPU can run.
//
// GEMM view per group: M = Cout/groups, N = Cin/groups*KH*KW and
// K = N*Ho*Wo, the reduction over every output pixel. K dwarfs M and N, so
// the reduction is split: a block owns an 8-channel x (one kernel row
// segment) tile of the weight gradient for one input channel and one slice
// of the output rows, each thread sums every 256th pixel of the slice, and
// the block reduces its threads in a fixed tree. Slices land in a workspace
// that a second kernel sums in slice order. No atomics anywhere, so the
// result is bitwise identical from run to run on the same GPU.
#include <ATen/Dispatch.h>

#include <limits>

#include "../common.cuh"
#include "../kernel_sizes.cuh"
#include "../split_reduce.cuh"
#include "direct.h"

namespace conv2d_ext {
namespace cuda {
namespace {

constexpr int kCoTile = 8;
constexpr int kWarps = kThreads / 32;

// Kernel-row segment a thread covers: the whole row for specialised sizes,
// 8 taps at a time for the generic kernel.
template <int KW_T>
constexpr int segment_width() {
  return (KW_T > 0 && KW_T <= 16) ? KW_T : 8;
}

template <typename T, int KH_T, int KW_T>
__global__ void __launch_bounds__(kThreads)
    wgrad_direct_kernel(const ConvParams p, const T* __restrict__ grad_out,
                        const T* __restrict__ x, T* __restrict__ partial,
                        int rows_per_split) {
  constexpr int kSeg = segment_width<KW_T>();
  __shared__ T s_red[kWarps][kCoTile * kSeg];

  const int KH = static_or<KH_T>(p.kernel_h);
  const int KW = static_or<KW_T>(p.kernel_w);
  const int H = p.in_h, W = p.in_w, Ho = p.out_h, Wo = p.out_w;
  const int cin_g = p.in_channels_per_group();
  const int cout_g = p.out_channels_per_group();

  // blockIdx.x -> (group, co tile, input channel, kernel row, segment).
  const int segs = (KW + kSeg - 1) / kSeg;
  const int co_tiles = (cout_g + kCoTile - 1) / kCoTile;
  int t = blockIdx.x;
  const int seg = t % segs;
  t /= segs;
  const int kh = t % KH;
  t /= KH;
  const int ci = t % cin_g;
  t /= cin_g;
  const int co0 = (t % co_tiles) * kCoTile;
  const int g = t / co_tiles;
  const int kw0 = seg * kSeg;
  const int co_count = min(kCoTile, cout_g - co0);

  // This block's slice of output rows (n, oh), flattened with the columns.
  const int total_rows = p.batch * Ho;
  // row_begin < total_rows for every slice, so neither this nor the pixel
  // count (capped on the host) overflows.
  const int row_begin = blockIdx.y * rows_per_split;
  const int pixels = min(rows_per_split, total_rows - row_begin) * Wo;

  T acc[kCoTile][kSeg];
#pragma unroll
  for (int c = 0; c < kCoTile; ++c)
#pragma unroll
    for (int j = 0; j < kSeg; ++j) acc[c][j] = T(0);

  for (int i = threadIdx.x; i < pixels; i += kThreads) {
    const int row = row_begin + i / Wo;
    const int ow = i % Wo;
    const int n = row / Ho;
    const int oh = row - n * Ho;
    const int ih = oh * p.stride_h - p.pad_h + kh * p.dilation_h;
    if (ih < 0 || ih >= H) continue;
    T go[kCoTile];
    const T* go_pix = grad_out +
                      plane_offset(n, p.out_channels, g * cout_g + co0,
                                   Ho * Wo) +
                      static_cast<int64_t>(oh) * Wo + ow;
#pragma unroll
    for (int c = 0; c < kCoTile; ++c) {
      go[c] = c < co_count ? __ldg(go_pix + static_cast<int64_t>(c) * Ho * Wo)
                           : T(0);
    }
    const T* x_row = x + plane_offset(n, p.in_channels, g * cin_g + ci, H * W) +
                     static_cast<int64_t>(ih) * W;
    const int iw0 = ow * p.stride_w - p.pad_w + kw0 * p.dilation_w;
#pragma unroll
    for (int j = 0; j < kSeg; ++j) {
      const int iw = iw0 + j * p.dilation_w;
      const T v = (kw0 + j < KW && iw >= 0 && iw < W) ? __ldg(x_row + iw)
                                                      : T(0);
#pragma unroll
      for (int c = 0; c < kCoTile; ++c) acc[c][j] = fma(go[c], v, acc[c][j]);
    }
  }

  warp_sums(acc, s_red);
  __syncthreads();
  for (int e = threadIdx.x; e < kCoTile * kSeg; e += kThreads) {
    const int c = e / kSeg;
    const int j = e % kSeg;
    if (c >= co_count || kw0 + j >= KW) continue;
    const T sum = sum_warps(s_red, e);
    const int64_t co = g * cout_g + co0 + c;
    partial[static_cast<int64_t>(blockIdx.y) * p.weight_numel() +
            ((co * cin_g + ci) * KH + kh) * KW + kw0 + j] = sum;
  }
}

// Output rows per slice: enough slices to fill the GPU a few blocks deep,
// each slice's pixel count below kMaxIndex32 (the kernel counts pixels in
// int, with headroom for its loop step). Depends only on the shape and the
// GPU, so results are reproducible.
int64_t pick_rows_per_split(const ConvParams& p, int64_t tiles) {
  const int sms = device_properties()->multiProcessorCount;
  const int64_t rows = p.batch * p.out_h;
  const int64_t target_blocks = 4 * static_cast<int64_t>(sms);
  int64_t splits = std::max<int64_t>(1, ceil_div(target_blocks, tiles));
  splits = std::min(splits, std::max<int64_t>(1, rows / 4));
  // out_w < kMaxIndex32 (make_*_params), so at least one row fits.
  return std::min(ceil_div(rows, splits), (kMaxIndex32 - 1) / p.out_w);
}

template <typename T>
void launch_wgrad_direct(const ConvParams& p, const at::TensorBase& grad_out,
                         const at::TensorBase& x, at::TensorBase& grad_w) {
  TORCH_CHECK(p.batch * p.out_h <= std::numeric_limits<int32_t>::max(),
              "conv2d_ext: batch * output height must fit in int32");
  const bool specialise = std::is_same<T, float>::value;
  dispatch_kernel_size(p.kernel_h, p.kernel_w, specialise, [&](auto kh,
                                                               auto kw) {
    constexpr int kSeg = segment_width<decltype(kw)::value>();
    const int64_t tiles = p.groups *
                          ceil_div(p.out_channels_per_group(), kCoTile) *
                          p.in_channels_per_group() * p.kernel_h *
                          ceil_div(p.kernel_w, kSeg);
    const int64_t rows = p.batch * p.out_h;
    const int rows_per_split = static_cast<int>(pick_rows_per_split(p, tiles));
    const int splits = static_cast<int>(
        std::min(ceil_div(rows, rows_per_split), kMaxGridYZ + 1));
    TORCH_CHECK(tiles <= std::numeric_limits<int32_t>::max() &&
                    splits <= kMaxGridYZ,
                "conv2d_ext: weight gradient too large");

    at::TensorBase partial =
        splits == 1 ? grad_w : scratch({splits, p.weight_numel()}, x.scalar_type());
    auto stream = current_stream();
    wgrad_direct_kernel<T, decltype(kh)::value, decltype(kw)::value>
        <<<dim3(tiles, splits), kThreads, 0, stream>>>(
            p, grad_out.data_ptr<T>(), x.data_ptr<T>(), partial.data_ptr<T>(),
            rows_per_split);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (splits > 1) reduce_splits<T>(partial, grad_w, p.weight_numel(), splits);
  });
}

}  // namespace

void launch_wgrad_direct(const ConvParams& p, const at::TensorBase& grad_out,
                         const at::TensorBase& x, at::TensorBase& grad_w) {
  AT_DISPATCH_FLOATING_TYPES(grad_out.scalar_type(), "conv2d_ext_wgrad", [&] {
    launch_wgrad_direct<scalar_t>(p, grad_out, x, grad_w);
  });
}

}  // namespace cuda
}  // namespace conv2d_ext
