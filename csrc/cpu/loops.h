// Index helpers shared by the CPU passes.
#pragma once

#include <algorithm>
#include <cstdint>

namespace conv2d_ext {
namespace cpu {

inline int64_t floor_div(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// Output positions o in [lo, hi) whose input position o * stride + offset
// lies inside [0, in_extent): the loops over o then need no bounds checks.
struct Range {
  int64_t lo, hi;
};

inline Range valid_outputs(int64_t out_extent, int64_t in_extent,
                           int64_t stride, int64_t offset) {
  const int64_t lo = std::max<int64_t>(0, floor_div(-offset + stride - 1, stride));
  const int64_t hi =
      std::min<int64_t>(out_extent, floor_div(in_extent - 1 - offset, stride) + 1);
  return {lo, std::max(lo, hi)};
}

}  // namespace cpu
}  // namespace conv2d_ext
