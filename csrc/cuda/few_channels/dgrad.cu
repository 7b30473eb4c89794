// dgrad for few input channels per group (at most 4: depthwise layers, RGB
// stems) on FFMA, at any stride.
//
// Stride phases: input row ih is reached by tap kh exactly when
// (ih + pad_h - kh * dilation_h) is a multiple of stride_h, from output row
// (ih + pad_h - kh * dilation_h) / stride_h. That depends on ih only through
// ph = ih mod stride_h, so a block takes one phase (ph, pw): rows ih = ph +
// stride_h * i, columns iw = pw + stride_w * j. Over (i, j) the phase is a
// unit-stride correlation of grad_output with the taps that reach it (no
// multiply-adds on the zeros a strided transposed convolution would insert)
// at offsets off(kh) = (ph + pad_h - kh * dilation_h) / stride_h.
//
// A block owns a 32 x 64 tile of one phase of one image and group, all the
// group's input channels (at most 4) as accumulators: each thread a column
// of 8 rows. It stages grad_output tiles of 4 channels at a time with
// their halo and the matching weights, so every grad_input element is
// written once. At stride 2 with unit dilation (RGB stems) a phase's taps
// read consecutive grad_output columns, and where their weights fit in
// registers a thread takes two columns of 4 rows instead (see
// accumulate_pairs). On Hopper one thread starts both copies (a tensor-map box
// for the halo, a bulk copy of the weights, prearranged per phase by a
// small kernel): staging them with per-thread copies and index arithmetic
// was a large share of the stem's instructions. Elsewhere 16-byte copies
// where rows are aligned. Two chunks are staged where they fit, the next
// one's copies in flight while this one computes (faster than one; see
// docs/kernels.md, "Few channels on FFMA").

#include "dgrad.cuh"

namespace conv2d_ext {
namespace cuda {
namespace few_channels_dgrad {

// Window phases' weights, prearranged once per call: [group][phase][co
// (padded to whole chunks)][kw tap b][kh tap q][4 ci], zeros past the
// channels, so that a chunk's weights are one contiguous copy. A (group,
// phase) block is `phase_floats` long; one thread per float of the
// largest phase, blocks striding over the phases and groups.
__global__ void arrange_phase_weights(const ConvParams p, const float* __restrict__ w,
                                      float* __restrict__ out, int co_pad, int phase_floats) {
  launch_dependents();  // the dgrad's blocks may start; they wait before reading `out`
  const int sh = p.stride_h, sw = p.stride_w;
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= phase_floats) return;
  for (int phase = blockIdx.y; phase < sh * sw; phase += gridDim.y) {
    const PhaseTaps th = phase_taps(phase / sw, p.pad_h, p.kernel_h, sh, p.dilation_h);
    const PhaseTaps tw = phase_taps(phase % sw, p.pad_w, p.kernel_w, sw, p.dilation_w);
    const int taps_phase = th.count * tw.count;
    if (e >= co_pad * taps_phase * 4) continue;
    const int ci = e % 4, tap = (e / 4) % taps_phase, co = e / (4 * taps_phase);
    const int b = tap / th.count, q = tap - b * th.count;
    const int kh_last = th.first + (th.count - 1) * th.step;
    for (int g = blockIdx.z; g < p.groups; g += gridDim.z) {
      out[(int64_t(g) * sh * sw + phase) * phase_floats + e] =
          weight_or_zero(p, w, WeightOrder::kFprop, g, co, ci, kh_last - q * th.step,
                         tw.first + b * tw.step);
    }
  }
}

void launch_arrange_phase_weights(dim3 grid, cudaStream_t stream, const ConvParams& p,
                                  const float* w, float* out, int co_pad, int phase_floats) {
  arrange_phase_weights<<<grid, 256, 0, stream>>>(p, w, out, co_pad, phase_floats);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace few_channels_dgrad

void launch_dgrad_few_channels(const ConvParams& p, const at::TensorBase& grad_out,
                               const at::TensorBase& w, at::TensorBase& grad_in) {
  TORCH_CHECK(conv2d_ext::few_channels::dgrad_fits(p),
              "conv2d_ext: internal error: few-channel dgrad does not fit");
  const bool vec = few_channels::can_vectorise(grad_out.data_ptr(), p.out_w);
  const float* wp = w.data_ptr<float>();
  float* gi = grad_in.data_ptr<float>();
  dispatch_few_channels_kernel_size(p.kernel_h, p.kernel_w, [&](auto kh, auto kw) {
    few_channels_dgrad::launch_size<decltype(kh)::value, decltype(kw)::value>(p, grad_out, wp,
                                                                             gi, vec);
  });
}

}  // namespace cuda
}  // namespace conv2d_ext
