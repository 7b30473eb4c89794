// The flat sm_90 forward's kernel and the launch of one kernel size (the
// design: fprop_flat.cu). Included only by the instantiation files, one per
// kernel size (instantiations/fprop_flat_*.cu).
#pragma once

#include <cuda.h>

#include <type_traits>

#include "../common.cuh"
#include "../kernel_sizes.cuh"
#include "../mma.cuh"
#include "config.h"
#include "fprop_flat.h"

namespace conv2d_ext {
namespace cuda {
namespace {

namespace cfg = igemm_fprop_sm90_flat;

// The helpers below hold references to the kernel's values, as lambda
// captures do, and the kernel keeps its tap cursor and a few short lambdas:
// with copies, or with those as structs or functions, nvcc emits the loops'
// register moves in another order and the SASS of some instantiations
// changes.

// Shared memory (see the kernel for its layout) and the copies' barriers:
// the TMA box of the halo, each weight stage buffer.
extern __shared__ __align__(128) float smem[];
__shared__ uint64_t halo_full, weights_full[2];

constexpr int kFrags = cfg::kPositions / 8;  // n8 fragments of an item's positions

// A work item: output tile (oh0, ow0) of channel tile gy (group and
// output-channel tile) of image n; (ih0, iw0) is its halo's first pixel.
struct Item {
  bool valid;
  int gy, n, oh0, ow0, ih0, iw0;
};

// Work items, channel tile fastest (the tiles of one halo run side by side
// and share it in L2), then output tile, then image; fewer than 2^31 (the
// plan checks). A block takes items blockIdx.x, + gridDim.x, ...; `local`
// counts them. Decoded once per item: thread 0 starts copies between a
// stage's barrier and the next stage's wgmmas, which wait for its warp.
struct ItemWalk {
  const ConvParams& p;
  const cfg::Layout& L;
  const unsigned &channel_tiles, &tiles, &items;
  const int& dh;

  __device__ __forceinline__ Item at(int local) const {
    Item it;
    const unsigned i = blockIdx.x + unsigned(local) * gridDim.x;
    it.valid = i < items;
    const unsigned rest = i / channel_tiles;
    it.gy = static_cast<int>(i - rest * channel_tiles);
    const unsigned n = rest / tiles;
    const int tile = static_cast<int>(rest - n * tiles);
    it.n = static_cast<int>(n);
    const int tile_h = tile / L.tiles_w;
    it.ow0 = (tile - tile_h * L.tiles_w) * L.out_cols;
    it.oh0 = phase_row0(tile_h, L.rows, dh);  // rows oh0 + dh*r
    it.ih0 = it.oh0 - p.pad_h;
    it.iw0 = it.ow0 - p.pad_w;
    return it;
  }
};

// The current item and the two after it: copies run up to two stages
// ahead, two items on when an item has one stage.
struct ItemWindow {
  const Item &it, &next, &after;

  // The item `ahead` items on (0, 1 or 2).
  __device__ __forceinline__ Item ahead(int ahead) const {
    Item r = it;  // by value: selects, not an address into a stack frame
    if (ahead == 1) r = next;
    if (ahead == 2) r = after;
    return r;
  }
};

// Position `at` of an item of `per_item` stages or chunks counted from the
// current item's start: which item (`ahead`) and where in it.
__device__ __forceinline__ int position(int at, int per_item, int& ahead) {
  ahead = at >= per_item ? (at >= 2 * per_item ? 2 : 1) : 0;
  return at - ahead * per_item;
}

// First pixel of halo row r in the interleaved halo: with row shifts the
// rows are stored by phase (rows 2i + j at storage row j * plane_rows + i),
// so that the positions of one kernel row stay consecutive.
template <int kShifts>
__device__ __forceinline__ int halo_row_start(const cfg::Layout& L, const int& log2_pitch, int r) {
  return (kShifts == 1 ? r : (r & 1) * L.plane_rows + (r >> 1)) << log2_pitch;
}

__device__ __forceinline__ void init_barriers() {
  if (threadIdx.x == 0) {
    mbarrier_init(&halo_full, 1);
    mbarrier_init(&weights_full[0], 1);
    mbarrier_init(&weights_full[1], 1);
    fence_mbarrier_init();
  }
}

// The producer: the copies into shared memory (thread 0) and the halo's
// conversion into wgmma's layout (all threads).
//
// Stream positions: stage q is stage q % stages of item q / stages, in
// weight buffer q & 1, whose barrier phase then has parity (q >> 1) & 1;
// chunk c is chunk c % chunks of item c / chunks, in halo buffer c & 1, its
// box completing the box barrier's phase of parity c & 1. Positions past
// the last item start nothing.
template <bool kTf32x3, int kShifts, bool kRoundBig>
struct Producer {
  const CUtensorMap& x_map;
  const cfg::Layout& L;
  const float* __restrict__ const& w_frag;
  const int &cin_g, &log2_pitch, &pitch, &hp, &box_pixels, &box_cols;
  const int &halo_floats, &staging_floats, &stage_floats, &stages;

  __device__ __forceinline__ int weights_at(int buf) const {
    return staging_floats + buf * stage_floats;
  }
  __device__ __forceinline__ int halo_at(int buf) const {
    return staging_floats + 2 * stage_floats + buf * halo_floats;
  }
  // Item `it`'s stage `stage`, stream position q: one bulk copy.
  __device__ __forceinline__ void start_weights(const Item& it, int stage, int64_t q) const {
    if (!it.valid) return;
    const uint32_t bytes = 4 * stage_floats;
    const float* src = w_frag + (int64_t(it.gy) * stages + stage) * stage_floats;
    const int buf = static_cast<int>(q & 1);
    mbarrier_arrive_expect_tx(&weights_full[buf], bytes);
    bulk_copy_to_smem(smem + weights_at(buf), src, bytes, &weights_full[buf]);
  }
  // Item `it`'s chunk `chunk`: its TMA box, at the start of shared memory.
  __device__ __forceinline__ void start_box(const Item& it, int chunk) const {
    if (!it.valid) return;
    const int channel = (it.gy / L.co_tiles) * cin_g + chunk * 8 * L.ksteps;
    mbarrier_arrive_expect_tx(&halo_full, static_cast<uint32_t>(L.staging_bytes));
    tma_load_4d(smem, &x_map, it.iw0 & ~3, it.ih0, channel, it.n, &halo_full);
  }
  // Rounds chunk c's box to TF32 into its interleaved halo (3xTF32: splits
  // it into the big and small halos). A pixel is its 8 channels (two
  // planes): 4-byte loads of consecutive pixels across the warp
  // (conflict-free), then 16-byte stores. Channels past the group's, which
  // the box may read from the next group, become zeros.
  __device__ __forceinline__ void convert_halo(const Item& it, int chunk, int64_t c) const {
    if (!it.valid) return;
    // The lambdas below capture the kernel's values through these.
    const int &log2_pitch = this->log2_pitch, &pitch = this->pitch, &hp = this->hp,
              &box_pixels = this->box_pixels, &box_cols = this->box_cols, &cin_g = this->cin_g;
    const cfg::Layout& L = this->L;
    mbarrier_wait(&halo_full, static_cast<uint32_t>(c & 1));
    float4* dst = reinterpret_cast<float4*>(smem + halo_at(kTf32x3 ? 0 : static_cast<int>(c & 1)));
    float4* dst_small = reinterpret_cast<float4*>(smem + halo_at(1));
    const int c0 = chunk * 8 * L.ksteps;
    const int shift = it.iw0 & 3;
    const int channel_floats = L.halo_rows * box_cols;
    auto box_at = [&](int i) { return (i >> log2_pitch) * box_cols + (i & (pitch - 1)); };
    auto halo_pixel = [&](int i) {
      return kShifts == 1 ? i
                          : halo_row_start<kShifts>(L, log2_pitch, i >> log2_pitch) |
                                (i & (pitch - 1));
    };
#pragma unroll 1
    for (int pair = 0; pair < L.ksteps; ++pair) {
      bool ok[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) ok[e] = c0 + pair * 8 + e < cin_g;
      const float* src = smem + pair * 8 * channel_floats + shift;
      float4* out = dst + 2 * pair * hp;
      float4* out_small = dst_small + 2 * pair * hp;
      if constexpr (kTf32x3) {
        // 3xTF32 splits at a chunk's start, with the pipeline drained, so
        // its latency is exposed: rounds of kTf32x3Pixels pixels a thread
        // (i0 + u * kThreads), their 32 loads first, and per-element chains
        // free of predicates, so that the elements interleave. With a
        // compare per element for small's rounding (tf32_operand) and the
        // channel masks in predicates too, ptxas runs them one after
        // another on the one predicate register left.
        // `masked`: channels past the group's (a partial chunk); `tail`:
        // pixels past the box (loads clamped into it, stores skipped).
        constexpr int kPixels = cfg::kTf32x3Pixels;
        auto split_round = [&](auto masked, auto tail, int i0) {
          float v[kPixels][8];
#pragma unroll
          for (int u = 0; u < kPixels; ++u) {
            const int i = i0 + u * cfg::kThreads;
            const float* px = src + box_at(tail ? min(i, box_pixels - 1) : i);
#pragma unroll
            for (int e = 0; e < 8; ++e) v[u][e] = px[e * channel_floats];
          }
#pragma unroll
          for (int u = 0; u < kPixels; ++u) {
            const int i = i0 + u * cfg::kThreads;
            if (tail && i >= box_pixels) break;
            const int o = halo_pixel(i);
            uint32_t big[8], small[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              tf32_split_fma<kRoundBig>(!masked || ok[e] ? v[u][e] : 0.f, big[e], small[e]);
            }
            out[o] = make_float4(__uint_as_float(big[0]), __uint_as_float(big[1]),
                                 __uint_as_float(big[2]), __uint_as_float(big[3]));
            out[hp + o] = make_float4(__uint_as_float(big[4]), __uint_as_float(big[5]),
                                      __uint_as_float(big[6]), __uint_as_float(big[7]));
            out_small[o] = make_float4(__uint_as_float(small[0]), __uint_as_float(small[1]),
                                       __uint_as_float(small[2]), __uint_as_float(small[3]));
            out_small[hp + o] =
                make_float4(__uint_as_float(small[4]), __uint_as_float(small[5]),
                            __uint_as_float(small[6]), __uint_as_float(small[7]));
          }
        };
        constexpr int kStride = kPixels * cfg::kThreads;
        int i0 = threadIdx.x;
        if (ok[7]) {  // all 8 channels: the common case
#pragma unroll 1
          for (; i0 + (kPixels - 1) * cfg::kThreads < box_pixels; i0 += kStride) {
            split_round(std::false_type{}, std::false_type{}, i0);
          }
          if (i0 < box_pixels) split_round(std::false_type{}, std::true_type{}, i0);
        } else {
#pragma unroll 1
          for (; i0 < box_pixels; i0 += kStride) split_round(std::true_type{}, std::true_type{}, i0);
        }
      } else {
        // TF32 mode rounds under the wgmmas, next to the accumulators: a
        // pixel at a time.
#pragma unroll 1
        for (int i = threadIdx.x; i < box_pixels; i += cfg::kThreads) {
          const float* px = src + box_at(i);
          float r[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) r[e] = px[e * channel_floats];
#pragma unroll
          for (int e = 0; e < 8; ++e) r[e] = ok[e] ? __uint_as_float(tf32_operand(r[e])) : 0.f;
          const int o = halo_pixel(i);
          out[o] = make_float4(r[0], r[1], r[2], r[3]);
          out[hp + o] = make_float4(r[4], r[5], r[6], r[7]);
        }
      }
    }
  }

  // The stream's start: the first chunk's box and the first two stages'
  // weights; in TF32 mode also the first chunk rounded and the second
  // chunk's box started (3xTF32 splits each chunk at its start).
  __device__ __forceinline__ void prologue(const ItemWindow& w) const {
    if (threadIdx.x == 0) {
      int ahead;
      start_box(w.it, 0);
      start_weights(w.it, 0, 0);
      const int s1 = position(1, stages, ahead);
      start_weights(w.ahead(ahead), s1, 1);
    }
    if constexpr (!kTf32x3) {
      convert_halo(w.it, 0, 0);
      fence_proxy_async_smem();  // wgmma reads what the threads stored
      __syncthreads();
      if (threadIdx.x == 0) {  // the box is free again
        int ahead;
        const int c1 = position(1, L.chunks, ahead);
        start_box(w.ahead(ahead), c1);
      }
    }
  }
  // 3xTF32, a chunk's first stage (stream position c): its halo is split;
  // the previous stage's barrier saw every wgmma that read the old one
  // retire. Then the box is free and the next chunk starts copying.
  __device__ __forceinline__ void split_chunk(const ItemWindow& w, int chunk, int64_t c) const {
    convert_halo(w.it, chunk, c);
    fence_proxy_async_smem();  // wgmma reads what the threads stored
    __syncthreads();
    if (threadIdx.x == 0) {
      int ahead;
      const int chunk1 = position(chunk + 1, L.chunks, ahead);
      start_box(w.ahead(ahead), chunk1);
    }
  }
  // TF32, while the wgmmas of a chunk's first stage run: the next chunk (of
  // this item or the next) is rounded into the other halo buffer, whose
  // last reader (the previous chunk) is done; then the box is free and the
  // chunk after that starts copying, a chunk ahead of its use.
  __device__ __forceinline__ void round_next_chunk(const ItemWindow& w, int chunk,
                                                   int64_t c) const {
    int ahead;
    const int chunk1 = position(chunk + 1, L.chunks, ahead);
    convert_halo(w.ahead(ahead), chunk1, c + 1);
    __syncthreads();
    if (threadIdx.x == 0) {
      const int chunk2 = position(chunk + 2, L.chunks, ahead);
      start_box(w.ahead(ahead), chunk2);
    }
  }
  // Stage s (stream position q) is done everywhere: its weight buffer takes
  // the stage two on.
  __device__ __forceinline__ void refill_weights(const ItemWindow& w, int s, int64_t q) const {
    if (threadIdx.x == 0) {
      int ahead;
      const int s2 = position(s + 2, stages, ahead);
      start_weights(w.ahead(ahead), s2, q + 2);
    }
  }
};

__device__ __forceinline__ void zero_accumulators(float (&acc)[kFrags][4]) {
#pragma unroll
  for (int j = 0; j < kFrags; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
}

// TF32, the main loop's stage: its k8 steps, one m64n256k8 each with both
// operands from shared memory, issued back to back as one group (committed,
// not waited for). `next_step` moves the tap cursor (off, k).
template <typename NextStep>
__device__ __forceinline__ void issue_stage_tf32(float (&acc)[kFrags][4], NextStep& next_step,
                                                 const int& off, const int& k,
                                                 const uint32_t& w_addr, const uint32_t& halo_addr,
                                                 const uint32_t& plane_bytes,
                                                 const int& stage_steps) {
  wgmma_fence();
#pragma unroll 1
  for (int t = 0; t < stage_steps; ++t) {
    const uint64_t desc_a = wgmma_desc(w_addr + t * (4 * cfg::kStepFloats), 1024, 128);
    const uint64_t desc_b =
        wgmma_desc(halo_addr + 16 * off + 2 * k * plane_bytes, plane_bytes, 128);
    wgmma_m64n256k8_tf32_ss(acc, desc_a, desc_b, true);
    next_step();
  }
  wgmma_commit();
}

// 3xTF32: this lane's A elements of k8 step t (mma.sync m16n8k8 layout:
// rows grp and grp + 8 of the warp's 16, k tig and tig + 4; w_lane points
// at them in the stage's first step), split as loaded.
template <bool kRoundBig>
__device__ __forceinline__ void load_a_split(const float* w_lane, int t, uint32_t (&big)[4],
                                             uint32_t (&small)[4]) {
  const float* a_src = w_lane + t * cfg::kStepFloats;
  tf32_split<kRoundBig>(a_src[0], big[0], small[0]);
  tf32_split<kRoundBig>(a_src[32], big[1], small[1]);
  tf32_split<kRoundBig>(a_src[256], big[2], small[2]);
  tf32_split<kRoundBig>(a_src[288], big[3], small[3]);
}

// 3xTF32: a retired temporary of quarter `quarter` (positions 64 * quarter
// .. + 63) added to the accumulators.
__device__ __forceinline__ void add_quarter(float (&acc)[kFrags][4], float (&d)[8][4],
                                            int quarter) {
  wgmma_fence_operands(d);
#pragma unroll
  for (int f = 0; f < 8; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[8 * quarter + f][e] += d[f][e];
}

// 3xTF32, one step of the main loop: k8 steps t .. t + kSteps - 1 into one
// temporary per quarter (A in register sets 0 .. kSteps - 1). Quarter j
// (positions 64j .. 64j + 63) goes into tmp[j & 1], small products first,
// then big*big; each quarter's wait retires and adds the one before it, and
// the last is retired here: ptxas serialises all wgmmas when one may be in
// flight across a loop's back edge, or across a branch, while its
// temporary is read.
// The tap cursor (kw, off, k; next_row, next_step) advances over the steps.
// kRowGroups: a full group of a kernel size with one k8 step per tap and
// rows of whole groups (3x3, 5x9) is one run of consecutive taps of a row:
// its steps' positions follow from the group's first, and the row advances
// once a group, not in a chain of compares and branches per step.
template <int kSteps, bool kRowGroups, int kGroup, int kShifts, bool kRoundBig, typename NextRow,
          typename NextStep>
__device__ __forceinline__ void tf32x3_steps(NextRow& next_row, NextStep& next_step, int& kw,
                                             int& off, const int& k, const int& KW, const int& dw,
                                             float (&acc)[kFrags][4], float (&tmp)[2][8][4],
                                             uint32_t (&a_big)[kGroup][4],
                                             uint32_t (&a_small)[kGroup][4],
                                             const float* const& w_lane, int t,
                                             const uint32_t& halo_addr,
                                             const uint32_t& plane_bytes,
                                             const uint32_t& small_bytes) {
  uint32_t b_addr[kSteps];
  if constexpr (kRowGroups && kSteps == kGroup) {
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      load_a_split<kRoundBig>(w_lane, t + i, a_big[i], a_small[i]);
      b_addr[i] = halo_addr + 16 * (off + i * dw);
    }
    if (kw + kSteps == KW) {  // the row's last group
      next_row(kSteps - 1);
    } else {
      kw += kSteps;
      off += kSteps * dw;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      load_a_split<kRoundBig>(w_lane, t + i, a_big[i], a_small[i]);
      b_addr[i] = halo_addr + 16 * off + 2 * k * plane_bytes;
      next_step();
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    wgmma_fence();
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      const uint64_t big = wgmma_desc(b_addr[i] + 1024 * j, plane_bytes, 128);
      const uint64_t small = wgmma_desc(b_addr[i] + small_bytes + 1024 * j, plane_bytes, 128);
      wgmma_m64n64k8_tf32(tmp[j & 1], a_small[i], big, i > 0);
      wgmma_m64n64k8_tf32(tmp[j & 1], a_big[i], small, true);
    }
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      const uint64_t big = wgmma_desc(b_addr[i] + 1024 * j, plane_bytes, 128);
      wgmma_m64n64k8_tf32(tmp[j & 1], a_big[i], big, true);
    }
    wgmma_commit();
    if (j > 0) {
      wgmma_wait<1>();
      add_quarter(acc, tmp[(j - 1) & 1], j - 1);
    }
  }
  wgmma_wait<0>();
  add_quarter(acc, tmp[1], 3);
}

// The epilogue: row m of the tile is output channel co0 + m % (64 / S)
// (this lane holds rows m and m + 8) at row shift m / (64 / S); column o is
// position (o / P, o % P) of the flattened tile, output row S * (o / P) +
// shift. A lane's two accumulators of a row are neighbouring positions:
// stored as one 8-byte write where both are stored and aligned, so that the
// 4 lanes of a row fill a whole 32-byte sector.
template <int kShifts>
struct Epilogue {
  const ConvParams& p;
  const cfg::Layout& L;
  const float* __restrict__ const& bias;
  float* __restrict__ const& y;
  const int &Ho, &Wo, &cout_g, &dh, &log2_pitch, &pitch, &warp, &grp, &tig;

  // `prior`: segments before this one stored their sums there, this one
  // adds to them (each element is read by the thread that wrote it);
  // `last`: the bias goes in. The tile's epilogue is write_tile(false,
  // true); a segment's end writes with last false.
  __device__ __forceinline__ void write_tile(const Item& it, const float (&acc)[kFrags][4],
                                             bool prior, bool last) const {
    // The positions do not depend on the item; hidden behind an empty asm,
    // they are not hoisted out of the item loop, where they would stay live
    // (and spill) across the main loop.
    int col0 = 2 * tig;
    asm volatile("" : "+r"(col0));
    const int g = it.gy / L.co_tiles;
    constexpr int kCoPerTile = cfg::kCo / kShifts;  // a multiple of 16: warp-uniform shift
    const int co0 = (it.gy % L.co_tiles) * kCoPerTile;
    const int shift = warp * 16 / kCoPerTile;
    const int co_lo = co0 + warp * 16 % kCoPerTile + grp, co_hi = co_lo + 8;
    const bool lo_ok = co_lo < cout_g, hi_ok = co_hi < cout_g;
    const float bias_lo = last && bias != nullptr && lo_ok ? bias[g * cout_g + co_lo] : 0.f;
    const float bias_hi = last && bias != nullptr && hi_ok ? bias[g * cout_g + co_hi] : 0.f;
    const int64_t lo_plane =
        (int64_t(it.n) * p.out_channels + int64_t(g) * cout_g + co_lo) * Ho * Wo;
    float* y_lo = y + lo_plane;
    const int64_t hi_offset = int64_t(8) * Ho * Wo;
    // Parity of the element offset of (row 0, column 0) in both planes
    // (8 planes apart: same parity).
    const int parity = static_cast<int>(lo_plane & 1);
#pragma unroll
    for (int j = 0; j < kFrags; ++j) {
      const int o = j * 8 + col0;  // even; o + 1 in the same row
      const int c = o & (pitch - 1);
      const int oh = it.oh0 + dh * (kShifts * (o >> log2_pitch) + shift), ow = it.ow0 + c;
      if (oh >= Ho || c >= L.out_cols || ow >= Wo) continue;
      float* dst = y_lo + oh * Wo + ow;
      float v[4] = {acc[j][0], acc[j][1], acc[j][2], acc[j][3]};
      const bool pair = c + 1 < L.out_cols && ow + 1 < Wo;
      if (pair && ((parity + oh * Wo + ow) & 1) == 0) {
        if (prior) {
          if (lo_ok) {
            const float2 y0 = *reinterpret_cast<const float2*>(dst);
            v[0] += y0.x;
            v[1] += y0.y;
          }
          if (hi_ok) {
            const float2 y1 = *reinterpret_cast<const float2*>(dst + hi_offset);
            v[2] += y1.x;
            v[3] += y1.y;
          }
        }
        if (lo_ok) *reinterpret_cast<float2*>(dst) = make_float2(v[0] + bias_lo, v[1] + bias_lo);
        if (hi_ok) {
          *reinterpret_cast<float2*>(dst + hi_offset) = make_float2(v[2] + bias_hi, v[3] + bias_hi);
        }
      } else {
        if (prior) {
          if (lo_ok) v[0] += dst[0];
          if (hi_ok) v[2] += dst[hi_offset];
          if (pair) {
            if (lo_ok) v[1] += dst[1];
            if (hi_ok) v[3] += dst[hi_offset + 1];
          }
        }
        if (lo_ok) dst[0] = v[0] + bias_lo;
        if (hi_ok) dst[hi_offset] = v[2] + bias_hi;
        if (pair) {
          if (lo_ok) dst[1] = v[1] + bias_lo;
          if (hi_ok) dst[hi_offset + 1] = v[3] + bias_hi;
        }
      }
    }
  }
};

template <int KH_T, int KW_T, bool kTf32x3, int kGroup, int kShifts, bool kRoundBig>
__global__ void __launch_bounds__(cfg::kThreads, cfg::blocks_per_sm_cap(kTf32x3))
    fprop_flat_kernel(const __grid_constant__ CUtensorMap x_map, const ConvParams p,
                      const float* __restrict__ w_frag, const float* __restrict__ bias,
                      float* __restrict__ y, const cfg::Layout L) {
  static_assert(kShifts == 1 || (kShifts == 2 && KH_T != 1), "row shifts need 2+ kernel rows");
  const int tap_rows = static_or<KH_T>(p.kernel_h) + kShifts - 1;  // kernel rows of K
  const int KW = static_or<KW_T>(p.kernel_w);
  const int Ho = p.out_h, Wo = p.out_w;
  const int cin_g = p.in_channels_per_group();
  const int cout_g = p.out_channels_per_group();
  const int dh = p.dilation_h, dw = p.dilation_w;
  const int log2_pitch = L.log2_pitch, pitch = 1 << log2_pitch;
  const int hp = L.halo_pixels;
  const int box_pixels = L.halo_rows << log2_pitch;  // halo pixels from a TMA box
  // A box starts on a 16-byte column (TMA requires it), up to 3 columns
  // left of the halo's first, in rows of P + 4.
  const int box_cols = pitch + cfg::kTmaColumnSlack;

  // Shared memory, in floats: one TMA box, two weight stages, two
  // interleaved halos (planes of hp pixels x 4 channels): double-buffered
  // in TF32 mode, one halo's big and small parts in 3xTF32.
  const int planes = 2 * L.ksteps;
  const int plane_floats = 4 * hp;
  const int halo_floats = planes * plane_floats;
  const int staging_floats = static_cast<int>(L.staging_bytes / 4);
  const int step_floats = cfg::kStepFloats;
  const int stage_steps = L.rows_per_stage * KW * L.ksteps;
  const int stage_floats = stage_steps * step_floats;
  auto weights_at = [&](int buf) { return staging_floats + buf * stage_floats; };
  auto halo_at = [&](int buf) { return staging_floats + 2 * stage_floats + buf * halo_floats; };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int grp = lane >> 2, tig = lane & 3;
  const int stages_per_chunk = tap_rows / L.rows_per_stage;
  const int stages = L.chunks * stages_per_chunk;
  const unsigned channel_tiles = p.groups * L.co_tiles;
  const unsigned tiles = L.tiles_w * L.tiles_h;
  const unsigned items = channel_tiles * tiles * p.batch;
  const ItemWalk walk{p, L, channel_tiles, tiles, items, dh};

  init_barriers();
  // The halo's wrapped tail (past the box's rows) feeds only dropped
  // columns; zeros keep them finite.
  for (int plane = 0; plane < 2 * planes; ++plane) {
    float4* tail = reinterpret_cast<float4*>(smem + halo_at(0)) + plane * hp;
    for (int i = box_pixels + threadIdx.x; i < hp; i += cfg::kThreads) {
      tail[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  __syncthreads();
  Item it = walk.at(0), next = walk.at(1), after = walk.at(2);
  if (!it.valid) return;
  const ItemWindow window{it, next, after};
  const Producer<kTf32x3, kShifts, kRoundBig> prod{
      x_map, L, w_frag, cin_g, log2_pitch, pitch, hp, box_pixels, box_cols, halo_floats,
      staging_floats, stage_floats, stages};
  prod.prologue(window);

  float acc[kFrags][4];
  for (int64_t local = 0;; ++local) {
    if (local > 0) {
      it = next;
      next = after;
      after = walk.at(static_cast<int>(local) + 2);
    }
    if (!it.valid) break;
    zero_accumulators(acc);
    const Epilogue<kShifts> epi{p,      L,          bias,  y,    Ho,  Wo,
                                cout_g, dh, log2_pitch, pitch, warp, grp, tig};
    int segment_left = L.segment_stages;  // stages to the segment's end
    for (int s = 0; s < stages; ++s) {
      const int chunk = s / stages_per_chunk;
      const int within = s - chunk * stages_per_chunk;
      const int64_t q = local * stages + s;
      const int64_t c = local * L.chunks + chunk;
      const int wbuf = static_cast<int>(q & 1);
      if constexpr (kTf32x3) {
        if (within == 0) prod.split_chunk(window, chunk, c);
      }
      mbarrier_wait(&weights_full[wbuf], static_cast<uint32_t>((q >> 1) & 1));

      const uint32_t halo_addr =
          smem_addr(smem + halo_at(kTf32x3 ? 0 : static_cast<int>(c & 1)));
      const uint32_t plane_bytes = 4 * plane_floats;
      const uint32_t w_addr = smem_addr(smem + weights_at(wbuf));
      // The tap cursor. Step order: taps in (kernel row, kernel column)
      // order, k8 steps within a tap. `off` is the tap's first halo pixel:
      // kernel row kr reads from halo row kr on.
      int kr = within * L.rows_per_stage;
      int off = halo_row_start<kShifts>(L, log2_pitch, kr);
      int kw = 0, k = 0;
      // To the next row's first tap from tap KW - 1 - `back` of this row
      // (off).
      auto next_row = [&](int back) {
        kw = 0;
        if constexpr (kShifts == 1) {
          off += back * dw + pitch - (KW - 1) * dw;
        } else {
          off = halo_row_start<kShifts>(L, log2_pitch, ++kr);
        }
      };
      auto next_step = [&] {
        if (++k == L.ksteps) {
          k = 0;
          if (++kw == KW) {
            next_row(0);
          } else {
            off += dw;
          }
        }
      };
      if constexpr (kTf32x3) {
        // The stage in groups of kGroup k8 steps per temporary (their
        // products of a quarter go into one temporary before it is added:
        // a kGroup-th of the FADDs and waits of one step per temporary),
        // then the rest of the stage (a 5x9 or 3x3 stage is 9 steps: none
        // at three).
        const float* w_lane = smem + weights_at(wbuf) + 4 * (16 * warp + grp) + tig;
        const uint32_t small_bytes = 4 * halo_floats;  // the small halo, after the big
        uint32_t a_big[kGroup][4], a_small[kGroup][4];
        float tmp[2][8][4];
        constexpr bool kRowGroups =
            KH_T > 0 && KW_T > 0 && KW_T % kGroup == 0 && cfg::one_k8_step(KH_T, KW_T, kShifts);
        auto steps = [&](auto count, int t) {
          tf32x3_steps<decltype(count)::value, kRowGroups, kGroup, kShifts, kRoundBig>(
              next_row, next_step, kw, off, k, KW, dw, acc, tmp, a_big, a_small, w_lane, t,
              halo_addr, plane_bytes, small_bytes);
        };
        int t = 0;
#pragma unroll 1
        for (; t + kGroup <= stage_steps; t += kGroup) steps(Int<kGroup>{}, t);
        if constexpr (kGroup > 2) {
          if (stage_steps - t == 2) steps(Int<2>{}, t);
        }
        if (stage_steps - t == 1) steps(Int<1>{}, t);
        __syncthreads();
      } else {
        issue_stage_tf32(acc, next_step, off, k, w_addr, halo_addr, plane_bytes, stage_steps);
        if (within == 0) prod.round_next_chunk(window, chunk, c);
        wgmma_wait<0>();
        wgmma_fence_operands(acc);
        fence_proxy_async_smem();  // the next chunk's halo, for wgmma
        __syncthreads();
      }
      prod.refill_weights(window, s, q);
      if constexpr (kRoundBig) {
        // A segment ends: its sums go to the output, the chain restarts.
        if (L.segment_stages > 0 && --segment_left == 0 && s + 1 < stages) {
          epi.write_tile(it, acc, /*prior=*/s + 1 > L.segment_stages, /*last=*/false);
          zero_accumulators(acc);
          segment_left = L.segment_stages;
        }
      }
    }
    // The tile's epilogue; with earlier segments, their sums are added.
    epi.write_tile(it, acc, kRoundBig && L.segment_stages > 0 && stages > L.segment_stages, true);
  }
}

}  // namespace

// The variant the layout chose (TF32, or 3xTF32 with its temporaries'
// group and big's rounding) with the layout's row shifts.
template <int KH, int KW>
void launch_flat_kernel(const FlatLaunch& a) {
  auto launch = [&](auto kernel) {
    ensure_dynamic_smem(kernel, a.L.smem_bytes);
    kernel<<<a.grid, cfg::kThreads, a.L.smem_bytes, a.stream>>>(a.x_map, a.p, a.w_tiles, a.bias,
                                                                a.y, a.L);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  auto launch_shifted = [&](auto shifts) {
    constexpr int S = decltype(shifts)::value;
    if (!a.v.tf32x3) {
      launch(fprop_flat_kernel<KH, KW, false, 1, S, false>);
    } else if (a.v.group == 3 && a.v.round_big) {
      launch(fprop_flat_kernel<KH, KW, true, 3, S, true>);
    } else if (a.v.group == 3) {
      launch(fprop_flat_kernel<KH, KW, true, 3, S, false>);
    } else {
      launch(fprop_flat_kernel<KH, KW, true, 2, S, true>);
    }
  };
  TORCH_CHECK(KH == 0 || KW == 0 || !cfg::one_k8_step(KH, KW, a.L.shifts) || a.L.ksteps == 1,
              "conv2d_ext: internal error: a flat layout of several k8 steps per tap where the "
              "kernel assumes one");
  if constexpr (KH != 1) {
    if (a.L.shifts == 2) return launch_shifted(Int<2>{});
  }
  TORCH_CHECK(a.L.shifts == 1, "conv2d_ext: internal error: row shifts for one kernel row");
  launch_shifted(Int<1>{});
}

}  // namespace cuda
}  // namespace conv2d_ext
