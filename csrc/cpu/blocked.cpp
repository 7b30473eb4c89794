// The register-blocked float32 forward (blocked.h).
//
// GEMM view per image and group: M = output pixels, N = output channels,
// K = C*R*S. A task is one output row of one image and one block of kKB
// output channels; it walks the row kOW pixels at a time, holding kOW x
// kKB accumulators in vector registers, and for every (input channel, tap)
// adds broadcast(x) * w[k block] for each pixel: one vector load of packed
// weights serves kOW pixels, one broadcast serves kKB channels. The input
// is first copied zero-padded (rows padded by the kernel's reach, plus one
// block of slack at the end of each task's gathered rows), so the inner
// loops run without bounds checks; pixels past the row's end are computed
// on the slack and dropped.
//
// The micro-kernels are compiled once per instruction set (isa.h). Sums
// run in a fixed order per output, so results do not depend on the thread
// count.
#include "blocked.h"

#include "../options.h"
#include "isa.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace conv2d_ext {
namespace cpu {
namespace {

// kVL floats a vector, kNV vectors of output channels (kKB = kVL * kNV),
// kOW pixels: kOW * kNV accumulators, within the ISA's vector registers
// (32 for AVX-512, 16 for AVX2 and SSE) with room for the weights and a
// broadcast.
template <int kVL_, int kNV_, int kOW_>
struct Traits {
  static constexpr int kVL = kVL_, kNV = kNV_, kOW = kOW_, kKB = kVL_ * kNV_;
};
using Avx512 = Traits<16, 2, 12>;
using Avx2 = Traits<8, 2, 6>;
using Baseline = Traits<4, 2, 6>;
// A block of one vector of output channels, for groups of at most a
// vector's channels (a grouped layer's few channels a group would fill a
// quarter to a half of a two-vector block): twice the pixels, in the same
// registers.
template <typename T>
using OneVector = Traits<T::kVL, 1, 2 * T::kOW>;

// The weight of one group as [k block][C per group][R][S][kKB], zeros past
// the group's last output channel.
// WeightOrder::kDgrad: p is dgrad_as_fprop(layer) and w the layer's own
// weight [C][K per group][R][S] in p's channel names (p's inputs are the
// layer's outputs), packed transposed per group and flipped, as dgrad's
// forward reads it; no transposed copy is made.
std::vector<float> pack_weights(const ConvParams& p, const float* w, int kb,
                                WeightOrder order = WeightOrder::kFprop) {
  const int64_t cin = p.in_channels_per_group(), cout = p.out_channels_per_group();
  const int64_t taps = p.taps(), blocks = (cout + kb - 1) / kb;
  std::vector<float> packed(size_t(p.groups * blocks * cin * taps * kb), 0.f);
  at::parallel_for(0, p.groups * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t gb = begin; gb < end; ++gb) {
      const int64_t g = gb / blocks, k0 = (gb % blocks) * kb;
      const int64_t kn = std::min<int64_t>(kb, cout - k0);
      float* dst = packed.data() + gb * cin * taps * kb;
      if (order == WeightOrder::kFprop) {
        for (int64_t k = 0; k < kn; ++k) {
          const float* src = w + (g * cout + k0 + k) * cin * taps;
          for (int64_t e = 0; e < cin * taps; ++e) dst[e * kb + k] = src[e];
        }
        continue;
      }
      // Entry (c, t) of output k: the layer's w[c][k][taps - 1 - t].
      for (int64_t c = 0; c < cin; ++c) {
        const float* src = w + ((g * cin + c) * cout + k0) * taps;
        for (int64_t k = 0; k < kn; ++k)
          for (int64_t t = 0; t < taps; ++t)
            dst[(c * taps + t) * kb + k] = src[k * taps + taps - 1 - t];
      }
    }
  });
  return packed;
}

// kOW pixels from ow0 of an output row x the kKB output channels of a
// block (kvalid of them real), written to yrow (at the block's first
// channel). `rows`, wblock, bias_v: as row_block holds them.
// Entries of the reduction a run of sums takes before it is added to the
// total (pixel_block, narrow_row).
constexpr int64_t kRunEntries = 64;

struct PixelBlock {
  const ConvParams& p;
  const float *rows, *wblock, *bias_v;  // bias_v: the block's kKB biases (zeros past kvalid)
  float* yrow;
  int64_t wp, kvalid;
};

template <typename T, int kOW, bool kNhwc>
__attribute__((always_inline)) inline void pixel_block(const PixelBlock& b, int64_t ow0) {
  const ConvParams& p = b.p;
  const float *rows = b.rows, *wblock = b.wblock;
  const int64_t wp = b.wp;
  typedef float vec __attribute__((vector_size(T::kVL * sizeof(float))));
  typedef float vec_unaligned __attribute__((vector_size(T::kVL * sizeof(float)), aligned(4)));
  constexpr int kVL = T::kVL, kNV = T::kNV, kKB = T::kKB;
  const int64_t cin = p.in_channels_per_group(), taps = p.taps();
  const int64_t sw = p.stride_w, dw = p.dilation_w;
  // Strides in `rows` of an input channel, a kernel row and a pixel (a
  // channels_last pixel holds every group's channels).
  const int64_t channel_step = kNhwc ? 1 : p.kernel_h * wp;
  const int64_t tap_row_step = kNhwc ? wp * p.in_channels : wp;
  const int64_t pixel_step = kNhwc ? p.in_channels : 1;
  // The reduction in runs of about kRunEntries (channel, tap) entries, each
  // summed from zero and then added to the total: one chain over a long
  // reduction lost up to a few times PyTorch's accuracy.
  const int64_t run = std::max<int64_t>(1, kRunEntries / taps);  // channels a run
  alignas(64) float out[kOW][kKB] = {};  // the total
  vec acc[kOW][kNV];
  for (int j = 0; j < kOW; ++j)
    for (int v = 0; v < kNV; ++v)
      acc[j][v] = *reinterpret_cast<const vec_unaligned*>(b.bias_v + v * kVL);
  for (int64_t c0 = 0; c0 < cin; c0 += run) {
    for (int64_t c = c0; c < std::min(cin, c0 + run); ++c) {
      const float* wc = wblock + c * taps * kKB;
      for (int64_t r = 0; r < p.kernel_h; ++r) {
        const float* xr = rows + c * channel_step + r * tap_row_step + ow0 * sw * pixel_step;
        for (int64_t s = 0; s < p.kernel_w; ++s) {
          vec wv[kNV];
          const float* wt = wc + (r * p.kernel_w + s) * kKB;
          for (int v = 0; v < kNV; ++v)
            wv[v] = *reinterpret_cast<const vec_unaligned*>(wt + v * kVL);
          const float* xs = xr + s * dw * pixel_step;
#pragma GCC unroll 16
          for (int j = 0; j < kOW; ++j) {
            const float xv = xs[j * sw * pixel_step];
#pragma GCC unroll 4
            for (int v = 0; v < kNV; ++v) acc[j][v] += xv * wv[v];
          }
        }
      }
    }
    add_to_sums<vec, kOW, kNV, kVL>(acc, &out[0][0]);
  }
  // [pixel][channel] sums to NCHW rows, or to NHWC pixels as they are.
  const int64_t count = std::min<int64_t>(kOW, p.out_w - ow0);
  if (kNhwc) {
    for (int64_t j = 0; j < count; ++j)
      std::memcpy(b.yrow + (ow0 + j) * p.out_channels, out[j], size_t(b.kvalid) * sizeof(float));
  } else {
    const int64_t plane = p.out_h * p.out_w;
    for (int64_t k = 0; k < b.kvalid; ++k)
      for (int64_t j = 0; j < count; ++j) b.yrow[k * plane + ow0 + j] = out[j][k];
  }
}

// The smaller blocks, for a row's last pixels, compiled alone per
// instruction set: inlined beside the full blocks, their live values crowd
// the registers and the full blocks' weights spill.
template <typename T, int kOW, bool kNhwc>
CONV2D_EXT_TARGET("avx512f") __attribute__((noinline)) void pixel_block_avx512(
    const PixelBlock& b, int64_t ow0) {
  pixel_block<T, kOW, kNhwc>(b, ow0);
}
template <typename T, int kOW, bool kNhwc>
CONV2D_EXT_TARGET("avx2,fma") __attribute__((noinline)) void pixel_block_avx2(
    const PixelBlock& b, int64_t ow0) {
  pixel_block<T, kOW, kNhwc>(b, ow0);
}
template <typename T, int kOW, bool kNhwc>
__attribute__((noinline)) void pixel_block_baseline(const PixelBlock& b, int64_t ow0) {
  pixel_block<T, kOW, kNhwc>(b, ow0);
}
template <typename T, int kOW, bool kNhwc>
__attribute__((always_inline)) inline void run_pixel_block(const PixelBlock& b, int64_t ow0) {
  if constexpr (T::kVL == Avx512::kVL) {
    pixel_block_avx512<T, kOW, kNhwc>(b, ow0);
  } else if constexpr (T::kVL == Avx2::kVL) {
    pixel_block_avx2<T, kOW, kNhwc>(b, ow0);
  } else {
    pixel_block_baseline<T, kOW, kNhwc>(b, ow0);
  }
}

// Output row `oh` of image n, group g, output channels k0 .. k0 + kKB of
// the group (kvalid of them real). `rows`: the input rows the output row
// reads (row_inputs), [C per group][R][wp], or with kNhwc (channels_last
// operands) [R][wp][C], every group's channels. Blocks of kOW pixels, and the row's
// last few pixels in a block of a third or two thirds of kOW where that
// holds them (a row of 14 pixels: 12 and 4, not 12 and 12).
template <typename T, bool kNhwc>
__attribute__((always_inline)) inline void row_block(const ConvParams& p, const float* rows,
                                                     int64_t wp, const float* wpk,
                                                     const float* bias, float* y, int64_t n,
                                                     int64_t g, int64_t kblock, int64_t oh) {
  constexpr int kOW = T::kOW, kKB = T::kKB;
  constexpr int kThird = (kOW + 2) / 3, kTwoThirds = 2 * kOW / 3;
  const int64_t cin = p.in_channels_per_group(), cout = p.out_channels_per_group();
  const int64_t taps = p.taps();
  const int64_t k0 = kblock * kKB, kvalid = std::min<int64_t>(kKB, cout - k0);
  const int64_t blocks = (cout + kKB - 1) / kKB;
  const float* wblock = wpk + (g * blocks + kblock) * cin * taps * kKB;
  float* yrow = kNhwc ? y + ((n * p.out_h + oh) * p.out_w) * p.out_channels + g * cout + k0
                      : y + ((n * p.out_channels + g * cout + k0) * p.out_h + oh) * p.out_w;
  if (kNhwc) rows += g * cin;  // the group's channels of each pixel
  alignas(64) float bias_v[kKB];
  for (int64_t k = 0; k < kKB; ++k) bias_v[k] = bias && k < kvalid ? bias[g * cout + k0 + k] : 0.f;
  const PixelBlock b{p, rows, wblock, bias_v, yrow, wp, kvalid};
  int64_t ow0 = 0;
  for (; ow0 + kOW <= p.out_w; ow0 += kOW) pixel_block<T, kOW, kNhwc>(b, ow0);
  const int64_t tail = p.out_w - ow0;
  if (tail == 0) return;
  if (tail <= kThird) {
    run_pixel_block<T, kThird, kNhwc>(b, ow0);
  } else if (tail <= kTwoThirds) {
    run_pixel_block<T, kTwoThirds, kNhwc>(b, ow0);
  } else {
    pixel_block<T, kOW, kNhwc>(b, ow0);
  }
}

// What every task shares.
struct Problem {
  const ConvParams& p;
  const float *xpad, *wpk, *bias;
  float* y;
  int64_t hp, wp;
};

// The input rows output row oh of image n, group g reads, gathered from
// their planes into one contiguous run [C per group][R][wp], so that the
// pixel blocks' broadcasts walk one stream instead of C planes.
// With kNhwc, the R padded rows [wp][C] as they are (every group's).
template <bool kNhwc>
inline void row_inputs(const Problem& a, int64_t n, int64_t g, int64_t oh, float* rows) {
  const ConvParams& p = a.p;
  const int64_t cin = p.in_channels_per_group();
  if (kNhwc) {
    const int64_t row = a.wp * p.in_channels;
    for (int64_t r = 0; r < p.kernel_h; ++r)
      std::memcpy(rows + r * row,
                  a.xpad + (n * a.hp + oh * p.stride_h + r * p.dilation_h) * row,
                  size_t(row) * sizeof(float));
    return;
  }
  const float* ximg = a.xpad + (n * p.in_channels + g * cin) * a.hp * a.wp;
  for (int64_t c = 0; c < cin; ++c)
    for (int64_t r = 0; r < p.kernel_h; ++r)
      std::memcpy(rows + (c * p.kernel_h + r) * a.wp,
                  ximg + (c * a.hp + oh * p.stride_h + r * p.dilation_h) * a.wp,
                  size_t(a.wp) * sizeof(float));
}

// Tasks [begin, end), one output row of one image and group each, in
// (image, group, row) order; every channel block of the row. With kNhwc a
// task is one output row of one image, every group's (its input rows
// gathered once for all of them).
template <typename T, bool kNhwc>
__attribute__((always_inline)) inline void rows_range(const Problem& a, int64_t begin,
                                                      int64_t end) {
  const ConvParams& p = a.p;
  const int64_t cin = kNhwc ? p.in_channels : p.in_channels_per_group();
  const int64_t blocks = (p.out_channels_per_group() + T::kKB - 1) / T::kKB;
  // The rows, and slack for the last pixel block's reads past their end.
  const int64_t row_floats = cin * p.kernel_h * a.wp;
  const int64_t slack = int64_t(T::kOW) * p.stride_w * (kNhwc ? cin : 1) + 1;
  std::vector<float> rows(size_t(row_floats + slack), 0.f);
  for (int64_t t = begin; t < end; ++t) {
    const int64_t oh = t % p.out_h, ng = t / p.out_h;
    const int64_t groups = kNhwc ? p.groups : 1;
    const int64_t g0 = kNhwc ? 0 : ng % p.groups, n = kNhwc ? ng : ng / p.groups;
    row_inputs<kNhwc>(a, n, g0, oh, rows.data());
    for (int64_t g = g0; g < g0 + groups; ++g)
      for (int64_t kblock = 0; kblock < blocks; ++kblock)
        row_block<T, kNhwc>(p, rows.data(), a.wp, a.wpk, a.bias, a.y, n, g, kblock, oh);
  }
}
template <typename T>
__attribute__((always_inline)) inline void task_range(const Problem& a, int64_t begin,
                                                      int64_t end) {
  rows_range<T, false>(a, begin, end);
}
template <typename T>
__attribute__((always_inline)) inline void task_range_nhwc(const Problem& a, int64_t begin,
                                                           int64_t end) {
  rows_range<T, true>(a, begin, end);
}

template <typename T>
__attribute__((always_inline)) inline void task_range_one(const Problem& a, int64_t begin,
                                                          int64_t end) {
  rows_range<OneVector<T>, false>(a, begin, end);
}
template <typename T>
__attribute__((always_inline)) inline void task_range_nhwc_one(const Problem& a, int64_t begin,
                                                               int64_t end) {
  rows_range<OneVector<T>, true>(a, begin, end);
}

CONV2D_EXT_ISA_VARIANTS(tasks, Problem, task_range)
CONV2D_EXT_ISA_VARIANTS(tasks_nhwc, Problem, task_range_nhwc)
CONV2D_EXT_ISA_VARIANTS(tasks_one, Problem, task_range_one)
CONV2D_EXT_ISA_VARIANTS(tasks_nhwc_one, Problem, task_range_nhwc_one)

// ---- wgrad: M = output channels, N = (channel, tap) entries, K = pixels.
// A tile is kKB output channels x kEntries entries of one group's
// gradient, summed over every pixel of the batch: per pixel one vector
// load of grad_output (repacked [group][image][row][column][channel] so
// that a pixel's channel block is contiguous) serves kEntries entries, one
// broadcast of the padded input serves kKB channels. A task owns a run of
// entry tiles of one channel block and walks the pixels in chunks of
// output rows, every tile of the run over a chunk before the next chunk,
// so that the chunk's grad_output is read from cache by all of them; the
// tiles' sums wait in memory between chunks.
constexpr int kEntries = 12;
constexpr int64_t kChunkPixels = 1024;

struct WgradProblem {
  const ConvParams& p;
  const float *xpad, *go_t;  // padded input; grad_output repacked
  float* gw;
  int64_t hp, wp, kpad;  // kpad: a group's channels of go_t (blocks of kKB)
  int64_t tiles_per_task;  // entry tiles a task owns
  // go_t's stride from one pixel to the next and from one group to the
  // next: [group][image][row][column][kpad], or channels_last
  // [image][row][column][group][kpad].
  int64_t go_pixel, go_group;
};

// Each entry's input offset from its pixel's (image, row) base; entries
// past the end repeat the last one and are dropped. Entries are (channel,
// tap) in grad_w's NCHW order, or with kNhwc (channels_last operands and
// grad_w) (tap, channel), its channels_last order; a channels_last pixel
// holds every group's channels.
template <bool kNhwc>
inline void wgrad_offsets(const WgradProblem& a, int64_t e0, int64_t count,
                          int64_t (&off)[kEntries]) {
  const ConvParams& p = a.p;
  const int64_t taps = p.taps(), cin = p.in_channels_per_group();
  for (int e = 0; e < kEntries; ++e) {
    const int64_t entry = e0 + std::min<int64_t>(e, count - 1);
    const int64_t c = kNhwc ? entry % cin : entry / taps;
    const int64_t t = kNhwc ? entry / cin : entry % taps;
    const int64_t r = t / p.kernel_w, sx = t % p.kernel_w;
    off[e] = kNhwc ? (r * p.dilation_h * a.wp + sx * p.dilation_w) * p.in_channels + c
                   : (c * a.hp + r * p.dilation_h) * a.wp + sx * p.dilation_w;
  }
}

// Pixels a run of wgrad's sums takes before it is added to the tile's.
constexpr int64_t kRunPixels = 32;

// One tile's sums (in `sums`, [kEntries][kKB]) continued over output rows
// [oh0, oh1) of image n: runs of kRunPixels pixels summed from zero, each
// then added to the tile's, so that no sum runs long (one chain over a
// layer's every pixel lost several times PyTorch's accuracy).
template <typename T, bool kNhwc>
__attribute__((always_inline)) inline void wgrad_rows(const WgradProblem& a, int64_t g,
                                                      int64_t kblock,
                                                      const int64_t (&off)[kEntries], int64_t n,
                                                      int64_t oh0, int64_t oh1, float* sums) {
  typedef float vec __attribute__((vector_size(T::kVL * sizeof(float))));
  typedef float vec_unaligned __attribute__((vector_size(T::kVL * sizeof(float)), aligned(4)));
  constexpr int kVL = T::kVL, kNV = T::kNV, kKB = T::kKB;
  const ConvParams& p = a.p;
  const int64_t cin = p.in_channels_per_group();
  vec acc[kEntries][kNV];
  for (int e = 0; e < kEntries; ++e)
    for (int v = 0; v < kNV; ++v) acc[e][v] = vec{};
  int64_t pixels = 0;  // in the current run
  const int64_t pixel_step = p.stride_w * (kNhwc ? p.in_channels : 1);
  for (int64_t oh = oh0; oh < oh1; ++oh) {
    const float* xrow =
        kNhwc ? a.xpad + ((n * a.hp + oh * p.stride_h) * a.wp) * p.in_channels + g * cin
              : a.xpad + ((n * p.in_channels + g * cin) * a.hp + oh * p.stride_h) * a.wp;
    const float* grow = a.go_t + g * a.go_group + ((n * p.out_h + oh) * p.out_w) * a.go_pixel +
                        kblock * kKB;
    for (int64_t ow = 0; ow < p.out_w; ++ow) {
      vec gv[kNV];
      for (int v = 0; v < kNV; ++v)
        gv[v] = *reinterpret_cast<const vec_unaligned*>(grow + ow * a.go_pixel + v * kVL);
      const float* xp = xrow + ow * pixel_step;
#pragma GCC unroll 16
      for (int e = 0; e < kEntries; ++e) {
        const float xv = xp[off[e]];
#pragma GCC unroll 4
        for (int v = 0; v < kNV; ++v) acc[e][v] += xv * gv[v];
      }
      if (++pixels == kRunPixels) {
        add_to_sums<vec, kEntries, kNV, kVL>(acc, sums);
        pixels = 0;
      }
    }
  }
  add_to_sums<vec, kEntries, kNV, kVL>(acc, sums);
}

// Tasks [begin, end) in (group, channel block, run of entry tiles) order.
template <typename T, bool kNhwc>
__attribute__((always_inline)) inline void wgrad_tasks(const WgradProblem& a, int64_t begin,
                                                       int64_t end) {
  constexpr int kKB = T::kKB;
  const ConvParams& p = a.p;
  const int64_t cin = p.in_channels_per_group(), cout = p.out_channels_per_group();
  const int64_t entries = cin * p.taps();
  const int64_t kblocks = a.kpad / kKB;
  const int64_t tiles = (entries + kEntries - 1) / kEntries;
  const int64_t runs = (tiles + a.tiles_per_task - 1) / a.tiles_per_task;
  const int64_t rows = std::max<int64_t>(1, kChunkPixels / std::max<int64_t>(1, p.out_w));
  std::vector<float> sums(size_t(a.tiles_per_task * kEntries * kKB));
  std::vector<int64_t> offs(size_t(a.tiles_per_task * kEntries));
  for (int64_t t = begin; t < end; ++t) {
    const int64_t run = t % runs, rest = t / runs;
    const int64_t g = rest / kblocks, kblock = rest % kblocks;
    const int64_t tile0 = run * a.tiles_per_task;
    const int64_t ntiles = std::min(a.tiles_per_task, tiles - tile0);
    std::fill(sums.begin(), sums.end(), 0.f);
    for (int64_t i = 0; i < ntiles; ++i) {
      const int64_t e0 = (tile0 + i) * kEntries;
      wgrad_offsets<kNhwc>(a, e0, std::min<int64_t>(kEntries, entries - e0),
                    *reinterpret_cast<int64_t(*)[kEntries]>(offs.data() + i * kEntries));
    }
    for (int64_t n = 0; n < p.batch; ++n)
      for (int64_t oh0 = 0; oh0 < p.out_h; oh0 += rows)
        for (int64_t i = 0; i < ntiles; ++i)
          wgrad_rows<T, kNhwc>(a, g, kblock,
                        *reinterpret_cast<const int64_t(*)[kEntries]>(offs.data() + i * kEntries),
                        n, oh0, std::min(p.out_h, oh0 + rows),
                        sums.data() + i * kEntries * kKB);
    // [entry][channel] sums to grad_w's [channel][entry].
    const int64_t k0 = kblock * kKB, kvalid = std::min<int64_t>(kKB, cout - k0);
    for (int64_t i = 0; i < ntiles; ++i) {
      const int64_t e0 = (tile0 + i) * kEntries;
      const int64_t count = std::min<int64_t>(kEntries, entries - e0);
      const float* tile = sums.data() + i * kEntries * kKB;
      for (int64_t k = 0; k < kvalid; ++k)
        for (int64_t e = 0; e < count; ++e)
          a.gw[(g * cout + k0 + k) * entries + e0 + e] = tile[e * kKB + k];
    }
  }
}
template <typename T>
__attribute__((always_inline)) inline void wgrad_range(const WgradProblem& a, int64_t begin,
                                                       int64_t end) {
  wgrad_tasks<T, false>(a, begin, end);
}
template <typename T>
__attribute__((always_inline)) inline void wgrad_range_nhwc(const WgradProblem& a,
                                                            int64_t begin, int64_t end) {
  wgrad_tasks<T, true>(a, begin, end);
}
template <typename T>
__attribute__((always_inline)) inline void wgrad_range_one(const WgradProblem& a, int64_t begin,
                                                           int64_t end) {
  wgrad_tasks<OneVector<T>, false>(a, begin, end);
}
template <typename T>
__attribute__((always_inline)) inline void wgrad_range_nhwc_one(const WgradProblem& a,
                                                                int64_t begin, int64_t end) {
  wgrad_tasks<OneVector<T>, true>(a, begin, end);
}
CONV2D_EXT_ISA_VARIANTS(wgrad, WgradProblem, wgrad_range)
CONV2D_EXT_ISA_VARIANTS(wgrad_nhwc, WgradProblem, wgrad_range_nhwc)
CONV2D_EXT_ISA_VARIANTS(wgrad_one, WgradProblem, wgrad_range_one)
CONV2D_EXT_ISA_VARIANTS(wgrad_nhwc_one, WgradProblem, wgrad_range_nhwc_one)

// ---- depthwise forward (one input channel per group, unit column
// stride): each output plane alone, kDwVectors vectors of a row's pixels
// in registers, every tap one broadcast weight times an unaligned load of
// the padded input row.
constexpr int kDwVectors = 4;

// At column stride sw the padded plane is kept with each row split into
// sw phase rows of wq floats (phase q: the row's columns q, q + sw, ...), so
// that a tap's inputs under consecutive output pixels are consecutive
// floats of one phase row; at unit stride that is the row itself.
struct DwProblem {
  const ConvParams& p;
  const float *x, *w, *bias;  // x unpadded
  float* y;
  int64_t hp, wp;  // the padded plane's extents
  int64_t wq;      // a phase row's floats: wp / stride_w, rounded up
};

// Output plane k of image n from its input plane, already zero-padded
// (hp x wp, with slack for a row's last block) in `xplane`. A block is
// kRows rows x kDwVectors / kRows vectors of pixels: narrow planes take
// several rows at once rather than filling one vector of a long block.
template <typename T, int kRows>
__attribute__((always_inline)) inline void dw_plane(const DwProblem& a, int64_t n, int64_t k,
                                                    const float* xplane) {
  typedef float vec __attribute__((vector_size(T::kVL * sizeof(float))));
  typedef float vec_unaligned __attribute__((vector_size(T::kVL * sizeof(float)), aligned(4)));
  constexpr int kVL = T::kVL, kVectors = kDwVectors / kRows, kBlock = kVL * kVectors;
  const ConvParams& p = a.p;
  const float* wk = a.w + k * p.taps();
  const float b = a.bias ? a.bias[k] : 0.f;
  float* yplane = a.y + (n * p.out_channels + k) * p.out_h * p.out_w;
  const int64_t row = p.stride_w * a.wq;  // a padded row's floats
  for (int64_t oh0 = 0; oh0 < p.out_h; oh0 += kRows) {
    // Rows past the plane's end repeat its last and are dropped.
    const float* xrow[kRows];
    for (int i = 0; i < kRows; ++i)
      xrow[i] = xplane + std::min<int64_t>(oh0 + i, p.out_h - 1) * p.stride_h * row;
    for (int64_t ow0 = 0; ow0 < p.out_w; ow0 += kBlock) {
      vec acc[kRows][kVectors];
      for (int i = 0; i < kRows; ++i)
        for (int u = 0; u < kVectors; ++u) acc[i][u] = vec{} + b;
      for (int64_t r = 0; r < p.kernel_h; ++r) {
        for (int64_t sx = 0; sx < p.kernel_w; ++sx) {
          const float wv = wk[r * p.kernel_w + sx];
          const int64_t col = sx * p.dilation_w;  // the tap's phase row and place in it
          const int64_t at =
              r * p.dilation_h * row + (col % p.stride_w) * a.wq + col / p.stride_w + ow0;
#pragma GCC unroll 4
          for (int i = 0; i < kRows; ++i)
#pragma GCC unroll 4
            for (int u = 0; u < kVectors; ++u)
              acc[i][u] += wv * *reinterpret_cast<const vec_unaligned*>(xrow[i] + at + u * kVL);
        }
      }
      const int64_t count = std::min<int64_t>(kBlock, p.out_w - ow0);
      for (int i = 0; i < kRows && oh0 + i < p.out_h; ++i) {
        float out[kBlock];
        std::memcpy(out, acc[i], sizeof(out));
        std::memcpy(yplane + (oh0 + i) * p.out_w + ow0, out, size_t(count) * sizeof(float));
      }
    }
  }
}

// Each task pads its input plane into a buffer of its own, which stays in
// cache for the plane's taps (padding the whole input first would stream
// it through memory twice more). The borders and slack are written once,
// as zeros.
template <typename T>
__attribute__((always_inline)) inline void dw_range(const DwProblem& a, int64_t begin,
                                                    int64_t end) {
  const ConvParams& p = a.p;
  const int64_t sw = p.stride_w, row = sw * a.wq;
  std::vector<float> plane(size_t(a.hp * row + int64_t(T::kVL) * kDwVectors + 1), 0.f);
  for (int64_t t = begin; t < end; ++t) {
    const int64_t n = t / p.out_channels, k = t % p.out_channels;
    const int64_t c = k / p.out_channels_per_group();  // the group's one input channel
    const float* src = a.x + (n * p.in_channels + c) * p.in_h * p.in_w;
    for (int64_t h = 0; h < p.in_h; ++h) {
      float* dst = plane.data() + (h + p.pad_h) * row;
      if (sw == 1) {
        std::memcpy(dst + p.pad_w, src + h * p.in_w, size_t(p.in_w) * sizeof(float));
        continue;
      }
      // Phase row q holds padded columns q, q + sw, ...: input column
      // q + sw * i - pad_w.
      for (int64_t q = 0; q < sw; ++q) {
        float* phase = dst + q * a.wq;
        for (int64_t i = 0, w = q - p.pad_w; i < a.wq; ++i, w += sw)
          if (w >= 0 && w < p.in_w) phase[i] = src[h * p.in_w + w];
      }
    }
    if (p.out_w <= T::kVL) {
      dw_plane<T, 4>(a, n, k, plane.data());
    } else if (p.out_w <= 2 * T::kVL) {
      dw_plane<T, 2>(a, n, k, plane.data());
    } else {
      dw_plane<T, 1>(a, n, k, plane.data());
    }
  }
}
CONV2D_EXT_ISA_VARIANTS(dw, DwProblem, dw_range)

// ---- depthwise dgrad at column stride 2 over NCHW operands (one output
// channel per input channel): grad_input column iw = 2q + phase sums, over
// the taps whose columns reach that phase, grad_output column q + off(tap)
// of the rows reaching grad_input row ih; so each phase's columns are
// vectors of consecutive grad_output columns times broadcast weights, and
// the two phases' vectors interleave into grad_input's row. A task is one
// plane; its grad_output plane is copied with zero margins first, so no
// load checks its column.
struct DwDgradS2Problem {
  const ConvParams& p;  // the layer's (grad_input is p's input)
  const float *go, *w;  // go [N][C][P][Q]; w [C][1][R][S]
  float* gi;            // [N][C][H][W]
  int64_t margin, qp;   // the padded grad_output row: margin columns left, qp floats
};

// Lanes kFrom, kFrom + 1, ... of a and b, alternately (a's first).
template <int kVL, int kFrom, typename V, int... kL>
__attribute__((always_inline)) inline V interleave(V a, V b, std::integer_sequence<int, kL...>) {
  return CONV2D_EXT_SHUFFLE(a, b, typename IntVector<kVL>::type,
                            ((kL % 2) * kVL + kFrom + kL / 2)...);
}

template <typename T>
__attribute__((always_inline)) inline void dw_dgrad_s2_plane(const DwDgradS2Problem& a,
                                                             int64_t plane,
                                                             const float* gplane) {
  typedef float vec __attribute__((vector_size(T::kVL * sizeof(float))));
  typedef float unaligned __attribute__((vector_size(T::kVL * sizeof(float)), aligned(4)));
  constexpr int kVL = T::kVL;
  const ConvParams& p = a.p;
  const int64_t c = plane % p.in_channels;
  const float* wc = a.w + c * p.taps();
  float* giplane = a.gi + plane * p.in_h * p.in_w;
  // Phase f's taps of a kernel row: (offset in grad_output's padded row,
  // weight), the same for every row. At an even dilation every tap of a
  // row reaches the same phase: as many as the row's 16 columns
  // (depthwise_dgrad_s2_fits).
  struct Tap {
    int64_t offset;
    float w;
  };
  Tap taps[64][2][16];
  int ntaps[2] = {0, 0};
  for (int f = 0; f < 2; ++f)
    for (int64_t s = 0; s < p.kernel_w; ++s) {
      // v: twice the tap's grad_output column less q.
      const int64_t v = f + p.pad_w - s * p.dilation_w;
      if (v % 2 != 0) continue;
      for (int64_t r = 0; r < p.kernel_h; ++r)
        taps[r][f][ntaps[f]] = {v / 2, wc[r * p.kernel_w + s]};
      ++ntaps[f];
    }
  for (int64_t ih = 0; ih < p.in_h; ++ih) {
    float* girow = giplane + ih * p.in_w;
    // The kernel rows reaching grad_input row ih, and their grad_output rows.
    int64_t rows[64];
    const float* grows[64];
    int nrows = 0;
    for (int64_t r = 0; r < p.kernel_h; ++r) {
      const int64_t u = ih + p.pad_h - r * p.dilation_h;
      if (u < 0 || u % p.stride_h != 0 || u / p.stride_h >= p.out_h) continue;
      rows[nrows] = r;
      grows[nrows++] = gplane + (u / p.stride_h) * a.qp + a.margin;
    }
    for (int64_t q0 = 0; 2 * q0 < p.in_w; q0 += kVL) {
      vec acc[2] = {vec{}, vec{}};
      for (int i = 0; i < nrows; ++i)
        for (int f = 0; f < 2; ++f)
          for (int k = 0; k < ntaps[f]; ++k) {
            const Tap& t = taps[rows[i]][f][k];
            acc[f] += t.w * *reinterpret_cast<const unaligned*>(grows[i] + t.offset + q0);
          }
      // Columns 2q and 2q + 1: the phases' lanes interleaved.
      const auto lanes = std::make_integer_sequence<int, kVL>{};
      const vec lo = interleave<kVL, 0>(acc[0], acc[1], lanes);
      const vec hi = interleave<kVL, kVL / 2>(acc[0], acc[1], lanes);
      const int64_t at = 2 * q0, count = std::min<int64_t>(2 * kVL, p.in_w - at);
      if (count == 2 * kVL) {
        *reinterpret_cast<unaligned*>(girow + at) = lo;
        *reinterpret_cast<unaligned*>(girow + at + kVL) = hi;
      } else {
        float out[2 * kVL];
        std::memcpy(out, &lo, sizeof(lo));
        std::memcpy(out + kVL, &hi, sizeof(hi));
        std::memcpy(girow + at, out, size_t(count) * sizeof(float));
      }
    }
  }
}

// Tasks [begin, end): plane t (image t / C, channel t % C).
template <typename T>
__attribute__((always_inline)) inline void dw_dgrad_s2_range(const DwDgradS2Problem& a,
                                                             int64_t begin, int64_t end) {
  const ConvParams& p = a.p;
  std::vector<float> gplane(size_t(p.out_h * a.qp), 0.f);
  for (int64_t t = begin; t < end; ++t) {
    const float* src = a.go + t * p.out_h * p.out_w;
    for (int64_t oh = 0; oh < p.out_h; ++oh)
      std::memcpy(gplane.data() + oh * a.qp + a.margin, src + oh * p.out_w,
                  size_t(p.out_w) * sizeof(float));
    dw_dgrad_s2_plane<T>(a, t, gplane.data());
  }
}
CONV2D_EXT_ISA_VARIANTS(dw_dgrad_s2, DwDgradS2Problem, dw_dgrad_s2_range)

// ---- depthwise forward over channels_last operands (one output channel
// per input channel): a task is one output row; per block of kDwPixels
// pixels, channels in vectors (kCV at a time), every tap one vector of
// weights ([tap][channel], transposed once) times the input pixel's
// channels. Taps in the padding are skipped, so nothing is padded.
constexpr int kDwPixels = 4;

struct DwNhwcProblem {
  const ConvParams& p;
  const float *x, *wt, *bias;  // x [N][H][W][C]; wt [R*S][C]
  float* y;                    // [N][P][Q][C]
  bool pairs;                  // tasks of two rows (dw_nhwc_pair_runs)
};

template <typename T, int kCV>
__attribute__((always_inline)) inline void dw_nhwc_block(const DwNhwcProblem& a, int64_t n,
                                                         int64_t oh, int64_t ow0, int64_t c0) {
  typedef float vec __attribute__((vector_size(T::kVL * sizeof(float))));
  typedef float vec_unaligned __attribute__((vector_size(T::kVL * sizeof(float)), aligned(4)));
  constexpr int kVL = T::kVL;
  const ConvParams& p = a.p;
  const int64_t C = p.out_channels;
  const int64_t npix = std::min<int64_t>(kDwPixels, p.out_w - ow0);
  auto load = [](const float* at) { return *reinterpret_cast<const vec_unaligned*>(at); };
  vec acc[kDwPixels][kCV];
  for (int v = 0; v < kCV; ++v) {
    const vec b = a.bias ? load(a.bias + c0 + v * kVL) : vec{};
    for (int j = 0; j < kDwPixels; ++j) acc[j][v] = b;
  }
  for (int64_t r = 0; r < p.kernel_h; ++r) {
    const int64_t ih = oh * p.stride_h - p.pad_h + r * p.dilation_h;
    if (ih < 0 || ih >= p.in_h) continue;
    const float* xrow = a.x + ((n * p.in_h + ih) * p.in_w) * C + c0;
    for (int64_t s = 0; s < p.kernel_w; ++s) {
      vec wv[kCV];
      for (int v = 0; v < kCV; ++v) wv[v] = load(a.wt + (r * p.kernel_w + s) * C + c0 + v * kVL);
#pragma GCC unroll 4
      for (int j = 0; j < kDwPixels; ++j) {
        const int64_t iw = (ow0 + j) * p.stride_w - p.pad_w + s * p.dilation_w;
        if (j >= npix || iw < 0 || iw >= p.in_w) continue;
#pragma GCC unroll 4
        for (int v = 0; v < kCV; ++v) acc[j][v] += load(xrow + iw * C + v * kVL) * wv[v];
      }
    }
  }
  for (int64_t j = 0; j < npix; ++j)
    for (int v = 0; v < kCV; ++v)
      *reinterpret_cast<vec_unaligned*>(a.y + ((n * p.out_h + oh) * p.out_w + ow0 + j) * C + c0 +
                                        v * kVL) = acc[j][v];
}

alignas(64) constexpr float kZeros[16] = {};  // a vector of zeros, for any ISA

// Operands past a core's L2 cache (about 1 MiB) come from memory: the
// depthwise channels_last kernels then favour the memory's access pattern
// over saving loads.
constexpr int64_t kCacheBytes = int64_t(1) << 20;

template <typename T>
struct Vectors {
  typedef float vec __attribute__((vector_size(T::kVL * sizeof(float))));
  typedef float unaligned __attribute__((vector_size(T::kVL * sizeof(float)), aligned(4)));
};

// At column stride kSW (1 or 2) and unit dilation with kS columns of taps:
// a run of kP pixels of a row x one vector of channels. Each input pixel's vector
// is loaded once per kernel row and serves every tap of that row that
// reads it (kS of the run's pixels), so a load feeds up to kS multiply-adds
// rather than one; the row's kS weight vectors are loaded once per row.
// kEdge: the run reaches past the row's ends (or is cut short), so each
// load checks its column and zeros outside the input.
template <typename T, int kS, int kSW, bool kEdge>
__attribute__((always_inline)) inline void dw_nhwc_run(const DwNhwcProblem& a, int64_t n,
                                                       int64_t oh, int64_t ow0, int64_t c0) {
  typedef float vec __attribute__((vector_size(T::kVL * sizeof(float))));
  typedef float vec_unaligned __attribute__((vector_size(T::kVL * sizeof(float)), aligned(4)));
  constexpr int kP = T::kOW;
  const ConvParams& p = a.p;
  const int64_t C = p.out_channels;
  vec acc[kP];
  const vec b = a.bias ? *reinterpret_cast<const vec_unaligned*>(a.bias + c0) : vec{};
  for (int j = 0; j < kP; ++j) acc[j] = b;
  const int64_t iw0 = ow0 * kSW - p.pad_w;
  for (int64_t r = 0; r < p.kernel_h; ++r) {
    const int64_t ih = oh * p.stride_h - p.pad_h + r * p.dilation_h;
    if (ih < 0 || ih >= p.in_h) continue;
    const float* xrow = a.x + ((n * p.in_h + ih) * p.in_w) * C + c0;
    // The run's input pixels in turn (a pointer stepped by C: offsets
    // i * C precomputed would not fit in the registers).
    const float* xp = xrow + iw0 * C;
    vec wv[kS];
    for (int s = 0; s < kS; ++s)
      wv[s] = *reinterpret_cast<const vec_unaligned*>(a.wt + (r * kS + s) * C + c0);
#pragma GCC unroll 32
    for (int i = 0; i < (kP - 1) * kSW + kS; ++i) {
      const int64_t iw = iw0 + i;
      // Outside the input: a load of zeros (a select of the address, no
      // branch).
      const float* at = !kEdge || (iw >= 0 && iw < p.in_w) ? xp : kZeros;
      const vec xv = *reinterpret_cast<const vec_unaligned*>(at);
      xp += C;
      // Input column i is tap s of the run's pixel (i - s) / kSW.
#pragma GCC unroll 8
      for (int s = 0; s < kS; ++s)
        if (i - s >= 0 && (i - s) % kSW == 0 && (i - s) / kSW < kP)
          acc[(i - s) / kSW] += xv * wv[s];
    }
  }
  const int64_t npix = kEdge ? std::min<int64_t>(kP, p.out_w - ow0) : kP;
  for (int64_t j = 0; j < npix; ++j)
    *reinterpret_cast<vec_unaligned*>(a.y + ((n * p.out_h + oh) * p.out_w + ow0 + j) * C + c0) =
        acc[j];
}

// Two output rows at once (unit row stride and dilation): the kernel rows'
// window over the input is R + 1 rows, input row k feeding kernel row k of
// the first output row and k - 1 of the second, so each input pixel's
// vector is loaded once for both (two thirds of the loads of two single
// rows, 3x3). kUse: bit q set where output row q takes this input row.
template <typename T, int kS, int kP, int kUse, bool kEdge>
__attribute__((always_inline)) inline void dw_nhwc_pair_columns(
    const float* xp, int64_t iw0, int64_t in_w, int64_t C, const typename Vectors<T>::vec* w0,
    const typename Vectors<T>::vec* w1, typename Vectors<T>::vec (*acc)[kP]) {
  typedef typename Vectors<T>::vec vec;
  typedef typename Vectors<T>::unaligned unaligned;
#pragma GCC unroll 32
  for (int i = 0; i < kP + kS - 1; ++i) {
    const int64_t iw = iw0 + i;
    const float* at = !kEdge || (iw >= 0 && iw < in_w) ? xp : kZeros;
    const vec xv = *reinterpret_cast<const unaligned*>(at);
    xp += C;
#pragma GCC unroll 8
    for (int s = 0; s < kS; ++s)
      if (i - s >= 0 && i - s < kP) {
        if (kUse & 1) acc[0][i - s] += xv * w0[s];
        if (kUse & 2) acc[1][i - s] += xv * w1[s];
      }
  }
}

// Output rows oh and oh + 1 (both in the plane), kP pixels from ow0, one
// vector of channels from c0.
template <typename T, int kS, int kP, bool kEdge>
__attribute__((always_inline)) inline void dw_nhwc_pair_run(const DwNhwcProblem& a, int64_t n,
                                                            int64_t oh, int64_t ow0, int64_t c0) {
  typedef typename Vectors<T>::vec vec;
  typedef typename Vectors<T>::unaligned unaligned;
  const ConvParams& p = a.p;
  const int64_t C = p.out_channels;
  vec acc[2][kP];
  const vec b = a.bias ? *reinterpret_cast<const unaligned*>(a.bias + c0) : vec{};
  for (int q = 0; q < 2; ++q)
    for (int j = 0; j < kP; ++j) acc[q][j] = b;
  const int64_t iw0 = ow0 - p.pad_w;
  for (int64_t k = 0; k <= p.kernel_h; ++k) {
    const int64_t ih = oh - p.pad_h + k;
    if (ih < 0 || ih >= p.in_h) continue;
    const float* xp = a.x + ((n * p.in_h + ih) * p.in_w + iw0) * C + c0;
    const bool first = k < p.kernel_h, second = k >= 1;
    vec w0[kS], w1[kS];
    for (int s = 0; s < kS; ++s) {
      w0[s] = first ? *reinterpret_cast<const unaligned*>(a.wt + (k * kS + s) * C + c0) : vec{};
      w1[s] = second ? *reinterpret_cast<const unaligned*>(a.wt + ((k - 1) * kS + s) * C + c0)
                     : vec{};
    }
    if (first && second) {
      dw_nhwc_pair_columns<T, kS, kP, 3, kEdge>(xp, iw0, p.in_w, C, w0, w1, acc);
    } else if (first) {
      dw_nhwc_pair_columns<T, kS, kP, 1, kEdge>(xp, iw0, p.in_w, C, w0, w1, acc);
    } else {
      dw_nhwc_pair_columns<T, kS, kP, 2, kEdge>(xp, iw0, p.in_w, C, w0, w1, acc);
    }
  }
  const int64_t npix = kEdge ? std::min<int64_t>(kP, p.out_w - ow0) : kP;
  for (int q = 0; q < 2; ++q)
    for (int64_t j = 0; j < npix; ++j)
      *reinterpret_cast<unaligned*>(a.y + ((n * p.out_h + oh + q) * p.out_w + ow0 + j) * C + c0) =
          acc[q][j];
}

// Rows oh and oh + 1 by runs of kP pixels, every vector of channels of
// each run before the next; the two input rows the next pair is the first
// to read fetched a pair ahead.
template <typename T, int kS>
__attribute__((always_inline)) inline void dw_nhwc_pair_runs(const DwNhwcProblem& a, int64_t n,
                                                             int64_t oh) {
  constexpr int kP = T::kVL == 16 ? 8 : 4;
  const ConvParams& p = a.p;
  const int64_t C = p.out_channels;
  const int64_t ih_next = oh + 2 - p.pad_h + p.kernel_h - 1;  // and ih_next + 1
  for (int64_t ow0 = 0; ow0 < p.out_w; ow0 += kP) {
    const int64_t iw0 = ow0 - p.pad_w;
    const bool edge = iw0 < 0 || iw0 + kP + kS - 1 > p.in_w || ow0 + kP > p.out_w;
    const int64_t lo = std::max<int64_t>(iw0, 0), hi = std::min<int64_t>(iw0 + kP, p.in_w);
    for (int64_t ih = ih_next; ih < ih_next + 2; ++ih) {
      if (oh + 2 >= p.out_h || ih < 0 || ih >= p.in_h) continue;
      const float* row = a.x + ((n * p.in_h + ih) * p.in_w) * C;
      for (const float* at = row + lo * C; at < row + hi * C; at += 16)
        __builtin_prefetch(at, 0, 3);
    }
    for (int64_t v = 0; v * T::kVL < C; ++v) {
      const int64_t c0 = std::min<int64_t>(v * T::kVL, C - T::kVL);
      if (edge) {
        dw_nhwc_pair_run<T, kS, kP, true>(a, n, oh, ow0, c0);
      } else {
        dw_nhwc_pair_run<T, kS, kP, false>(a, n, oh, ow0, c0);
      }
    }
  }
}

// A row's runs of kP pixels, every vector of channels of each before the
// next (the run's inputs stay in L1 across its channel vectors).
template <typename T, int kS, int kSW>
__attribute__((always_inline)) inline void dw_nhwc_row_runs(const DwNhwcProblem& a, int64_t n,
                                                            int64_t oh) {
  constexpr int kP = T::kOW;
  const ConvParams& p = a.p;
  const int64_t C = p.out_channels;
  // The input row that the next output row is the first to read, fetched
  // a row ahead (the other rows it reads are in cache from this one's).
  const int64_t ih_next = (oh + 1) * p.stride_h - p.pad_h + (p.kernel_h - 1) * p.dilation_h;
  const bool fetch = oh + 1 < p.out_h && ih_next >= 0 && ih_next < p.in_h;
  for (int64_t ow0 = 0; ow0 < p.out_w; ow0 += kP) {
    const int64_t iw0 = ow0 * kSW - p.pad_w;
    const bool edge = iw0 < 0 || iw0 + (kP - 1) * kSW + kS > p.in_w || ow0 + kP > p.out_w;
    if (fetch) {  // a 64-byte line at a time
      const int64_t lo = std::max<int64_t>(iw0, 0);
      const int64_t hi = std::min<int64_t>(iw0 + kP * kSW, p.in_w);
      const float* row = a.x + ((n * p.in_h + ih_next) * p.in_w) * C;
      for (const float* at = row + lo * C; at < row + hi * C; at += 16)
        __builtin_prefetch(at, 0, 3);
    }
    // Channels past the last full vector: the vector ending at the last
    // channel, which computes its first lanes again, to the same bits.
    for (int64_t v = 0; v * T::kVL < C; ++v) {
      const int64_t c0 = std::min<int64_t>(v * T::kVL, C - T::kVL);
      if (edge) {
        dw_nhwc_run<T, kS, kSW, true>(a, n, oh, ow0, c0);
      } else {
        dw_nhwc_run<T, kS, kSW, false>(a, n, oh, ow0, c0);
      }
    }
  }
}

// Output row oh by runs (column stride kSW, unit column dilation, 3, 5 or
// 7 columns of taps).
template <typename T, int kSW>
__attribute__((always_inline)) inline void dw_nhwc_row_at(const DwNhwcProblem& a, int64_t n,
                                                          int64_t oh) {
  if (a.p.kernel_w == 3) {
    dw_nhwc_row_runs<T, 3, kSW>(a, n, oh);
  } else if (a.p.kernel_w == 5) {
    dw_nhwc_row_runs<T, 5, kSW>(a, n, oh);
  } else {
    dw_nhwc_row_runs<T, 7, kSW>(a, n, oh);
  }
}
template <typename T>
__attribute__((always_inline)) inline void dw_nhwc_row(const DwNhwcProblem& a, int64_t n,
                                                       int64_t oh) {
  if (a.p.stride_w == 1) {
    dw_nhwc_row_at<T, 1>(a, n, oh);
  } else {
    dw_nhwc_row_at<T, 2>(a, n, oh);
  }
}

// At least one vector of channels (depthwise_nhwc_fits); channels past the
// last full vector are taken by the vector ending at the last channel,
// which computes its first lanes again, to the same bits.
template <typename T>
__attribute__((always_inline)) inline void dw_nhwc_range(const DwNhwcProblem& a, int64_t begin,
                                                         int64_t end) {
  const ConvParams& p = a.p;
  const int64_t C = p.out_channels, full = C - C % T::kVL;
  const bool runs = (p.stride_w == 1 || p.stride_w == 2) && p.dilation_w == 1;
  if (a.pairs) {  // task t: rows 2 (t % pairs) and the next, of image t / pairs
    const int64_t pairs = (p.out_h + 1) / 2;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n = t / pairs, oh = 2 * (t % pairs);
      if (oh + 1 < p.out_h && p.kernel_w == 3) {
        dw_nhwc_pair_runs<T, 3>(a, n, oh);
      } else if (oh + 1 < p.out_h && T::kVL == 16 && p.kernel_w == 5) {
        dw_nhwc_pair_runs<T, 5>(a, n, oh);
      } else if (oh + 1 < p.out_h && T::kVL == 16 && p.kernel_w == 7) {
        dw_nhwc_pair_runs<T, 7>(a, n, oh);
      } else {  // a last, single row (a pair kernel runs wherever pairs are set)
        for (int64_t q = oh; q < std::min<int64_t>(oh + 2, p.out_h); ++q) dw_nhwc_row<T>(a, n, q);
      }
    }
    return;
  }
  for (int64_t t = begin; t < end; ++t) {
    const int64_t n = t / p.out_h, oh = t % p.out_h;
    if (runs && (p.kernel_w == 3 || p.kernel_w == 5 || p.kernel_w == 7)) {
      dw_nhwc_row<T>(a, n, oh);
      continue;
    }
    for (int64_t ow0 = 0; ow0 < p.out_w; ow0 += kDwPixels) {
      int64_t c0 = 0;
      for (; c0 + 4 * T::kVL <= full; c0 += 4 * T::kVL) dw_nhwc_block<T, 4>(a, n, oh, ow0, c0);
      for (; c0 + 2 * T::kVL <= full; c0 += 2 * T::kVL) dw_nhwc_block<T, 2>(a, n, oh, ow0, c0);
      for (; c0 < full; c0 += T::kVL) dw_nhwc_block<T, 1>(a, n, oh, ow0, c0);
      if (full < C) dw_nhwc_block<T, 1>(a, n, oh, ow0, C - T::kVL);
    }
  }
}
CONV2D_EXT_ISA_VARIANTS(dw_nhwc, DwNhwcProblem, dw_nhwc_range)

// ---- depthwise wgrad over channels_last operands (one output channel per
// input channel, column stride 1 or 2, unit column dilation, kernel_w 3, 5
// or 7): a
// task is one vector of channels over a chunk of output rows; per kernel
// row, its kS taps' sums in vector registers, each run of kP pixels of a
// row holding grad_output's kP vectors while every input column under the
// run is loaded once and multiplied into the taps that read it. Chunks are
// a fixed number of rows (not a share of the threads), their sums added in
// chunk order afterwards, so the result does not depend on the threads.
struct DwWgradNhwcProblem {
  const ConvParams& p;
  const float *x, *go;     // [N][H][W][C], [N][P][Q][C]
  float* partial;          // [chunk][R][S][C]
  int64_t chunk_rows;      // output rows (over the batch) a chunk
  bool fetch;              // whether the operands come from memory (prefetched)
};

// The operands a chunk reads, as two runs of floats: its grad_output rows
// and the input rows under them (from the first row's top tap to the last
// row's bottom one, the rows between images included).
struct ChunkSpan {
  int64_t go_begin, go_end, x_begin, x_end;
};

inline ChunkSpan chunk_span(const DwWgradNhwcProblem& a, int64_t chunk) {
  const ConvParams& p = a.p;
  const int64_t C = p.out_channels, rows = p.batch * p.out_h;
  const int64_t t0 = chunk * a.chunk_rows, t1 = std::min<int64_t>(t0 + a.chunk_rows, rows);
  auto x_row = [&](int64_t t, int64_t r) {  // the input row (over the batch) tap row r reads
    const int64_t n = t / p.out_h, ih = (t % p.out_h) * p.stride_h - p.pad_h + r * p.dilation_h;
    return n * p.in_h + std::clamp<int64_t>(ih, 0, p.in_h - 1);
  };
  return {t0 * p.out_w * C, t1 * p.out_w * C, x_row(t0, 0) * p.in_w * C,
          (x_row(t1 - 1, p.kernel_h - 1) + 1) * p.in_w * C};
}

// Share q of `shares` of the next chunk's operands brought towards the
// core (a 64-byte line at a time) while this chunk's later channel passes
// compute from cache: that chunk's first pass then finds its operands
// there rather than waiting on memory for each line.
inline void fetch_chunk_share(const DwWgradNhwcProblem& a, const ChunkSpan& span, int64_t q,
                              int64_t shares) {
  const int64_t go_lines = (span.go_end - span.go_begin + 15) / 16;
  const int64_t lines = go_lines + (span.x_end - span.x_begin + 15) / 16;
  const int64_t lo = lines * q / shares, hi = lines * (q + 1) / shares;
  for (int64_t l = lo; l < hi; ++l)
    __builtin_prefetch(l < go_lines ? a.go + span.go_begin + 16 * l
                                    : a.x + span.x_begin + 16 * (l - go_lines),
                       0, 2);
}

// Kernel rows a pass takes together: each run's grad_output vectors serve
// all of them, and their kRows x kS sums are that many independent chains
// of multiply-adds (one row's kS alone would wait on the adds' latency);
// within the registers beside the run's kP vectors of grad_output.
template <typename T, int kS>
constexpr int wgrad_rows() {
  constexpr int regs = T::kVL == 16 ? 32 : 16;
  return std::max(1, std::min(3, (regs - T::kOW - 2) / kS));
}

// One run of kP pixels from ow0 at column stride kSW for kRows kernel rows:
// xrow[k] the input
// row kernel row k reads (at channel c0), stepped by step[k] floats a
// column (0 for a row outside the input: xrow[k] is then kZeros); gorow
// the grad_output row at c0. kEdge: the run reaches past the input's ends
// or the output row's; columns outside the input read as zeros and pixels
// past the row are skipped, not multiplied by zeros (an input pixel no tap
// reads could be infinite).
template <typename T, int kS, int kSW, int kRows, bool kEdge>
__attribute__((always_inline)) inline void dw_wgrad_nhwc_run(
    const ConvParams& p, const float* const* xrow, const int64_t* step, const float* gorow,
    int64_t ow0, typename Vectors<T>::vec (*acc)[kS]) {
  typedef typename Vectors<T>::vec vec;
  typedef typename Vectors<T>::unaligned unaligned;
  constexpr int kP = T::kOW;
  const int64_t C = p.out_channels;
  const int64_t npix = kEdge ? std::min<int64_t>(kP, p.out_w - ow0) : kP;
  vec g[kP];
  const float* gp = gorow + ow0 * C;
  for (int j = 0; j < kP; ++j, gp += C)
    g[j] = !kEdge || j < npix ? *reinterpret_cast<const unaligned*>(gp) : vec{};
  const int64_t iw0 = ow0 * kSW - p.pad_w;
  const float* xp[kRows];
  for (int k = 0; k < kRows; ++k) xp[k] = xrow[k] + iw0 * step[k];
#pragma GCC unroll 32
  for (int i = 0; i < (kP - 1) * kSW + kS; ++i) {
    const int64_t iw = iw0 + i;
#pragma GCC unroll 4
    for (int k = 0; k < kRows; ++k) {
      const float* at = !kEdge || (iw >= 0 && iw < p.in_w) ? xp[k] : kZeros;
      const vec xv = *reinterpret_cast<const unaligned*>(at);
      xp[k] += step[k];
      // Input column i is tap s of the run's pixel (i - s) / kSW.
#pragma GCC unroll 8
      for (int s = 0; s < kS; ++s) {
        const int j = (i - s) / kSW;
        if (i - s >= 0 && (i - s) % kSW == 0 && j < kP && (!kEdge || j < npix))
          acc[k][s] += g[j] * xv;
      }
    }
  }
}

// The vector of channels from c0, storing lanes lane0 on (the lanes below
// are another task's: the vector ending at the last channel overlaps the
// one before it).
template <typename T, int kS, int kSW>
__attribute__((always_inline)) inline void dw_wgrad_nhwc_block(const DwWgradNhwcProblem& a,
                                                               int64_t chunk, int64_t c0,
                                                               int64_t lane0, bool first,
                                                               const ChunkSpan* next,
                                                               int64_t share, int64_t shares) {
  typedef typename Vectors<T>::vec vec;

  constexpr int kP = T::kOW, kRows = wgrad_rows<T, kS>();
  const ConvParams& p = a.p;
  const int64_t C = p.out_channels;
  const int64_t t0 = chunk * a.chunk_rows;
  const int64_t t1 = std::min<int64_t>(t0 + a.chunk_rows, p.batch * p.out_h);
  for (int64_t r0 = 0; r0 < p.kernel_h; r0 += kRows) {
    // Each output row's sums from zero, then added to the chunk's total:
    // one chain over the chunk's rows lost PyTorch's accuracy. (Runs of a
    // few rows, behind a branch, ran slower than a run a row.)
    alignas(64) float total[kRows][kS][T::kVL] = {};
    vec acc[kRows][kS];
    for (int k = 0; k < kRows; ++k)
      for (int s = 0; s < kS; ++s) acc[k][s] = vec{};
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / p.out_h, oh = t % p.out_h;
      // Rows past the kernel's or outside the input read zeros (kernel
      // rows past the last are summed and dropped).
      const float* xrow[kRows];
      int64_t step[kRows];
      bool any = false;
      for (int k = 0; k < kRows; ++k) {
        const int64_t ih = oh * p.stride_h - p.pad_h + (r0 + k) * p.dilation_h;
        const bool in = r0 + k < p.kernel_h && ih >= 0 && ih < p.in_h;
        xrow[k] = in ? a.x + ((n * p.in_h + ih) * p.in_w) * C + c0 : kZeros;
        step[k] = in ? C : 0;
        any = any || in;
      }
      if (!any) continue;
      const float* gorow = a.go + t * p.out_w * C + c0;
      // A thread's first pass over a chunk (its first channel vector, first
      // kernel rows) fetches the next row's pixels whole, every channel, for
      // it and the chunk's later passes (each pass alone reads one line of
      // a pixel's channels, a stride the memory serves slowly).
      if (next && r0 == 0) fetch_chunk_share(a, *next, share + (t - t0), shares);
      const bool fetch = a.fetch && first && r0 == 0 && t + 1 < t1;
      const int64_t oh_next = (t + 1) % p.out_h, n_next = (t + 1) / p.out_h;
      const int64_t ih_next = oh_next * p.stride_h - p.pad_h +
                              (std::min<int64_t>(kRows, p.kernel_h) - 1) * p.dilation_h;
      const float* gnext = a.go + (t + 1) * p.out_w * C;
      const float* xnext = a.x + ((n_next * p.in_h + ih_next) * p.in_w) * C;
      const bool fetch_x = fetch && ih_next >= 0 && ih_next < p.in_h;
      for (int64_t ow0 = 0; ow0 < p.out_w; ow0 += kP) {
        const int64_t iw0 = ow0 * kSW - p.pad_w;
        if (fetch) {
          const int64_t hi = std::min<int64_t>(ow0 + kP, p.out_w) * C;
          for (int64_t f = ow0 * C; f < hi; f += 16) __builtin_prefetch(gnext + f, 0, 3);
          if (fetch_x) {
            const int64_t lo = std::max<int64_t>(iw0, 0) * C;
            const int64_t xhi = std::min<int64_t>(iw0 + kP * kSW, p.in_w) * C;
            for (int64_t f = lo; f < xhi; f += 16) __builtin_prefetch(xnext + f, 0, 3);
          }
        }
        if (iw0 < 0 || iw0 + (kP - 1) * kSW + kS > p.in_w || ow0 + kP > p.out_w) {
          dw_wgrad_nhwc_run<T, kS, kSW, kRows, true>(p, xrow, step, gorow, ow0, acc);
        } else {
          dw_wgrad_nhwc_run<T, kS, kSW, kRows, false>(p, xrow, step, gorow, ow0, acc);
        }
      }
      add_to_sums<vec, kRows, kS, T::kVL>(acc, &total[0][0][0]);
    }
    for (int k = 0; k < kRows && r0 + k < p.kernel_h; ++k)
      for (int s = 0; s < kS; ++s) {
        float* out = a.partial + ((chunk * p.kernel_h + r0 + k) * kS + s) * C + c0;
        for (int64_t l = lane0; l < T::kVL; ++l) out[l] = total[k][s][l];
      }
  }
}

template <typename T, int kSW>
__attribute__((always_inline)) inline void dw_wgrad_nhwc_kernel_w(
    const DwWgradNhwcProblem& a, int64_t chunk, int64_t c0, int64_t lane0, bool first,
    const ChunkSpan* next, int64_t share, int64_t shares) {
  if (a.p.kernel_w == 3) {
    dw_wgrad_nhwc_block<T, 3, kSW>(a, chunk, c0, lane0, first, next, share, shares);
  } else if (a.p.kernel_w == 5) {
    dw_wgrad_nhwc_block<T, 5, kSW>(a, chunk, c0, lane0, first, next, share, shares);
  } else {
    dw_wgrad_nhwc_block<T, 7, kSW>(a, chunk, c0, lane0, first, next, share, shares);
  }
}

// Task t: chunk t / blocks, vector t % blocks of the channels; at least one
// vector (depthwise_nhwc_fits), the last ending at the last channel.
template <typename T>
__attribute__((always_inline)) inline void dw_wgrad_nhwc_range(const DwWgradNhwcProblem& a,
                                                               int64_t begin, int64_t end) {
  const ConvParams& p = a.p;
  const int64_t C = p.out_channels, blocks = (C + T::kVL - 1) / T::kVL;
  for (int64_t t = begin; t < end; ++t) {
    const int64_t chunk = t / blocks, b = t % blocks;
    const int64_t c0 = std::min<int64_t>(b * T::kVL, C - T::kVL), lane0 = b * T::kVL - c0;
    const bool first = t == begin || b == 0;  // the range's first pass over the chunk
    // The later passes over a chunk fetch the next chunk (if this range
    // runs it next), a share a row.
    const bool ahead = a.fetch && b > 0 && (chunk + 1) * blocks < end;
    const ChunkSpan next = ahead ? chunk_span(a, chunk + 1) : ChunkSpan{};
    const int64_t share = (b - 1) * a.chunk_rows, shares = (blocks - 1) * a.chunk_rows;
    const ChunkSpan* n = ahead ? &next : nullptr;
    if (p.stride_w == 1) {
      dw_wgrad_nhwc_kernel_w<T, 1>(a, chunk, c0, lane0, first, n, share, shares);
    } else {
      dw_wgrad_nhwc_kernel_w<T, 2>(a, chunk, c0, lane0, first, n, share, shares);
    }
  }
}
CONV2D_EXT_ISA_VARIANTS(dw_wgrad_nhwc, DwWgradNhwcProblem, dw_wgrad_nhwc_range)

// ---- depthwise dgrad over channels_last operands at any stride (one
// output channel per input channel): grad_input pixel (ih, iw) sums
// grad_output (oh, ow) x weight (r, s) over the taps with oh * sh = ih +
// ph - r * dh and ow * sw = iw + pw - s * dw. A task is one grad_input row;
// its kernel rows are those the row's stride phase reaches, and its columns
// go by column phase (iw mod sw), where the same columns of taps reach them
// and consecutive columns of a phase read consecutive grad_output columns.
// Per run of kP columns of a phase, one vector of channels: every reaching
// tap one weight vector times kP grad_output vectors, written in place (no
// per-phase tensors).
struct DwDgradNhwcProblem {
  const ConvParams& p;      // the layer's (grad_input is p's input)
  const float *go, *wt;     // go [N][P][Q][C]; wt [R*S][C]
  float* gi;                // [N][H][W][C]
};

// kP columns iw0, iw0 + sw, ... of grad_input row ih, channels from c0.
// kEdge: some of them are past the row's end or read grad_output columns
// outside it.
template <typename T, bool kEdge>
__attribute__((always_inline)) inline void dw_dgrad_nhwc_run(const DwDgradNhwcProblem& a,
                                                             int64_t n, int64_t ih, int64_t iw0,
                                                             int64_t c0, const int64_t* rows,
                                                             int nrows, const int64_t* cols,
                                                             int ncols) {
  typedef typename Vectors<T>::vec vec;
  typedef typename Vectors<T>::unaligned unaligned;
  constexpr int kP = T::kOW;
  const ConvParams& p = a.p;
  const int64_t C = p.in_channels;
  vec acc[kP];
  for (int j = 0; j < kP; ++j) acc[j] = vec{};
  for (int i = 0; i < nrows; ++i) {
    const int64_t r = rows[i], oh = (ih + p.pad_h - r * p.dilation_h) / p.stride_h;
    const float* gorow = a.go + ((n * p.out_h + oh) * p.out_w) * C + c0;
    for (int k = 0; k < ncols; ++k) {
      const int64_t s = cols[k];
      const vec w = *reinterpret_cast<const unaligned*>(a.wt + (r * p.kernel_w + s) * C + c0);
      // Column iw0 + j * sw reads grad_output column ow0 + j.
      const int64_t ow0 = (iw0 + p.pad_w - s * p.dilation_w) / p.stride_w;
#pragma GCC unroll 16
      for (int j = 0; j < kP; ++j) {
        const int64_t ow = ow0 + j;
        if (kEdge && (ow < 0 || ow >= p.out_w || iw0 + j * p.stride_w >= p.in_w)) continue;
        acc[j] += *reinterpret_cast<const unaligned*>(gorow + ow * C) * w;
      }
    }
  }
  for (int j = 0; j < kP; ++j) {
    const int64_t iw = iw0 + j * p.stride_w;
    if (kEdge && iw >= p.in_w) break;
    *reinterpret_cast<unaligned*>(a.gi + ((n * p.in_h + ih) * p.in_w + iw) * C + c0) = acc[j];
  }
}

// Tasks [begin, end): grad_input row t % H of image t / H. At least one
// vector of channels (depthwise_nhwc_fits); channels past the last full
// vector are taken by the vector ending at the last channel.
template <typename T>
__attribute__((always_inline)) inline void dw_dgrad_nhwc_range(const DwDgradNhwcProblem& a,
                                                               int64_t begin, int64_t end) {
  constexpr int kP = T::kOW;
  const ConvParams& p = a.p;
  const int64_t C = p.in_channels;
  std::vector<int64_t> rows(size_t(p.kernel_h)), cols(size_t(p.kernel_w));
  for (int64_t t = begin; t < end; ++t) {
    const int64_t n = t / p.in_h, ih = t % p.in_h;
    int nrows = 0;
    for (int64_t r = 0; r < p.kernel_h; ++r) {
      const int64_t u = ih + p.pad_h - r * p.dilation_h;
      if (u >= 0 && u % p.stride_h == 0 && u / p.stride_h < p.out_h) rows[size_t(nrows++)] = r;
    }
    for (int64_t phase = 0; phase < std::min<int64_t>(p.stride_w, p.in_w); ++phase) {
      int ncols = 0;
      for (int64_t s = 0; s < p.kernel_w; ++s) {
        const int64_t u = phase + p.pad_w - s * p.dilation_w;
        // (u mod sw, for u of either sign)
        if (((u % p.stride_w) + p.stride_w) % p.stride_w == 0) cols[size_t(ncols++)] = s;
      }
      const int64_t count = (p.in_w - phase + p.stride_w - 1) / p.stride_w;  // columns of the phase
      for (int64_t q0 = 0; q0 < count; q0 += kP) {
        const int64_t iw0 = phase + q0 * p.stride_w;
        // Interior: every column of the run in the row, and every tap's
        // grad_output columns inside grad_output.
        bool edge = q0 + kP > count;
        for (int k = 0; k < ncols && !edge; ++k) {
          const int64_t u = iw0 + p.pad_w - cols[size_t(k)] * p.dilation_w;
          edge = u < 0 || u / p.stride_w + kP > p.out_w;
        }
        for (int64_t v = 0; v * T::kVL < C; ++v) {
          const int64_t c0 = std::min<int64_t>(v * T::kVL, C - T::kVL);
          if (edge) {
            dw_dgrad_nhwc_run<T, true>(a, n, ih, iw0, c0, rows.data(), nrows, cols.data(), ncols);
          } else {
            dw_dgrad_nhwc_run<T, false>(a, n, ih, iw0, c0, rows.data(), nrows, cols.data(), ncols);
          }
        }
      }
    }
  }
}
CONV2D_EXT_ISA_VARIANTS(dw_dgrad_nhwc, DwDgradNhwcProblem, dw_dgrad_nhwc_range)

// ---- narrow forward (few output channels per group, unit column stride):
// a task is one output row of one image and group; per block of up to
// kNarrowOut output channels, kNarrowVectors vectors of the row's pixels in
// registers, every (input channel, tap) kNarrowOut broadcast weights times
// unaligned loads of the padded input row.
constexpr int kNarrowOut = 4, kNarrowVectors = 4;

struct NarrowProblem {
  const ConvParams& p;
  const float *xpad, *w, *bias;
  float* y;
  int64_t hp, wp;
};

template <typename T>
__attribute__((always_inline)) inline void narrow_row(const NarrowProblem& a, int64_t n,
                                                      int64_t g, int64_t oh) {
  typedef float vec __attribute__((vector_size(T::kVL * sizeof(float))));
  typedef float vec_unaligned __attribute__((vector_size(T::kVL * sizeof(float)), aligned(4)));
  constexpr int kVL = T::kVL, kBlock = kVL * kNarrowVectors;
  const ConvParams& p = a.p;
  const int64_t cin = p.in_channels_per_group(), cout = p.out_channels_per_group();
  const int64_t taps = p.taps();
  const float* ximg = a.xpad + (n * p.in_channels + g * cin) * a.hp * a.wp;
  for (int64_t k0 = 0; k0 < cout; k0 += kNarrowOut) {
    // Channels past the group's end repeat its last and are dropped.
    const float* wk[kNarrowOut];
    for (int o = 0; o < kNarrowOut; ++o)
      wk[o] = a.w + (g * cout + std::min<int64_t>(k0 + o, cout - 1)) * cin * taps;
    const int64_t kn = std::min<int64_t>(kNarrowOut, cout - k0);
    // The reduction in runs of about kRunEntries entries, each summed from
    // zero and then added to the total (as pixel_block's).
    const int64_t run = std::max<int64_t>(1, kRunEntries / taps);  // channels a run
    for (int64_t ow0 = 0; ow0 < p.out_w; ow0 += kBlock) {
      alignas(64) float out[kNarrowOut][kBlock] = {};  // the total
      vec acc[kNarrowOut][kNarrowVectors];
      for (int o = 0; o < kNarrowOut; ++o) {
        const float b = a.bias && o < kn ? a.bias[g * cout + k0 + o] : 0.f;
        for (int u = 0; u < kNarrowVectors; ++u) acc[o][u] = vec{} + b;
      }
      for (int64_t c0 = 0; c0 < cin; c0 += run) {
        for (int64_t c = c0; c < std::min(cin, c0 + run); ++c) {
          const float* xc = ximg + (c * a.hp + oh * p.stride_h) * a.wp + ow0;
          for (int64_t r = 0; r < p.kernel_h; ++r) {
            const float* xr = xc + r * p.dilation_h * a.wp;
            for (int64_t s = 0; s < p.kernel_w; ++s) {
              const int64_t t = (c * p.kernel_h + r) * p.kernel_w + s;
              vec xv[kNarrowVectors];
              for (int u = 0; u < kNarrowVectors; ++u)
                xv[u] = *reinterpret_cast<const vec_unaligned*>(xr + s * p.dilation_w + u * kVL);
#pragma GCC unroll 4
              for (int o = 0; o < kNarrowOut; ++o) {
                const float wv = wk[o][t];
#pragma GCC unroll 4
                for (int u = 0; u < kNarrowVectors; ++u) acc[o][u] += wv * xv[u];
              }
            }
          }
        }
        add_to_sums<vec, kNarrowOut, kNarrowVectors, kVL>(acc, &out[0][0]);
      }
      const int64_t count = std::min<int64_t>(kBlock, p.out_w - ow0);
      for (int64_t o = 0; o < kn; ++o)
        std::memcpy(a.y + ((n * p.out_channels + g * cout + k0 + o) * p.out_h + oh) * p.out_w + ow0,
                    out[o], size_t(count) * sizeof(float));
    }
  }
}

template <typename T>
__attribute__((always_inline)) inline void narrow_range(const NarrowProblem& a, int64_t begin,
                                                        int64_t end) {
  for (int64_t t = begin; t < end; ++t) {
    const int64_t oh = t % a.p.out_h, ng = t / a.p.out_h;
    narrow_row<T>(a, ng / a.p.groups, ng % a.p.groups, oh);
  }
}
CONV2D_EXT_ISA_VARIANTS(narrow, NarrowProblem, narrow_range)

// ---- narrow wgrad (depthwise and other narrow layers, unit column
// stride): a task is one output channel; up to kWgradEntries of its
// (input channel, tap) entries at a time in vector registers, each the sum
// over every image and row of grad_output's pixels (a vector of a row)
// times the padded input under them, lanes added last.
constexpr int kWgradEntries = 16;

// The padded input's rows are split into stride_w phase rows of wq floats
// each (as the depthwise forward's), so that at any column stride a
// vector of output pixels reads consecutive floats.
struct NarrowWgradProblem {
  const ConvParams& p;
  const float *xpad, *go;
  float* gw;
  int64_t hp, wq;
};

// `go`: output channel k's grad_output plane of image 0, rows wr floats
// apart (wr >= out_w: where a row ends inside a vector, zeros up to the
// vector's end), images `image` floats apart.
template <typename T>
__attribute__((always_inline)) inline void wgrad_entries(const NarrowWgradProblem& a, int64_t k,
                                                         const float* go, int64_t wr,
                                                         int64_t image, int64_t e0,
                                                         int64_t count) {
  typedef float vec __attribute__((vector_size(T::kVL * sizeof(float))));
  typedef float vec_unaligned __attribute__((vector_size(T::kVL * sizeof(float)), aligned(4)));
  constexpr int kVL = T::kVL;
  const ConvParams& p = a.p;
  const int64_t row = p.stride_w * a.wq;  // a padded row's floats
  const int64_t cin = p.in_channels_per_group(), taps = p.taps();
  const int64_t c0 = k / p.out_channels_per_group() * cin;  // the group's first input channel
  // Each entry's input offset from its pixel's row in the group's first
  // plane; entries past the end repeat the last and are dropped.
  int64_t off[kWgradEntries];
  for (int e = 0; e < kWgradEntries; ++e) {
    const int64_t entry = e0 + std::min<int64_t>(e, count - 1);
    const int64_t c = entry / taps, tap = entry % taps;
    const int64_t col = (tap % p.kernel_w) * p.dilation_w;
    off[e] = (c * a.hp + (tap / p.kernel_w) * p.dilation_h) * row +
             (col % p.stride_w) * a.wq + col / p.stride_w;
  }
  typedef int ivec __attribute__((vector_size(T::kVL * sizeof(int))));
  vec acc[kWgradEntries];
  for (int t = 0; t < kWgradEntries; ++t) acc[t] = vec{};
  // A row's last, partial vector: grad_output has zeros past the row, and
  // the input there is selected away (0 times an input pixel no tap reads,
  // maybe infinite, would be NaN).
  const int64_t full = p.out_w - p.out_w % kVL;
  ivec keep;
  {
    int lanes[kVL];
    for (int l = 0; l < kVL; ++l) lanes[l] = l < p.out_w - full ? -1 : 0;
    std::memcpy(&keep, lanes, sizeof(keep));
  }
  for (int64_t n = 0; n < p.batch; ++n) {
    const float* xplane = a.xpad + (n * p.in_channels + c0) * a.hp * row;
    const float* goplane = go + n * image;
    for (int64_t oh = 0; oh < p.out_h; ++oh) {
      const float* grow = goplane + oh * wr;
      const float* xrow = xplane + oh * p.stride_h * row;
      for (int64_t ow0 = 0; ow0 < full; ow0 += kVL) {
        const vec gv = *reinterpret_cast<const vec_unaligned*>(grow + ow0);
#pragma GCC unroll 16
        for (int t = 0; t < kWgradEntries; ++t)
          acc[t] += gv * *reinterpret_cast<const vec_unaligned*>(xrow + ow0 + off[t]);
      }
      if (full < p.out_w) {
        const vec gv = *reinterpret_cast<const vec_unaligned*>(grow + full);
#pragma GCC unroll 16
        for (int t = 0; t < kWgradEntries; ++t) {
          const vec xv = *reinterpret_cast<const vec_unaligned*>(xrow + full + off[t]);
          acc[t] += gv * (keep ? xv : vec{});
        }
      }
    }
  }
  // The lanes summed pairwise (in order they lost PyTorch's accuracy).
  for (int64_t e = 0; e < count; ++e)
    a.gw[k * cin * taps + e0 + e] = pairwise_lane_sum<vec, kVL>(acc[e]);
}

template <typename T>
__attribute__((always_inline)) inline void narrow_wgrad_range(const NarrowWgradProblem& a,
                                                              int64_t begin, int64_t end) {
  const ConvParams& p = a.p;
  const int64_t entries = p.in_channels_per_group() * p.taps();
  // Where a row ends inside a vector, each task copies its channel's
  // grad_output with zeros past every row once, rather than each entry
  // pass building every row's last vector.
  const int64_t plane = p.out_h * p.out_w;
  const int64_t wr = (p.out_w + T::kVL - 1) / T::kVL * T::kVL;
  std::vector<float> padded(wr == p.out_w ? 0 : size_t(p.batch * p.out_h * wr), 0.f);
  for (int64_t k = begin; k < end; ++k) {
    const float* go = a.go + k * plane;
    int64_t image = p.out_channels * plane;
    if (wr != p.out_w) {
      for (int64_t n = 0; n < p.batch; ++n)
        for (int64_t oh = 0; oh < p.out_h; ++oh)
          std::memcpy(padded.data() + (n * p.out_h + oh) * wr,
                      a.go + (n * p.out_channels + k) * plane + oh * p.out_w,
                      size_t(p.out_w) * sizeof(float));
      go = padded.data();
      image = p.out_h * wr;
    }
    for (int64_t e0 = 0; e0 < entries; e0 += kWgradEntries)
      wgrad_entries<T>(a, k, go, wr, image, e0,
                       std::min<int64_t>(kWgradEntries, entries - e0));
  }
}
CONV2D_EXT_ISA_VARIANTS(narrow_wgrad, NarrowWgradProblem, narrow_wgrad_range)

int block_channels(Isa i) {
  return pick(i, Avx512::kKB, Avx2::kKB, Baseline::kKB);
}

// Whether the layer's output channels go in blocks of one vector
// (OneVector): a group of at most a vector's channels.
bool one_vector(Isa i, const ConvParams& p) {
  return p.out_channels_per_group() <= pick(i, Avx512::kVL, Avx2::kVL, Baseline::kVL);
}
int channel_block(Isa i, const ConvParams& p) {
  return one_vector(i, p) ? pick(i, Avx512::kVL, Avx2::kVL, Baseline::kVL) : block_channels(i);
}
int pixel_block_width(Isa i, const ConvParams& p) {
  const int kow = pick(i, Avx512::kOW, Avx2::kOW, Baseline::kOW);
  return one_vector(i, p) ? 2 * kow : kow;
}

}  // namespace

Isa isa() {
  struct Has {
    bool avx512, avx2;
  };
  static const Has has = [] {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return Has{__builtin_cpu_supports("avx512f") != 0,
               __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")};
#else
    return Has{false, false};
#endif
  }();
  if (has.avx512 && option(Option::kCpuAvx512)) return Isa::kAvx512;
  if (has.avx2 && option(Option::kCpuAvx2)) return Isa::kAvx2;
  return Isa::kBaseline;
}

bool blocked_fits(const ConvParams& p) {
  return 4 * p.out_channels_per_group() >= block_channels(isa());
}

namespace {
// The input copied zero-padded: planes of hp x wp, the padding on the top
// and left, and the bottom and right out to the kernel's reach.
struct Padded {
  std::vector<float> data;
  int64_t hp, wp;
};
struct Extents {
  int64_t hp, wp;
};
Extents padded_extents(const ConvParams& p) {
  const int64_t reach_h = (p.out_h - 1) * p.stride_h + (p.kernel_h - 1) * p.dilation_h + 1;
  const int64_t reach_w = (p.out_w - 1) * p.stride_w + (p.kernel_w - 1) * p.dilation_w + 1;
  return {std::max(reach_h, p.in_h + p.pad_h), std::max(reach_w, p.in_w + p.pad_w)};
}
Padded pad_input(const ConvParams& p, const float* x, int64_t slack = 0) {
  const Extents e = padded_extents(p);
  Padded padded{{}, e.hp, e.wp};
  const int64_t hp = padded.hp, wp = padded.wp, planes = p.batch * p.in_channels;
  padded.data.assign(size_t(planes * hp * wp + slack), 0.f);
  float* const out = padded.data.data();
  at::parallel_for(0, planes, 1, [&](int64_t begin, int64_t end) {
    for (int64_t pl = begin; pl < end; ++pl)
      for (int64_t h = 0; h < p.in_h; ++h)
        std::memcpy(out + (pl * hp + h + p.pad_h) * wp + p.pad_w,
                    x + (pl * p.in_h + h) * p.in_w, size_t(p.in_w) * sizeof(float));
  });
  return padded;
}
// The same with each padded row split into stride_w phase rows (phase q:
// padded columns q, q + stride_w, ...), wq = wp / stride_w rounded up
// floats each; `wp` of the result is wq. At unit stride, pad_input's.
Padded pad_input_phases(const ConvParams& p, const float* x, int64_t slack) {
  const int64_t sw = p.stride_w;
  if (sw == 1) return pad_input(p, x, slack);
  const Extents e = padded_extents(p);
  const int64_t wq = (e.wp + sw - 1) / sw, row = sw * wq;
  Padded padded{{}, e.hp, wq};
  const int64_t planes = p.batch * p.in_channels;
  padded.data.assign(size_t(planes * e.hp * row + slack), 0.f);
  float* const out = padded.data.data();
  at::parallel_for(0, planes, 1, [&](int64_t begin, int64_t end) {
    for (int64_t pl = begin; pl < end; ++pl)
      for (int64_t h = 0; h < p.in_h; ++h) {
        const float* src = x + (pl * p.in_h + h) * p.in_w;
        float* dst = out + (pl * e.hp + h + p.pad_h) * row;
        for (int64_t q = 0; q < sw; ++q)
          for (int64_t i = 0, w = q - p.pad_w; i < wq; ++i, w += sw)
            if (w >= 0 && w < p.in_w) dst[q * wq + i] = src[w];
      }
  });
  return padded;
}

// The same for channels_last x: [N][hp][wp][C].
Padded pad_input_nhwc(const ConvParams& p, const float* x, int64_t slack) {
  const Extents e = padded_extents(p);
  Padded padded{{}, e.hp, e.wp};
  const int64_t C = p.in_channels;
  padded.data.assign(size_t(p.batch * e.hp * e.wp * C + slack), 0.f);
  float* const out = padded.data.data();
  at::parallel_for(0, p.batch * p.in_h, 1, [&](int64_t begin, int64_t end) {
    for (int64_t nh = begin; nh < end; ++nh) {
      const int64_t n = nh / p.in_h, h = nh % p.in_h;
      std::memcpy(out + ((n * e.hp + h + p.pad_h) * e.wp + p.pad_w) * C,
                  x + nh * p.in_w * C, size_t(p.in_w * C) * sizeof(float));
    }
  });
  return padded;
}
}  // namespace

namespace {
// A pointwise layer (1x1, unit stride, no padding) reads and writes each
// plane as one run of pixels, so any split of it into rows computes the
// same: the split whose row length best fills the kOW-pixel blocks (a
// 14-pixel row fills two blocks of 12 to 58%) while every thread still
// gets a row, longer rows on a tie (a row task reads all the packed
// weights once).
ConvParams pointwise_rows(const ConvParams& p, int kow) {
  if (p.kernel_h != 1 || p.kernel_w != 1 || p.stride_h != 1 || p.stride_w != 1 ||
      p.pad_h != 0 || p.pad_w != 0 || p.in_h != p.out_h || p.in_w != p.out_w)
    return p;
  const int64_t pixels = p.out_h * p.out_w, planes = p.batch * p.groups;
  const int64_t threads = at::get_num_threads();
  auto fill = [&](int64_t width) {
    return double(width) / double((width + kow - 1) / kow * kow);
  };
  int64_t best = p.out_w;
  for (int64_t width = 1; width <= std::min<int64_t>(pixels, 256); ++width)
    if (pixels % width == 0 && planes * (pixels / width) >= threads &&
        fill(width) >= fill(best) - 1e-9)
      best = width;
  ConvParams q = p;
  q.in_h = q.out_h = pixels / best;
  q.in_w = q.out_w = best;
  return q;
}
}  // namespace

void fprop_blocked(const ConvParams& layer, const float* x, const float* w, const float* bias,
                   float* y, WeightOrder order) {
  const Isa i = isa();
  const ConvParams p = pointwise_rows(layer, pixel_block_width(i, layer));
  const Padded xpad = pad_input(p, x);
  const std::vector<float> packed = pack_weights(p, w, channel_block(i, p), order);
  const Problem a{p, xpad.data.data(), packed.data(), bias, y, xpad.hp, xpad.wp};
  auto* run = one_vector(i, p) ? pick(i, &tasks_one_avx512, &tasks_one_avx2, &tasks_one_baseline)
                               : pick(i, &tasks_avx512, &tasks_avx2, &tasks_baseline);
  at::parallel_for(0, p.batch * p.groups * p.out_h, 1,
                   [&](int64_t begin, int64_t end) { run(a, begin, end); });
}

bool blocked_nhwc_fits(const ConvParams& p) { return blocked_fits(p); }

void fprop_blocked_nhwc(const ConvParams& layer, const float* x, const float* w,
                        const float* bias, float* y, WeightOrder order) {
  const Isa i = isa();
  const ConvParams p = pointwise_rows(layer, pixel_block_width(i, layer));
  const Padded xpad = pad_input_nhwc(p, x, 0);
  const std::vector<float> packed = pack_weights(p, w, channel_block(i, p), order);
  const Problem a{p, xpad.data.data(), packed.data(), bias, y, xpad.hp, xpad.wp};
  auto* run =
      one_vector(i, p)
          ? pick(i, &tasks_nhwc_one_avx512, &tasks_nhwc_one_avx2, &tasks_nhwc_one_baseline)
          : pick(i, &tasks_nhwc_avx512, &tasks_nhwc_avx2, &tasks_nhwc_baseline);
  at::parallel_for(0, p.batch * p.out_h, 1,
                   [&](int64_t begin, int64_t end) { run(a, begin, end); });
}

std::string blocked_isa() {
  switch (isa()) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kBaseline:
      break;
  }
  return "default";
}

namespace {
// Runs of entry tiles long enough to share each chunk of grad_output,
// short enough that every thread gets several tasks.
using WgradRun = void (*)(const WgradProblem&, int64_t, int64_t);
void run_wgrad(const ConvParams& p, const Padded& xpad, const float* go_t, int64_t kpad,
               int64_t go_pixel, int64_t go_group, float* grad_w, WgradRun run) {
  const int64_t kblocks = kpad / channel_block(isa(), p);
  const int64_t tiles = (p.in_channels_per_group() * p.taps() + kEntries - 1) / kEntries;
  const int64_t tasks_wanted = 4 * int64_t(at::get_num_threads());
  const int64_t per_task = std::max<int64_t>(
      1, std::min<int64_t>(tiles, p.groups * kblocks * tiles / tasks_wanted));
  const WgradProblem a{p,       xpad.data.data(), go_t,     grad_w, xpad.hp, xpad.wp, kpad,
                       per_task, go_pixel,         go_group};
  const int64_t runs = (tiles + per_task - 1) / per_task;
  at::parallel_for(0, p.groups * kblocks * runs, 1,
                   [&](int64_t begin, int64_t end) { run(a, begin, end); });
}
}  // namespace

void wgrad_blocked(const ConvParams& p, const float* grad_out, const float* x, float* grad_w) {
  const Isa i = isa();
  const int64_t kb = channel_block(i, p);
  const int64_t cout = p.out_channels_per_group();
  const int64_t kblocks = (cout + kb - 1) / kb, kpad = kblocks * kb;
  const Padded xpad = pad_input(p, x);
  // grad_output as [group][image][row][column][kpad channels], zeros past
  // the group's channels.
  const int64_t pixels = p.out_h * p.out_w;
  // Transposed a run of kRun pixels at a time, so that the run's
  // destination rows stay in cache while every channel is written.
  constexpr int64_t kRun = 16;
  const int64_t pixel_runs = (pixels + kRun - 1) / kRun;
  std::vector<float> go_t(size_t(p.groups * p.batch * pixels * kpad), 0.f);
  at::parallel_for(0, p.groups * p.batch * pixel_runs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t gn = task / pixel_runs, q0 = (task % pixel_runs) * kRun;
      const int64_t g = gn / p.batch, n = gn % p.batch;
      const int64_t qn = std::min<int64_t>(kRun, pixels - q0);
      float* dst = go_t.data() + ((g * p.batch + n) * pixels + q0) * kpad;
      for (int64_t k = 0; k < cout; ++k) {
        const float* src = grad_out + (n * p.out_channels + g * cout + k) * pixels + q0;
        for (int64_t q = 0; q < qn; ++q) dst[q * kpad + k] = src[q];
      }
    }
  });
  run_wgrad(p, xpad, go_t.data(), kpad, kpad, p.batch * pixels * kpad, grad_w,
            one_vector(i, p) ? pick(i, &wgrad_one_avx512, &wgrad_one_avx2, &wgrad_one_baseline)
                             : pick(i, &wgrad_avx512, &wgrad_avx2, &wgrad_baseline));
}

bool blocked_wgrad_nhwc_fits(const ConvParams& p) { return blocked_fits(p); }

void wgrad_blocked_nhwc(const ConvParams& p, const float* grad_out, const float* x,
                        float* grad_w) {
  const Isa i = isa();
  const int64_t kb = channel_block(i, p);
  const int64_t cout = p.out_channels_per_group();
  const int64_t kpad = (cout + kb - 1) / kb * kb;
  const Padded xpad = pad_input_nhwc(p, x, 0);
  // grad_output [image][row][column][group][K per group] is already the
  // repacked layout where each group's channels fill whole channel blocks;
  // else each group's run of each pixel is widened with zeros.
  std::vector<float> widened;
  const float* go_t = grad_out;
  if (kpad != cout) {
    const int64_t pixels = p.batch * p.out_h * p.out_w;
    widened.assign(size_t(pixels * p.groups * kpad), 0.f);
    at::parallel_for(0, pixels, 1024, [&](int64_t begin, int64_t end) {
      for (int64_t q = begin; q < end; ++q)
        for (int64_t g = 0; g < p.groups; ++g)
          std::memcpy(widened.data() + (q * p.groups + g) * kpad,
                      grad_out + q * p.out_channels + g * cout, size_t(cout) * sizeof(float));
    });
    go_t = widened.data();
  }
  run_wgrad(p, xpad, go_t, kpad, p.groups * kpad, kpad, grad_w,
            one_vector(i, p) ? pick(i, &wgrad_nhwc_one_avx512, &wgrad_nhwc_one_avx2,
                                    &wgrad_nhwc_one_baseline)
                             : pick(i, &wgrad_nhwc_avx512, &wgrad_nhwc_avx2, &wgrad_nhwc_baseline));
}

bool depthwise_fits(const ConvParams& p) {
  return p.in_channels_per_group() == 1 && p.groups > 1;
}

void fprop_depthwise(const ConvParams& p, const float* x, const float* w, const float* bias,
                     float* y) {
  const Isa i = isa();
  const Extents e = padded_extents(p);
  const DwProblem a{p, x, w, bias, y, e.hp, e.wp, (e.wp + p.stride_w - 1) / p.stride_w};
  auto* run = pick(i, &dw_avx512, &dw_avx2, &dw_baseline);
  at::parallel_for(0, p.batch * p.out_channels, 1,
                   [&](int64_t begin, int64_t end) { run(a, begin, end); });
}

bool depthwise_dgrad_s2_fits(const ConvParams& p) {
  return depthwise_fits(p) && p.out_channels == p.in_channels && p.stride_w == 2 &&
         p.kernel_h <= 64 && p.kernel_w <= 16;
}

void dgrad_depthwise_s2(const ConvParams& p, const float* grad_out, const float* w,
                        float* grad_in) {
  const Isa i = isa();
  const int64_t vl = pick(i, Avx512::kVL, Avx2::kVL, Baseline::kVL);
  // Phase f's q-th column reads grad_output column q + (f + pad_w - s *
  // dilation_w) / 2 for q below half the row plus a vector: margins that
  // hold the farthest offsets either side.
  const int64_t reach = (p.kernel_w - 1) * p.dilation_w;
  const int64_t margin = (reach + 1) / 2 + 1;
  const int64_t right = (p.in_w + 1) / 2 + vl + (p.pad_w + 2) / 2 + 1;
  const int64_t qp = margin + std::max(p.out_w, right);
  const DwDgradS2Problem a{p, grad_out, w, grad_in, margin, qp};
  auto* run = pick(i, &dw_dgrad_s2_avx512, &dw_dgrad_s2_avx2, &dw_dgrad_s2_baseline);
  at::parallel_for(0, p.batch * p.in_channels, 1,
                   [&](int64_t begin, int64_t end) { run(a, begin, end); });
}

bool depthwise_nhwc_fits(const ConvParams& p) {
  // At least a vector of channels: the kernels take the channels past the
  // last full vector as the vector ending at the last channel.
  const Isa i = isa();
  return depthwise_fits(p) && p.out_channels == p.in_channels &&
         p.out_channels >= pick(i, Avx512::kVL, Avx2::kVL, Baseline::kVL);
}

void fprop_depthwise_nhwc(const ConvParams& p, const float* x, const float* w, const float* bias,
                          float* y) {
  const int64_t C = p.out_channels;
  const std::vector<float> wt = tap_major(w, C, p.taps());  // the weight [C][1][R][S] as [R*S][C]
  const Isa i = isa();
  // Two rows a task at unit stride and dilation, where the two rows'
  // accumulators and weights fit the registers (beyond AVX-512, 3 columns
  // of taps), and where the operands fit a core's L2: there the forward
  // computes, and pairs save loads; on operands from memory single rows,
  // which stream the input and output one row at a time, ran faster.
  const int64_t bytes = int64_t(sizeof(float)) * C * p.batch *
                        (p.in_h * p.in_w + p.out_h * p.out_w);
  const bool pairs =
      bytes <= kCacheBytes && p.stride_h == 1 && p.stride_w == 1 && p.dilation_h == 1 &&
      p.dilation_w == 1 &&
      (p.kernel_w == 3 || (i == Isa::kAvx512 && (p.kernel_w == 5 || p.kernel_w == 7)));
  const DwNhwcProblem a{p, x, wt.data(), bias, y, pairs};
  auto* run = pick(i, &dw_nhwc_avx512, &dw_nhwc_avx2, &dw_nhwc_baseline);
  at::parallel_for(0, p.batch * (pairs ? (p.out_h + 1) / 2 : p.out_h), 1,
                   [&](int64_t begin, int64_t end) { run(a, begin, end); });
}

void dgrad_depthwise_nhwc(const ConvParams& p, const float* grad_out, const float* w,
                          float* grad_in) {
  const std::vector<float> wt = tap_major(w, p.in_channels, p.taps());  // [R*S][C]
  const Isa i = isa();
  const DwDgradNhwcProblem a{p, grad_out, wt.data(), grad_in};
  auto* run = pick(i, &dw_dgrad_nhwc_avx512, &dw_dgrad_nhwc_avx2, &dw_dgrad_nhwc_baseline);
  at::parallel_for(0, p.batch * p.in_h, 1, [&](int64_t begin, int64_t end) { run(a, begin, end); });
}

bool depthwise_wgrad_nhwc_fits(const ConvParams& p) {
  return depthwise_nhwc_fits(p) && (p.stride_w == 1 || p.stride_w == 2) && p.dilation_w == 1 &&
         (p.kernel_w == 3 || p.kernel_w == 5 || p.kernel_w == 7);
}

void wgrad_depthwise_nhwc(const ConvParams& p, const float* grad_out, const float* x,
                          float* grad_w) {
  const Isa i = isa();
  const int64_t vl = pick(i, Avx512::kVL, Avx2::kVL, Baseline::kVL);
  const int64_t C = p.out_channels, taps = p.taps(), rows = p.batch * p.out_h;
  const int64_t blocks = (C + vl - 1) / vl;
  const int64_t chunk_rows = nhwc_wgrad_chunk_rows(C, p.out_w, p.in_w, p.stride_h);
  const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
  std::vector<float> partial(size_t(chunks * taps * C));
  const bool fetch = int64_t(sizeof(float)) * C *
                         (p.batch * (p.in_h * p.in_w + p.out_h * p.out_w)) > kCacheBytes;
  const DwWgradNhwcProblem a{p, x, grad_out, partial.data(), chunk_rows, fetch};
  auto* run = pick(i, &dw_wgrad_nhwc_avx512, &dw_wgrad_nhwc_avx2, &dw_wgrad_nhwc_baseline);
  at::parallel_for(0, chunks * blocks, 1, [&](int64_t begin, int64_t end) { run(a, begin, end); });
  // grad_w [C][R*S]: each weight the sum of its chunks' sums, in chunk order.
  at::parallel_for(0, C, 16, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      for (int64_t t = 0; t < taps; ++t) {
        float sum = 0.f;
        for (int64_t k = 0; k < chunks; ++k) sum += partial[size_t((k * taps + t) * C + c)];
        grad_w[c * taps + t] = sum;
      }
  });
}

bool narrow_fits(const ConvParams& p) { return p.stride_w == 1; }

void fprop_narrow(const ConvParams& p, const float* x, const float* w, const float* bias,
                  float* y) {
  const Isa i = isa();
  // Slack for a row's last block, read past the row's end and dropped.
  const Padded xpad = pad_input(p, x, int64_t(Avx512::kVL) * kNarrowVectors + 1);
  const NarrowProblem a{p, xpad.data.data(), w, bias, y, xpad.hp, xpad.wp};
  auto* run = pick(i, &narrow_avx512, &narrow_avx2, &narrow_baseline);
  at::parallel_for(0, p.batch * p.groups * p.out_h, 1,
                   [&](int64_t begin, int64_t end) { run(a, begin, end); });
}

void wgrad_narrow(const ConvParams& p, const float* grad_out, const float* x, float* grad_w) {
  const Isa i = isa();
  // Slack for the reads of a row's last, partial vector.
  const Padded xpad = pad_input_phases(p, x, int64_t(Avx512::kVL) + 1);
  const NarrowWgradProblem a{p, xpad.data.data(), grad_out, grad_w, xpad.hp, xpad.wp};
  auto* run = pick(i, &narrow_wgrad_avx512, &narrow_wgrad_avx2, &narrow_wgrad_baseline);
  at::parallel_for(0, p.out_channels, 1, [&](int64_t begin, int64_t end) { run(a, begin, end); });
}

}  // namespace cpu
}  // namespace conv2d_ext
