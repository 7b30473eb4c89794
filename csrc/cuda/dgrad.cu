// Backward-data pass (dgrad) on CUDA. Where dgrad is a forward pass (unit
// stride: dgrad_is_fprop), the plan sends it to the tensor-core forward
// kernels on the transposed, rotated weight; at stride > 1, to one forward
// per stride phase of the input (dgrad_phases); everything else runs the
// direct convolution on FFMA below.
//
// GEMM view per group: M = N*H*W input pixels, N = Cin/groups input
// channels, K = Cout/groups*KH*KW. Each thread owns one input pixel and 16
// input channels and gathers the grad_output taps that reach it: tap
// (kh, kw) reaches input row ih from output row (ih + pad - kh*dil) / stride
// when that division is exact. The weight slab is staged in shared memory
// as [co, kh][kw][ci], the transpose the gather needs.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <torch/library.h>

#include "../pass_entry.h"
#include "../plan.h"
#include "../tile_config.h"
#include "common.cuh"
#include "fprop.h"
#include "fprop_implicit_gemm.h"
#include "kernel_sizes.cuh"
#include "small_channels.h"

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
void launch_dgrad_direct(const ConvParams& p, const at::Tensor& grad_out,
                         const at::Tensor& w, at::Tensor& grad_in) {
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
    kernel<<<grid, kThreads, smem, at::cuda::getCurrentCUDAStream()>>>(
        p, grad_out.data_ptr<T>(), w.data_ptr<T>(), grad_in.data_ptr<T>(),
        tile_w, rows_per_stage);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// Strided dgrad, phase by phase: each phase's forward writes a compact
// tensor, copied into its strided slice of grad_input (an extra pass over
// grad_input: the forward kernels write dense outputs only).
void launch_dgrad_phases(const ConvParams& p, const at::Tensor& go, const at::Tensor& w,
                         at::Tensor& grad_in) {
  const int64_t cin_g = p.in_channels_per_group(), cout_g = p.out_channels_per_group();
  // Each group's weight transposed (input and output channels swapped) and
  // flipped, so that a phase's sub-kernel is a strided slice of it.
  const at::Tensor flipped = w.view({p.groups, cout_g, cin_g, p.kernel_h, p.kernel_w})
                                 .transpose(1, 2)
                                 .reshape({p.in_channels, cout_g, p.kernel_h, p.kernel_w})
                                 .flip({2, 3});
  for (const DgradPhase& ph : dgrad_phases(p)) {
    const ConvParams& f = ph.fprop;
    at::Tensor dst = grad_in.slice(2, ph.row0, p.in_h, p.stride_h)
                         .slice(3, ph.col0, p.in_w, p.stride_w);
    if (f.kernel_h == 0 || f.kernel_w == 0) {
      dst.zero_();
      continue;
    }
    // Sub-kernel row u is kernel row kh_last - u * kh_step: flipped row
    // KH - 1 - kh_last + u * kh_step.
    const at::Tensor sub = flipped.slice(2, p.kernel_h - 1 - ph.kh_last, p.kernel_h, ph.kh_step)
                               .slice(3, p.kernel_w - 1 - ph.kw_last, p.kernel_w, ph.kw_step)
                               .contiguous();
    TORCH_CHECK(sub.size(2) == f.kernel_h && sub.size(3) == f.kernel_w,
                "conv2d_ext: internal error: dgrad phase sub-kernel ", sub.sizes());
    at::Tensor y = at::empty({p.batch, p.in_channels, f.out_h, f.out_w}, grad_in.options());
    // A phase whose first tap reads past grad_output's first row starts
    // later (rare: padding past the kernel's reach); copied, as the forward
    // kernels take contiguous inputs.
    const at::Tensor src = ph.row_skip > 0 || ph.col_skip > 0
                               ? go.slice(2, ph.row_skip).slice(3, ph.col_skip).contiguous()
                               : go;
    launch_fprop(f, src, sub, at::Tensor(), y);
    dst.copy_(y);
  }
}

at::Tensor conv2d_backward_input_cuda(const at::Tensor& grad_output,
                                      const at::Tensor& weight,
                                      c10::IntArrayRef input_size,
                                      c10::IntArrayRef stride,
                                      c10::IntArrayRef padding,
                                      c10::IntArrayRef dilation,
                                      int64_t groups) {
  return dgrad_entry(
      grad_output, weight, input_size, stride, padding, dilation, groups,
      [](const ConvParams& p, const at::Tensor& go, const at::Tensor& w,
         at::Tensor& grad_in) {
        const Plan plan = choose_plan(p, Pass::kDgrad, go.scalar_type(),
                                      current_sm());
        switch (plan.algo) {
          case Algo::kImplicitGemm:
          case Algo::kImplicitGemmSm90:  // float32 only
            launch_fprop_implicit_gemm(dgrad_as_fprop(p), go, w, /*bias=*/nullptr, grad_in,
                                       plan.math, plan.algo == Algo::kImplicitGemmSm90,
                                       WeightOrder::kDgrad);
            return;
          case Algo::kImplicitGemmSm90Flat:
            launch_fprop_sm90_flat(dgrad_as_fprop(p), go, w, /*bias=*/nullptr, grad_in,
                                   plan.math, WeightOrder::kDgrad);
            return;
          case Algo::kDepthwise:
          case Algo::kFewChannels:  // float32 only
            if (small_channels::dgrad_runs_as_fprop(p)) {
              launch_fprop_small_channels(dgrad_as_fprop(p), go, w, /*bias=*/nullptr, grad_in,
                                          WeightOrder::kDgrad);
            } else {
              launch_dgrad_small_channels(p, go, w, grad_in);
            }
            return;
          case Algo::kDgradPhases:  // float32 only
            launch_dgrad_phases(p, go, w, grad_in);
            return;
          case Algo::kDirect:
            AT_DISPATCH_FLOATING_TYPES(go.scalar_type(), "conv2d_ext_dgrad", [&] {
              launch_dgrad_direct<scalar_t>(p, go, w, grad_in);
            });
            return;
          case Algo::kFewChannelsTensorCore:  // float32 only
            launch_dgrad_small_channels_tc(p, go, w, grad_in);
            return;
        }
        TORCH_CHECK(false, "conv2d_ext: no CUDA dgrad kernel for algorithm ",
                    to_string(plan.algo));
      });
}

}  // namespace

TORCH_LIBRARY_IMPL(conv2d_ext, CUDA, m) {
  m.impl("conv2d_backward_input", &conv2d_backward_input_cuda);
}

}  // namespace cuda
}  // namespace conv2d_ext
