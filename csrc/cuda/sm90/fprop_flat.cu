// Forward pass (fprop) on Hopper's wgmma with pixels as the N dimension.
//
// GEMM view per group and work item: M = 64 output channels, N = 256
// output positions, K = Cin/groups*KH*KW. With Cout = 64, putting pixels in
// M (the other sm_90 kernel) caps a wgmma at n64, so every m64n64k8 reads as
// many operand bytes from shared memory as it does math; here a k8 step is
// one m64n256k8, both operands from shared memory.
//
// 3xTF32 (IEEE mode, kTf32x3): the tensor cores truncate as they
// accumulate, so each k8 step's small*big + big*small + big*big goes into
// a zeroed temporary that is added to the accumulators with FADDs (kGroup
// steps per temporary, two or three by the length of K; see the launch). A
// temporary of the whole 256-position tile would not fit next to them, so
// kGroup steps run as four m64n64k8 quarters, each quarter's 3 * kGroup
// products into one of two alternating 32-register temporaries, with A
// (the weights) from registers, split as loaded. The halo's big and small
// parts take both halo buffers, so a chunk is split at its start instead
// of under the previous chunk (two blocks per SM overlap that).
// kRoundBig: big is rounded to nearest (otherwise truncated), where the
// error would pass cuDNN's strict FP32 without it: over a short K, where
// the products' rounding sets it (below 512: 1x1 dgrad), and over a long
// K (at least cfg::kLongK: a 5x9 dgrad of 64 channels), where the FP32 chain of
// temporaries in the accumulators does and is also cut into segments whose
// sums are added up in the output (config.h).
//
// wgmma reads TF32 B only K-major, so the halo of a chunk of input channels
// is stored channel-interleaved, [4-channel plane][pixel][4 channels], and
// flattened with a power-of-two row pitch P (config.h): the N
// positions of every tap are consecutive 16-byte rows, a tap just moves the
// descriptor's start. Positions in the last (KW-1)*dw columns of each pitch
// wrap into the next halo row; they are computed and not stored. Rows of a
// tile are one phase of the dilation (oh0 + dh*r), so the halo needs
// rows + KH - 1 consecutive rows of that phase. Unit stride only.
//
// Row shifts (kShifts = 2, for at most 32 output channels per group, see
// Layout in config.h): M rows 32..63 compute the channels of rows
// 0..31 one output row further down, with the weights one kernel row
// later. K then runs over KH + 1 kernel rows and each position row yields
// two output rows, so the halo is stored by row phase (even rows, then odd
// rows): the positions of any kernel row are still consecutive rows.
//
// Persistent blocks: each walks work items (output tile, channel tile,
// image) and their stages as one stream, so that the copies for the next
// item start under the current item's last wgmmas and a block pays the
// copy latency once, not per tile. Per stream position:
// - the halo of a chunk arrives by the tensor-copy engine as a box of the
//   NCHW input ([channels][halo rows][P + 4 columns], zeros outside the
//   image; dilated rows by the copy's element stride) one chunk ahead; the
//   block's threads round it to TF32 into the interleaved layout under the
//   wgmmas of the previous chunk's first stage (TF32 mode);
// - the weights of a stage (kernel rows of a chunk) arrive by one bulk copy,
//   two stages ahead;
// - copies complete on mbarriers; a stage's wgmmas are issued back to back
//   and retired before its buffers are handed back.
//
// Code: the kernel walks items (ItemWalk, ItemWindow) and their stages;
// Producer starts the copies and converts a chunk's halo (TF32 rounding or
// the tf32x3 split); a stage of the main loop is issue_stage_tf32 (TF32) or
// groups of tf32x3_steps (3xTF32); Epilogue::write_tile stores a tile, with
// the bias. More in docs/kernels.md, "Flat sm_90 forward".
//
// Files: the kernel and its device pieces are in fprop_flat.cuh,
// instantiated once per kernel size in instantiations/fprop_flat_*.cu; this
// file holds the weights' rearrangement and the host code that chooses the
// layout and launches.
#include <cuda.h>

#include <algorithm>

#include "../common.cuh"
#include "../kernel_sizes.cuh"
#include "../mma.cuh"
#include "../tensor_map.h"
#include "config.h"
#include "fprop_flat.h"
#include "sm90.h"

namespace conv2d_ext {
namespace cuda {
namespace {

namespace cfg = igemm_fprop_sm90_flat;

// Weights [Cout][Cin/g][KH][KW] -> [group][co tile][chunk][kh'][kw][k8 step]
// [k half (2)][m (64)][4 channels]: wgmma's K-major A operand without
// swizzle (8-row x 16-byte core matrices; k halves 1 KB apart, 8-row groups
// 128 bytes), zero outside the real channels; rounded to TF32 unless the
// kernel splits them itself (3xTF32). Row m is channel m % (64 / S) of the
// tile at row shift s = m / (64 / S), whose tap kh' is kernel row kh' - s
// (zero outside the kernel); kh' counts L.tap_rows = KH + S - 1 rows.
__global__ void __launch_bounds__(kThreads)
    rearrange_flat_weights_kernel(const ConvParams p, const float* __restrict__ w,
                                  float* __restrict__ out, int chunks, int ksteps,
                                  int co_tiles, int shifts, int64_t total, WeightOrder order,
                                  bool round) {
  const int co_per_tile = cfg::kCo / shifts;
  for (int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * kThreads) {
    const WeightTileIndex t = decode_weight_tile_index(
        e, cfg::kStepFloats, ksteps, p.kernel_h + shifts - 1, p.kernel_w, chunks, co_tiles);
    const int m = (t.within >> 2) & (cfg::kCo - 1);
    const int k = 4 * (t.within >> 8) + (t.within & 3);
    const int shift = m / co_per_tile;
    const int kh = t.kh - shift;
    const float v =
        kh >= 0 && kh < p.kernel_h
            ? weight_or_zero(p, w, order, t.g, t.co_tile * co_per_tile + m % co_per_tile,
                             (t.chunk * ksteps + t.kstep) * 8 + k, kh, t.kw)
            : 0.f;
    out[e] = round ? __uint_as_float(tf32_operand(v)) : v;
  }
}

}  // namespace

void launch_fprop_sm90_flat(const ConvParams& p, const at::TensorBase& x_in,
                            const at::TensorBase& w, const float* bias, at::TensorBase& y,
                            MathMode math, WeightOrder order) {
  const bool tf32x3 = math == MathMode::kIEEE;  // 3xTF32
  const cfg::Layout L = cfg::choose_layout(p, tf32x3);
  TORCH_CHECK(L.smem_bytes != INT64_MAX, "conv2d_ext: internal error: the plan picked the "
              "sm_90 flat kernel for a problem it does not fit");
  // TMA reads from a 16-byte aligned base (rows are, by the plan); a view
  // starting elsewhere is copied once.
  const at::TensorBase x = aligned_16(x_in, at::MemoryFormat::Preserve);
  // The halo as boxes of one chunk's channels x the halo's rows (every
  // dilation_h-th) x P + 4 columns.
  const CUtensorMap x_map = nchw_tensor_map(
      x, (1u << L.log2_pitch) + cfg::kTmaColumnSlack, static_cast<uint32_t>(L.halo_rows * p.dilation_h),
      static_cast<uint32_t>(8 * L.ksteps), static_cast<uint32_t>(p.dilation_h));
  auto stream = current_stream();

  const int64_t total = p.groups * int64_t(L.co_tiles) * L.chunks * L.tap_rows * p.kernel_w *
                        L.ksteps * cfg::kStepFloats;
  at::TensorBase w_tiles = scratch({total}, w.scalar_type());
  const int rblocks = static_cast<int>(std::min<int64_t>(ceil_div(total, kThreads), 4096));
  rearrange_flat_weights_kernel<<<rblocks, kThreads, 0, stream>>>(
      p, w.data_ptr<float>(), w_tiles.data_ptr<float>(), L.chunks, L.ksteps, L.co_tiles,
      L.shifts, total, order, /*round=*/!tf32x3);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  const int64_t items = int64_t(L.tiles_w) * L.tiles_h * p.groups * L.co_tiles * p.batch;
  // Persistent: as many blocks as fit on the GPU at once (the layout's
  // count, without an occupancy query per call).
  const int sms = device_properties()->multiProcessorCount;
  const int per_sm = std::max(cfg::blocks_per_sm(L.smem_bytes, tf32x3), 1);
  const FlatLaunch launch{x_map,
                          p,
                          L,
                          cfg::choose_variant(p, L, tf32x3),
                          w_tiles.data_ptr<float>(),
                          bias,
                          y.data_ptr<float>(),
                          static_cast<unsigned>(std::min<int64_t>(items, int64_t(per_sm) * sms)),
                          stream};
  dispatch_kernel_size(p.kernel_h, p.kernel_w, /*specialise=*/true, [&](auto kh, auto kw) {
    launch_flat_kernel<decltype(kh)::value, decltype(kw)::value>(launch);
  });
}

}  // namespace cuda
}  // namespace conv2d_ext
