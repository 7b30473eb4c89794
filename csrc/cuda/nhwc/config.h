// Tiles of the channels_last implicit-GEMM engine (nhwc/): fprop as a GEMM
// over the whole batch, M = N*P*Q output pixels, N = K output channels,
// K = R*S*C (tap-major, channels innermost, as NHWC activations and KRSC
// weights hold them), so both operands are K-major and tiles span images.
// A K tile row is 128 bytes of one tap's channels: 32 float32 channels, or
// 64 float16/bfloat16 ones (`elem_bytes` below: 4 or 2).
#pragma once

#include <algorithm>
#include <cstdint>

#include "../../conv_params.h"

namespace conv2d_ext {
namespace igemm_nhwc {

constexpr int kThreads = 256;  // 8 warps
constexpr int kRowBytes = 128;  // a K tile row in shared memory
constexpr int kBlockK = 32;    // float32: one tap's 32 channels a K tile
constexpr int block_k(int elem_bytes) { return kRowBytes / elem_bytes; }
constexpr int kBlocksPerSm = 2;  // all tiles but 128 x 256 (one block per SM)

// K tiles in flight: as many as two blocks per SM leave room for (the
// copies of a block alone wait on memory; a second block's warps fill the
// gaps); 128 x 256 tiles run alone on an SM, with four (192 KB).
constexpr int stages(int bm, int bn) { return bm + bn == 256 ? 3 : 4; }
constexpr int blocks_per_sm(int bm, int bn) { return bm + bn > 256 ? 1 : kBlocksPerSm; }

// A block's tile: kBlockM pixels x kBlockN output channels.
struct Tile {
  int m, n;
};

// The M x N tile for a problem: the largest that still gives every SM a
// block (small M * N leaves SMs idle behind a few large tiles).
inline Tile choose_tile(const ConvParams& p, int sms) {
  const int64_t m = p.gemm_m(), n = p.out_channels;
  auto blocks = [&](int bm, int bn) { return ((m + bm - 1) / bm) * ((n + bn - 1) / bn); };
  if (n > 64 && blocks(128, 128) >= sms) return {128, 128};
  if (blocks(128, 64) >= sms) return {128, 64};
  return {64, 64};
}

inline int64_t smem_bytes(const Tile& t) {
  return int64_t(stages(t.m, t.n)) * (t.m + t.n) * kRowBytes;
}

// The forward's kernel: its tile, and whether it runs on wgmma (Hopper,
// sm_90a code): a 128-row tile is two warpgroups' 64 rows, each one
// wgmma per k8 step reading both operands from the swizzled stages, where
// mma.sync needs a warp's fragments loaded and issued one m16n8 at a time.
// 64 x 64 tiles stay on mma.sync. 16-bit operands run on wgmma only:
// their 64 x 64 tiles become 128-row ones.
//
// With `split_k` (Hopper), a problem whose 128-row tiles cannot give every
// SM a block takes them anyway, with its K tiles split over slices that
// fill about one wave of blocks, kMinSliceTiles K tiles a slice at least;
// the slices' partial sums are added in slice order (bitwise repeatable).
// Small planes with many channels (7x7 and 14x14 with 512) are such: on
// 64 x 64 tiles each block walks thousands of K channels alone.
//
// With `wide` (Hopper), at least 256 output channels and a block per SM,
// tiles are 128 x 256: a K tile's copies then feed 43 FLOP per byte read
// from L2 instead of 128 x 128's 32, the bound on large layers.
struct FpropKernel {
  Tile tile;
  bool wgmma;
  int splits;  // K slices; 1: no split
  int64_t tiles_per_split;  // K tiles of a slice
  bool round = true;  // wgmma: round operands to nearest TF32 in shared memory
  bool tf32x3 = false;  // IEEE mode: 3xTF32 on wgmma (fprop_sm90.cuh)
  bool pipelined = false;  // wgmma: one K tile's MMAs in flight across the barrier
  bool half_parts = false;  // 3xTF32: a partial sum every two k steps, not four
};
constexpr int64_t kMinSliceTiles = 8;
inline int64_t k_tiles(const ConvParams& p, int elem_bytes = 4) {
  const int64_t bk = block_k(elem_bytes);
  return p.taps() * ((p.in_channels + bk - 1) / bk);
}
// With `tf32x3` (IEEE mode, Hopper): wgmma's 128-row tiles only, as for
// 16-bit operands, never 128 x 256 (its accumulators and their partial
// sums would not fit), one block an SM (tf32x3_stages).
inline FpropKernel choose_fprop(const ConvParams& p, int sms, bool hopper, bool split_k,
                                bool wide, int elem_bytes = 4, bool tf32x3 = false) {
  const Tile t = choose_tile(p, sms);
  const int64_t kt = k_tiles(p, elem_bytes);
  const int64_t wide_tiles = ((p.gemm_m() + 127) / 128) * ((p.out_channels + 255) / 256);
  if (hopper && wide && !tf32x3 && p.out_channels >= 256 && wide_tiles >= sms) {
    return {{128, 256}, true, 1, kt};
  }
  if (hopper && split_k && t.m != 128) {
    const Tile w{128, p.out_channels > 64 ? 128 : 64};
    const int64_t tiles = ((p.gemm_m() + w.m - 1) / w.m) * ((p.out_channels + w.n - 1) / w.n);
    const int64_t per_sm = tf32x3 ? 1 : kBlocksPerSm;
    const int64_t want = std::min<int64_t>(per_sm * sms / tiles, kt / kMinSliceTiles);
    if (want >= 2) {
      const int64_t per = (kt + want - 1) / want;
      return {w, true, static_cast<int>((kt + per - 1) / per), per};
    }
  }
  if ((elem_bytes == 2 || tf32x3) && t.m != 128) {
    return {{128, p.out_channels > 64 ? 128 : 64}, true, 1, kt};
  }
  return {t, hopper && t.m == 128, 1, kt};
}

// wgmma reads the swizzle from 1024-byte aligned atoms: the stages, plus
// slack to align the dynamic shared memory's start.
constexpr int kWgmmaAlign = 1024;
inline int64_t wgmma_smem_bytes(const Tile& t) { return smem_bytes(t) + kWgmmaAlign; }

// 3xTF32 keeps each staged K tile twice, as its big and its small TF32
// parts, and runs one block an SM: three stages of 128 x 128 tiles, four
// of 128 x 64 (192 KB).
constexpr int tf32x3_stages(int bn) { return bn == 128 ? 3 : 4; }
inline int64_t tf32x3_smem_bytes(const Tile& t) {
  return int64_t(tf32x3_stages(t.n)) * 2 * (t.m + t.n) * kRowBytes + kWgmmaAlign;
}

// What the kernel takes: one group, 16-byte rows of input channels,
// output channels in pairs (stores of two), pixels and tiles within ints.
inline bool fits(const ConvParams& p, int elem_bytes = 4) {
  return p.groups == 1 && p.in_channels % (16 / elem_bytes) == 0 && p.out_channels % 2 == 0 &&
         p.in_channels >= 8 && p.out_channels >= 8 && p.gemm_m() < (int64_t(1) << 31) &&
         p.input_numel() < (int64_t(1) << 40);
}

// Where the forward's output pixel (image, row, column) starts in y, in
// floats: dense NHWC, or, for a strided dgrad's phase, every stride-th
// pixel of grad_input from the phase's first.
struct OutMap {
  int64_t image, row, col, base;
};
inline OutMap dense_out(const ConvParams& p) {
  return {p.out_h * p.out_w * p.out_channels, p.out_w * p.out_channels, p.out_channels, 0};
}

// Strided dgrad by phases (nhwc/dgrad.cu): each phase that some tap reaches
// is a forward over grad_output (dgrad_phases) that the forward takes and
// that reads grad_output from its first row and column (padding within the
// kernel's reach; beyond it a phase starts later, which the gather's
// image offsets do not describe).
inline bool dgrad_phases_fit(const ConvParams& p, int elem_bytes = 4) {
  if (p.groups != 1 || (p.stride_h == 1 && p.stride_w == 1)) return false;
  for (const DgradPhase& ph : dgrad_phases(p)) {
    const ConvParams& f = ph.fprop;
    if (f.kernel_h == 0 || f.kernel_w == 0) continue;
    if (ph.row_skip > 0 || ph.col_skip > 0 || !fits(f, elem_bytes)) return false;
  }
  return true;
}

// wgrad (nhwc/wgrad.cu): M = K output channels, N = one tap's C input
// channels, K = N*P*Q pixels. 16-byte chunks of both channel counts.
inline bool wgrad_fits(const ConvParams& p, int elem_bytes = 4) {
  const int chunk = 16 / elem_bytes;
  return p.groups == 1 && p.in_channels % chunk == 0 && p.out_channels % chunk == 0 &&
         p.in_channels >= 8 && p.out_channels >= 8 && p.gemm_m() < (int64_t(1) << 31) &&
         p.input_numel() < (int64_t(1) << 40);
}

}  // namespace igemm_nhwc
}  // namespace conv2d_ext
