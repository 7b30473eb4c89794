// Forward for few input channels per group (at most 4: depthwise layers,
// RGB stems) on FFMA; also dgrad at unit stride where that is such a
// forward (p = dgrad_as_fprop(layer), WeightOrder::kDgrad).
//
// A few multiply-adds per byte: the limit is memory traffic, not the
// tensor cores. A block stages its input channels' tile with halo in
// shared memory once (16-byte async copies where rows are aligned), then
// each thread owns one output column of the tile:
// - narrow (at most 4 output channels per group: depthwise, grouped 4 ->
//   4): 8 rows x those channels; 4 slots of 64 threads stack to a 32 x 64
//   tile. At unit stride and dilation a thread slides a register window
//   down its column, so each staged value is read once per kernel column,
//   not once per tap, while the window's weights fit in registers. Tall
//   depthwise tiles (fc::fprop_tall) at unit stride and dilation: 14 rows
//   x 2 columns a thread, so a window row is a few 8-byte loads that feed
//   both columns.
// - wide (RGB stems): 4 rows x 16 channels; the 4 slots cover a 64-channel
//   tile, and every staged input value feeds 16 multiply-adds.
// Lanes of a warp own consecutive columns (or column pairs): coalesced
// stores, conflict-free shared reads at unit stride.
//
// Files: the kernels are in fprop.cuh, instantiated once per kernel size in
// instantiations/fprop_*.cu; this file checks the problem, makes the
// tensor map and picks the size.

#include "../../plan.h"
#include "../kernel_sizes.cuh"
#include "../tensor_map.h"
#include "few_channels.cuh"
#include "few_channels.h"
#include "fprop.h"

namespace conv2d_ext {
namespace cuda {

namespace fc = conv2d_ext::few_channels;

void launch_fprop_few_channels(const ConvParams& p, const at::TensorBase& x,
                               const at::TensorBase& w, const float* bias, at::TensorBase& y,
                               WeightOrder order) {
  TORCH_CHECK(fc::fprop_fits(p), "conv2d_ext: internal error: few-channel forward does not fit");
  TORCH_CHECK(ceil_div(p.out_h, fc::fprop_tile_rows(p)) * ceil_div(p.out_w, fc::kTileCols) <
                  (int64_t(1) << 31),
              "conv2d_ext: output plane too large for the few-channel forward");
  TORCH_CHECK(p.batch < (int64_t(1) << 30), "conv2d_ext: batch too large for the few-channel forward");
  const bool vec = few_channels::can_vectorise(x.data_ptr(), p.in_w);
  // On Hopper the tensor-copy engine stages the halo: one instruction per
  // image instead of a loop of copies (a large share of the instructions).
  // It reads the rows that 16-byte copies would (vec).
  const fc::Halo h = fc::fprop_halo(p);
  const bool tma = few_channels::tma_stages(vec, h);
  CUtensorMap x_map{};  // not read without tma
  if (tma) {
    x_map = nchw_tensor_map(x, static_cast<uint32_t>(h.pitch), static_cast<uint32_t>(h.rows),
                            static_cast<uint32_t>(p.in_channels_per_group()), 1);
  }
  const few_channels_fprop::FpropArgs a{p,    x_map, x.data_ptr<float>(), w.data_ptr<float>(),
                                        bias, y.data_ptr<float>(), order, vec, tma};
  dispatch_few_channels_kernel_size(p.kernel_h, p.kernel_w, [&](auto kh, auto kw) {
    constexpr int KH = decltype(kh)::value, KW = decltype(kw)::value;
    few_channels_fprop::launch_size<KH, KW>(a, fc::choose_fprop_variant(p, vec, KH > 0));
  });
}

}  // namespace cuda
}  // namespace conv2d_ext
