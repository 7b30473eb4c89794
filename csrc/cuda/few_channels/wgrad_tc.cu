// wgrad for few input channels per group and many output channels (RGB
// stems) on TF32 tensor cores (mma.sync, sm_80+): TF32 in TF32 mode, 3xTF32
// in IEEE mode (on Hopper by wgmma: few_channels/wgrad_sm90.cuh). The
// FFMA wide kernel (few_channels/wgrad.cu) is issue-bound well under the
// FFMA peak, while this GEMM's operands are few bytes per product: on the
// tensor cores an RGB stem's wgrad is bound by reading its tensors once
// (docs/kernels.md, "Few channels on tensor cores").
//
// GEMM view per group: M = Cout/groups (64-channel tiles), N = Cin/groups *
// KH * KW (the (input channel, tap) columns), K = N*Ho*Wo output pixels, split
// into slices of output tiles over blocks and summed in slice order.
//
// Per stage (one output row x 64 columns of one image) a block copies the
// grad_output tile [channel][pixel] and the group's input halo into a raw
// buffer while the previous stage computes; the threads then round it to
// TF32 in place, or split it into a big part (in place) and a small part
// (its own buffer), once per stage instead of once per warp that reads it.
// A, grad_output, comes by ldmatrix (a 16 x 8 fragment per instruction);
// B, the input at each column's (channel, tap) offset and each pixel's
// column times the stride, by 4-byte shared loads: a gather no 16-byte
// layout serves.
//
// A warp owns all 64 rows of M and up to kWarpN n8 tiles; where the group
// has fewer columns than the warps, warps split the stage's k8 steps too,
// and their sums meet in warp order at the end. Accuracy: the tensor cores
// truncate as they accumulate, so IEEE mode restarts a temporary every
// kStepsPerTemp k8 steps and adds it to the accumulators with FADDs.
//
// Pixels past the output's right edge have zero grad_output, but the input
// they reach may hold Inf or NaN that no real product meets: B is zeroed
// there (0 * Inf would be NaN).
//
// The kernel runs over named pieces: block_part and warp_share (the
// block's and the warp's share of the GEMM), StageWalk (the stage cursor),
// StageCopies (the producer: a stage's copies), tensor_core_operands
// (few_channels.cuh: rounding or tf32x3 split, once per stage), mma_steps
// (one stage on mma.sync) or wgrad_tc::run_stage_sm90 (on wgmma),
// reduce_warps (warps that split the k8 steps meet) and store_partials /
// store_partials_sm90 (the epilogue).

#include <algorithm>

#include "../../plan.h"
#include "../mma.cuh"
#include "../split_reduce.cuh"
#include "../tensor_map.h"
#include "few_channels.cuh"
#include "few_channels.h"
#include "wgrad_sm90.cuh"

namespace conv2d_ext {
namespace cuda {
namespace {

namespace fc = conv2d_ext::few_channels;
using few_channels::HaloCols;

constexpr int kBlock = fc::kThreads;
constexpr int kWarps = kBlock / 32;
constexpr int kWarpN = fc::kWgradTcWarpN;
constexpr int kMTiles = fc::kWgradTcCo / 16;
constexpr int kStepsPerTemp = 2;                           // 3xTF32: six products per temporary
constexpr int kGoFloats = fc::kWgradTcCo * fc::kTileCols;  // a stage's grad_output tile

// A block's share of its group's GEMM: blockIdx.x -> (group, 64-channel
// tile of M, part of N's n8 tiles).
struct BlockPart {
  int g, co0, co_here;            // group; the tile's first channel and channels in it
  int part, part_n0, part_tiles;  // the part; its first n8 tile and how many
};

__device__ __forceinline__ BlockPart block_part(int cout_g, int nt_total, int n_parts) {
  const int nt_per_part = (nt_total + n_parts - 1) / n_parts;
  const int co_tiles = (cout_g + fc::kWgradTcCo - 1) / fc::kWgradTcCo;
  BlockPart b;
  b.part = blockIdx.x % n_parts;
  b.co0 = (blockIdx.x / n_parts % co_tiles) * fc::kWgradTcCo;
  b.g = blockIdx.x / n_parts / co_tiles;
  b.part_n0 = b.part * nt_per_part;
  b.part_tiles = min(nt_per_part, nt_total - b.part_n0);
  b.co_here = min(fc::kWgradTcCo, cout_g - b.co0);
  return b;
}

// How a block's n8 tiles and a stage's k8 steps fall to its warps.
struct WarpShare {
  int n0, nt;  // first n8 tile (in the block's part) and how many, at most kWarpN
  int k, kw;   // this warp takes the stage's k8 steps k, k + kw, ...
};

__device__ __forceinline__ WarpShare warp_share(int part_tiles, int warp) {
  int groups = (part_tiles + kWarpN - 1) / kWarpN;
  // Whole warps per group: 3 groups spread over 4 (kWarps / 2).
  while (kWarps % groups != 0) ++groups;
  const int kw = kWarps / groups, grp = warp / kw;
  WarpShare s;
  s.n0 = grp * part_tiles / groups;
  s.nt = (grp + 1) * part_tiles / groups - s.n0;
  s.k = warp % kw;
  s.kw = kw;
  return s;
}

// Where the group's GEMM columns (wgmma's rows), its (input channel, tap)
// pairs, read a stage buffer: column nidx as a byte offset from the halo
// at the stage's first pixel. Columns past the group's last read the last
// one's (their sums are never stored).
struct Columns {
  const ConvParams& p;
  int n_total, taps, KW, plane, pitch;

  __device__ __forceinline__ uint32_t offset(int nidx) const {
    nidx = min(nidx, n_total - 1);
    const int ci = nidx / taps, tap = nidx - ci * taps;
    return 4u * (kGoFloats + ci * plane + (tap / KW) * p.dilation_h * pitch +
                 (tap % KW) * p.dilation_w);
  }
};

// grad_output's tile [channel][64 pixels] as two halves of 32 pixels (128
// bytes a row) in the 128-byte swizzle: 16-byte chunk c of row r at chunk
// c ^ (r % 8). The tensor-copy engine writes it so, in two boxes; ldmatrix's
// eight rows of a matrix then fall in eight different bank groups.
__device__ __forceinline__ int go_swizzled(int row, int col) {
  return (col >> 5) * (fc::kWgradTcCo * 32) + row * 32 +
         ((((col & 31) >> 2) ^ (row & 7)) << 2) + (col & 3);
}

// Stage s is (image n, output row oh, columns from ow0), ow0 fastest. A
// cursor steps by one stage with carries: dividing out every stage's
// origin would put two dependent integer divisions in each stage.
struct Origin {
  int n, oh, ow0;
};
struct StageWalk {
  int Ho, Wo, tiles_w, ptiles;

  __device__ __forceinline__ Origin at(int s) const {
    const int n = s / ptiles, pt = s - n * ptiles, oh = pt / tiles_w;
    return Origin{n, oh, (pt - oh * tiles_w) * fc::kTileCols};
  }
  __device__ __forceinline__ void next(Origin& o) const {
    if ((o.ow0 += fc::kTileCols) >= Wo) {
      o.ow0 = 0;
      if (++o.oh == Ho) {
        o.oh = 0;
        ++o.n;
      }
    }
  }
};

// The producer: stage `o`'s grad_output tile (go_swizzled) and the group's
// input halo ([ci][halo_rows][pitch]) into raw buffer `b` at `dst`, by the
// tensor-copy engine (thread 0; the copies complete on the ring's barrier
// b) or by cp.async (every thread; the caller commits).
struct StageCopies {
  const CUtensorMap& x_map;
  const CUtensorMap& go_map;
  const ConvParams& p;
  const float* grad_out;
  const float* x;
  const few_channels::CopyRing<2>& ring;
  const BlockPart& bp;
  bool vec, vec_go, tma;
  int cin_g, cout_g, halo_rows, halo_cols, pitch, plane;
  uint32_t stage_bytes;

  __device__ __forceinline__ void start(const Origin& o, float* dst, int b) const {
    const auto [n, oh, ow0] = o;
    const int H = p.in_h, W = p.in_w, Ho = p.out_h, Wo = p.out_w;
    const int sh = p.stride_h, sw = p.stride_w;
    const int g = bp.g, co0 = bp.co0;
    const HaloCols hc = few_channels::halo_cols(ow0 * sw - p.pad_w, vec);
    if (tma) {
      if (threadIdx.x == 0) {
        mbarrier_arrive_expect_tx(&ring.barrier[b], stage_bytes);
        tma_load_4d(dst, &go_map, ow0, oh, g * cout_g + co0, n, &ring.barrier[b]);
        tma_load_4d(dst + kGoFloats / 2, &go_map, ow0 + 32, oh, g * cout_g + co0, n,
                    &ring.barrier[b]);
        tma_load_4d(dst + kGoFloats, &x_map, hc.first - hc.lead, oh * sh - p.pad_h, g * cin_g, n,
                    &ring.barrier[b]);
      }
      return;
    }
    const float* go_row =
        grad_out + plane_offset(n, p.out_channels, g * cout_g + co0, Ho * Wo) + oh * Wo + ow0;
    const int64_t go_plane = int64_t(Ho) * Wo;
    if (vec_go) {  // 16-byte chunks: whole inside or outside the row (Wo % 4 == 0)
      for (int e = threadIdx.x; e < fc::kWgradTcCo * fc::kTileCols / 4; e += kBlock) {
        const int row = e >> 4, col = (e & 15) * 4;
        const bool inside = row < bp.co_here && ow0 + col < Wo;
        cp_async_16_or_zero(dst + go_swizzled(row, col),
                            inside ? go_row + row * go_plane + col : grad_out, inside);
      }
    } else {
      for (int e = threadIdx.x; e < fc::kWgradTcCo * fc::kTileCols; e += kBlock) {
        const int row = e >> 6, col = e & 63;
        const bool inside = row < bp.co_here && ow0 + col < Wo;
        cp_async_4(dst + go_swizzled(row, col), inside ? go_row + row * go_plane + col : grad_out,
                   inside);
      }
    }
    few_channels::stage_halo(dst + kGoFloats, x + plane_offset(n, p.in_channels, g * cin_g, H * W),
                             cin_g, H, W, oh * sh - p.pad_h, halo_rows, hc, halo_cols, pitch,
                             plane, vec);
  }
};

// 3xTF32: a temporary's sums into the accumulators, and the temporary
// restarted.
__device__ __forceinline__ void add_temporary(float (&acc)[kMTiles][kWarpN][4],
                                              float (&tmp)[kMTiles][kWarpN][4]) {
#pragma unroll
  for (int i = 0; i < kMTiles; ++i)
#pragma unroll
    for (int j = 0; j < kWarpN; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        acc[i][j][r] += tmp[i][j][r];
        tmp[i][j][r] = 0.f;
      }
}

// One stage on mma.sync: the warp's k8 steps (of `steps`) for its NT n8
// tiles, a compile-time count (no branch per n8 tile, and the products of
// a step issue as independent groups). `boff`: B's column of each n8 tile
// for this lane (Columns::offset); `base`: the stage's buffer (grad_output
// first); `xbase`: its halo at the stage's first pixel; `small_bytes`: from
// a big part to its small part; `cols`: the stage's pixels inside the
// output. The lane's ldmatrix row is derived here from threadIdx.x: lanes
// 8i..8i+7 give the rows of matrix i (rows 0-7, 8-15 at k 0-3, then at k
// 4-7), and a row's chunk is XORed with row % 8 = lane % 8.
template <bool kTf32x3, int NT>
__device__ __forceinline__ void mma_steps(
    float (&acc)[kMTiles][kWarpN][4], float (&tmp)[kTf32x3 ? kMTiles : 1][kTf32x3 ? kWarpN : 1][4],
    int& steps_in_temp, const uint32_t (&boff)[kWarpN], const WarpShare& ws, int steps,
    uint32_t base, uint32_t xbase, uint32_t small_bytes, int sw, int cols) {
  const int lane = threadIdx.x % 32, tq = lane & 3, mat = lane >> 3;
  const uint32_t arow = 4u * 32 * ((mat & 1) * 8 + (lane & 7));
  for (int t = ws.k; t < steps; t += ws.kw) {
    uint32_t bb[NT][2], bs[NT][2];
    const uint32_t xk = xbase + 4u * (t * 8 + tq) * sw;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      bb[j][0] = __float_as_uint(lds_f32(xk + boff[j]));
      bb[j][1] = __float_as_uint(lds_f32(xk + boff[j] + 16u * sw));
      if constexpr (kTf32x3) {
        bs[j][0] = __float_as_uint(lds_f32(xk + boff[j] + small_bytes));
        bs[j][1] = __float_as_uint(lds_f32(xk + boff[j] + 16u * sw + small_bytes));
      }
    }
    const int lim = cols - t * 8;  // B rows (pixels) at or past it are zero
    if (lim < 8) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        if (tq >= lim) bb[j][0] = bs[j][0] = 0u;
        if (tq + 4 >= lim) bb[j][1] = bs[j][1] = 0u;
      }
    }
    // All 64 rows of M, including channels past the group's end (their
    // rows are never written): no branch per m16 tile.
    // This step's 8 pixels: half t / 4, chunk 2 * (t % 4) + mat / 2.
    const uint32_t a_step = (t >> 2) * (4u * kGoFloats / 2) + arow +
                            ((((t & 3) * 2 + (mat >> 1)) ^ (lane & 7)) << 4);
    uint32_t ab[kMTiles][4];
    [[maybe_unused]] uint32_t as[kTf32x3 ? kMTiles : 1][4];
#pragma unroll
    for (int i = 0; i < kMTiles; ++i) {
      const uint32_t a_addr = base + a_step + i * (4u * 16 * 32);
      ldmatrix_x4(ab[i], a_addr);
      if constexpr (kTf32x3) ldmatrix_x4(as[i], a_addr + small_bytes);
    }
    if constexpr (kTf32x3) {
      mma_3xtf32</*kFresh=*/false, NT>(tmp, ab, as, bb, bs);
      if (++steps_in_temp == kStepsPerTemp) {
        add_temporary(acc, tmp);
        steps_in_temp = 0;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kMTiles; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) mma_tf32(acc[i][j], ab[i], bb[j]);
    }
  }
}

// Warps that split the k8 steps meet in warp order through shared memory
// (`smem`, free once every warp is past the last stage). Returns whether
// this warp stores the sums.
__device__ __forceinline__ bool reduce_warps(float (&acc)[kMTiles][kWarpN][4], float* smem,
                                             const WarpShare& ws, int warp, int lane) {
  if (ws.kw > 1) {
    __syncthreads();  // the last stage's operands are consumed
    float* s_red = smem + warp * (kMTiles * kWarpN * 4 * 32);
#pragma unroll
    for (int i = 0; i < kMTiles; ++i)
#pragma unroll
      for (int j = 0; j < kWarpN; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) s_red[((i * kWarpN + j) * 4 + r) * 32 + lane] = acc[i][j][r];
    __syncthreads();
    if (ws.k != 0) return false;
    for (int q = 1; q < ws.kw; ++q) {
      const float* o = s_red + q * (kMTiles * kWarpN * 4 * 32);
#pragma unroll
      for (int i = 0; i < kMTiles; ++i)
#pragma unroll
        for (int j = 0; j < kWarpN; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) acc[i][j][r] += o[((i * kWarpN + j) * 4 + r) * 32 + lane];
    }
  }
  return true;
}

// The mma.sync epilogue: the warp's n8 tiles into this slice's row of the
// partial sums ([co][ci][kh][kw] within the group is [co][nidx]).
__device__ __forceinline__ void store_partials(const float (&acc)[kMTiles][kWarpN][4],
                                               float* partial, const ConvParams& p,
                                               const BlockPart& bp, const WarpShare& ws,
                                               int cout_g, int n_total, int gq, int tq) {
  if (ws.nt == 0) return;
  float* out = partial + int64_t(blockIdx.y) * p.weight_numel();
#pragma unroll
  for (int i = 0; i < kMTiles; ++i) {
#pragma unroll
    for (int j = 0; j < kWarpN; ++j) {
      if (j >= ws.nt) continue;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int co = bp.co0 + i * 16 + gq + (r >= 2 ? 8 : 0);
        const int nidx = (bp.part_n0 + ws.n0 + j) * 8 + 2 * tq + (r & 1);
        if (co < cout_g && nidx < n_total) {
          out[(int64_t(bp.g) * cout_g + co) * n_total + nidx] = acc[i][j][r];
        }
      }
    }
  }
}

// wgmma: this lane's A rows in each set of accumulators (rows lane_row and
// lane_row + 8 of the set's m64 tile), as Columns offsets.
__device__ __forceinline__ void wgmma_rows(uint32_t (&aoff)[2][2], const Columns& columns,
                                           const BlockPart& bp, const wgrad_tc::Sm90Tiles& wt,
                                           int lane_row) {
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = (bp.part * wgrad_tc::kMaxTiles + wt.tile[t]) * 64 + lane_row + 8 * h;
      aoff[t][h] = columns.offset(row);
    }
}

// The wgmma epilogue: the sums of a tile both warpgroups hold meet in
// warpgroup order through `smem`; each tile is then written by one
// warpgroup (`wg`). Accumulator (j, r): the tile's row lane_row (+ 8 for
// r >= 2), channel 8j + 2tq (+ 1 for odd r).
__device__ __forceinline__ void store_partials_sm90(float (&wacc)[2][8][4],
                                                    const wgrad_tc::Sm90Tiles& wt, int w_tiles,
                                                    float* smem, float* partial,
                                                    const ConvParams& p, const BlockPart& bp,
                                                    int cout_g, int n_total, int wg, int lane_row,
                                                    int tq) {
  __syncthreads();  // the last stage's operands are consumed
  const int t128 = threadIdx.x % 128;
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    if (t == 1 && w_tiles != 3) break;
    if (wt.shared[t]) {
      if (wg == 1) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) smem[(j * 4 + r) * 128 + t128] = wacc[t][j][r];
      }
      __syncthreads();
      if (wg == 0) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) wacc[t][j][r] += smem[(j * 4 + r) * 128 + t128];
      }
      __syncthreads();  // before the next tile's sums reuse the memory
      if (wg == 1) continue;
    }
    float* out = partial + int64_t(blockIdx.y) * p.weight_numel();
    const int row0 = (bp.part * wgrad_tc::kMaxTiles + wt.tile[t]) * 64 + lane_row;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int co = 8 * j + 2 * tq + (r & 1), nidx = row0 + (r >= 2 ? 8 : 0);
        if (co < bp.co_here && nidx < n_total) {
          out[(int64_t(bp.g) * cout_g + bp.co0 + co) * n_total + nidx] = wacc[t][j][r];
        }
      }
  }
}

// kSm90: Hopper's warpgroup MMA in 3xTF32 (sm_90a code only; see
// few_channels/wgrad_sm90.cuh). TF32 stays on mma.sync, which runs two
// blocks an SM (docs/kernels.md, "Few channels on tensor cores").
//
// The pieces' arguments are chosen for the code they compile to: values
// derived from the lane (warp / 4, the ldmatrix row) come from the kernel
// or from threadIdx.x, not from signed parameters, and the mma.sync
// stage's n8-tile dispatch is a lambda here, after the wgmma stage's
// `continue`; other forms change the instruction order.
template <bool kTf32x3, bool kSm90>
__global__ void __launch_bounds__(kBlock, kTf32x3 ? 1 : 2)
    wgrad_tc_kernel(const __grid_constant__ CUtensorMap x_map,
                    const __grid_constant__ CUtensorMap go_map, const ConvParams p,
                    const float* __restrict__ grad_out, const float* __restrict__ x,
                    float* __restrict__ partial, bool vec, bool vec_go, bool tma, int halo_rows,
                    int pitch, int n_parts, int stages_per_slice) {
  static_assert(kTf32x3 || !kSm90, "the wgmma stage is 3xTF32 only");
  extern __shared__ float4 smem4[];
  __shared__ uint64_t staged[2];
  // The swizzle's atoms are 1024-byte aligned (the launch adds the slack).
  float* const smem = reinterpret_cast<float*>(smem4) +
                      ((1024 - (smem_addr(smem4) & 1023)) & 1023) / 4;
  const int cin_g = p.in_channels_per_group(), cout_g = p.out_channels_per_group();
  const int KW = p.kernel_w, taps = p.kernel_h * KW;
  const int Ho = p.out_h, Wo = p.out_w, sw = p.stride_w;
  const int n_total = cin_g * taps;
  const BlockPart bp = block_part(cout_g, (n_total + 7) / 8, n_parts);

  // Buffers (floats): two raw stages, each grad_output (go_swizzled) then
  // the halo [ci][halo_rows][pitch]; 3xTF32 adds one of small parts.
  const int plane = halo_rows * pitch;
  const int buf_floats = fc::wgrad_tc_buffer_floats(cin_g, plane);
  auto buffer = [&](int b) { return smem + b * buf_floats; };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gq = lane >> 2, tq = lane & 3;
  const WarpShare ws = warp_share(bp.part_tiles, warp);
  const Columns columns{p, n_total, taps, KW, plane, pitch};
  uint32_t boff[kWarpN];  // B: the column of each of the warp's n8 tiles for this lane
#pragma unroll
  for (int j = 0; j < kWarpN; ++j) boff[j] = columns.offset((bp.part_n0 + ws.n0 + j) * 8 + gq);

  float acc[kMTiles][kWarpN][4];
  float tmp[kTf32x3 ? kMTiles : 1][kTf32x3 ? kWarpN : 1][4];
  zero_fragments(acc);
  zero_fragments(tmp);

  // wgmma: the block's m64 tiles of rows (kMaxTiles a part) and, per set of
  // accumulators, this lane's A rows.
  [[maybe_unused]] const int w_tiles =
      min(wgrad_tc::kMaxTiles, (n_total + 63) / 64 - bp.part * wgrad_tc::kMaxTiles);
  [[maybe_unused]] const wgrad_tc::Sm90Tiles wt = wgrad_tc::wgmma_tiles(w_tiles, warp / 4);
  [[maybe_unused]] uint32_t aoff[2][2];
  [[maybe_unused]] float wacc[kSm90 ? 2 : 1][8][4], wtmp[kSm90 ? 2 : 1][8][4];
  if constexpr (kSm90) {
    wgmma_rows(aoff, columns, bp, wt, 16 * (warp % 4) + gq);
    zero_fragments(wacc);
  }

  // This slice's stages; stage s + 1's copies fly while stage s computes.
  const int tiles_w = (Wo + fc::kTileCols - 1) / fc::kTileCols;
  const StageWalk walk{Ho, Wo, tiles_w, Ho * tiles_w};
  const int total = p.batch * walk.ptiles;
  const int first = blockIdx.y * stages_per_slice;
  const int last = min(first + stages_per_slice, total);
  const int halo_cols = (fc::kTileCols - 1) * sw + (KW - 1) * p.dilation_w + 1;
  few_channels::CopyRing<2> ring(staged, tma);
  const StageCopies copies{x_map, go_map, p,     grad_out,  x,     ring,  bp, vec,
                           vec_go, tma,   cin_g, cout_g,    halo_rows, halo_cols,
                           pitch, plane,  4u * (kGoFloats + cin_g * plane)};

  Origin ahead = walk.at(first), cur = ahead;
  if (first < last) copies.start(ahead, buffer(0), 0);
  cp_async_commit();
  int steps_in_temp = 0;
  for (int s = first; s < last; ++s, walk.next(cur)) {
    const int b = (s - first) & 1;
    if (tma) {
      ring.wait(b);
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // stage s has landed; every warp is done with stage s - 1
    walk.next(ahead);
    if (s + 1 < last) copies.start(ahead, buffer(b ^ 1), b ^ 1);  // flies under this stage's work
    cp_async_commit();
    // Round (TF32) or split (3xTF32) the stage in place, once per block.
    // Small parts are left to the tensor cores' truncation: two
    // instructions fewer (mma.cuh has the error bounds). wgmma reads
    // grad_output where the threads stored it: fenced as for the
    // tensor-copy engine.
    float* const buf = buffer(b);
    const uint32_t small_bytes = 4u * (2 - b) * buf_floats;  // big -> its small part
    few_channels::tensor_core_operands<kTf32x3, few_channels::OperandLayout::kApart,
                                       /*kRoundSmall=*/false,
                                       /*kBatch=*/kTf32x3 ? 4 : 1>(
        reinterpret_cast<float4*>(buf), reinterpret_cast<float4*>(buffer(2)),
        buf_floats / 4, tma || kSm90);
    const int ow0 = cur.ow0;
    const int cols = min(fc::kTileCols, Wo - ow0);
    const int steps = (cols + 7) / 8;
    const uint32_t base = smem_addr(buf);
    const uint32_t xbase = base + 4u * few_channels::halo_cols(ow0 * sw - p.pad_w, vec).lead;
    if constexpr (kSm90) {
      wgrad_tc::run_stage_sm90(w_tiles, wacc, wtmp, aoff, xbase, base, small_bytes, sw, cols);
      continue;
    }
    auto steps_of = [&](auto nt) {
      mma_steps<kTf32x3, decltype(nt)::value>(acc, tmp, steps_in_temp, boff, ws, steps, base,
                                              xbase, small_bytes, sw, cols);
    };
    switch (ws.nt) {
      case 1: steps_of(Int<1>{}); break;
      case 2: steps_of(Int<2>{}); break;
      default: steps_of(Int<kWarpN>{}); break;
    }
  }
  if constexpr (kSm90) {
    store_partials_sm90(wacc, wt, w_tiles, smem, partial, p, bp, cout_g, n_total, warp / 4,
                        16 * (warp % 4) + gq, tq);
    return;
  }
  if constexpr (kTf32x3) add_temporary(acc, tmp);
  if (!reduce_warps(acc, smem, ws, warp, lane)) return;
  store_partials(acc, partial, p, bp, ws, cout_g, n_total, gq, tq);
}

}  // namespace

void launch_wgrad_few_channels_tc(const ConvParams& p, const at::TensorBase& grad_out,
                                  const at::TensorBase& x, at::TensorBase& grad_w, MathMode math) {
  const bool tf32x3 = math == MathMode::kIEEE;
  TORCH_CHECK(fc::wgrad_tc_fits(p, tf32x3),
              "conv2d_ext: internal error: few-channel tensor-core wgrad does not fit");
  const fc::Halo h = fc::wgrad_tc_halo(p);
  const int64_t nt_total = ceil_div(p.in_channels_per_group() * p.kernel_h * p.kernel_w, 8);
  const int n_parts = static_cast<int>(ceil_div(nt_total, int64_t(kWarpN) * kWarps));
  const int64_t co_tiles = ceil_div(p.out_channels_per_group(), fc::kWgradTcCo);
  const int64_t blocks_x = p.groups * co_tiles * n_parts;
  const int64_t stages = p.batch * p.out_h * ceil_div(p.out_w, fc::kTileCols);
  TORCH_CHECK(blocks_x < (int64_t(1) << 31) && stages < (int64_t(1) << 31),
              "conv2d_ext: problem too large for the few-channel wgrad");
  const fc::WgradTcVariant v =
      fc::choose_wgrad_tc_variant(tf32x3, few_channels_wgrad_sm90(current_sm()));
  const few_channels::Split sp = few_channels::split_stages(
      blocks_x, stages, tf32x3 ? 1 : 2, grad_w, p.weight_numel());
  const size_t smem = static_cast<size_t>(fc::wgrad_tc_smem_bytes(p, tf32x3));
  const bool vec = few_channels::can_vectorise(x.data_ptr(), p.in_w);
  const bool vec_go = few_channels::can_vectorise(grad_out.data_ptr(), p.out_w);
  // On Hopper, the tensor-copy engine stages both (rows of a multiple of 4
  // floats, as for 16-byte copies).
  const bool tma = vec_go && few_channels::tma_stages(vec, h);
  CUtensorMap x_map{}, go_map{};  // not read without tma
  if (tma) {
    x_map = nchw_tensor_map(x, static_cast<uint32_t>(h.pitch), static_cast<uint32_t>(h.rows),
                            static_cast<uint32_t>(p.in_channels_per_group()), 1);
    go_map = nchw_tensor_map(grad_out, 32, 1, fc::kWgradTcCo, 1, /*swizzle_128b=*/true);
  }
  auto kernel = v.sm90     ? wgrad_tc_kernel<true, true>
                : v.tf32x3 ? wgrad_tc_kernel<true, false>
                           : wgrad_tc_kernel<false, false>;
  ensure_dynamic_smem(kernel, smem);
  kernel<<<dim3(blocks_x, sp.slices), kBlock, smem, current_stream()>>>(
      x_map, go_map, p, grad_out.data_ptr<float>(), x.data_ptr<float>(),
      sp.partial.data_ptr<float>(), vec, vec_go, tma, h.rows, h.pitch, n_parts, sp.per_slice);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (sp.slices > 1) reduce_splits<float>(sp.partial, grad_w, p.weight_numel(), sp.slices);
}

}  // namespace cuda
}  // namespace conv2d_ext
