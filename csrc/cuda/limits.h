// Hardware limits every kernel family's layout checks against, known per
// architecture so that the plan can decide without a device query.
#pragma once

#include <cstdint>

#include <c10/macros/Macros.h>

namespace conv2d_ext {

// What the tensor-copy engine (TMA) takes, for the sm_90 kernels that stage
// NCHW boxes with it: at most 256 elements per box dimension, rows stepped
// over by at most 8 (its element stride).
constexpr int kMaxTmaBox = 256;
constexpr int kMaxTmaElementStride = 8;

// Tiles of `rows` output rows of one dilation phase (rows oh0 + dilation*r)
// that cover `out_h` rows: the sm_90 kernels' row tiling, which lets a
// dilated halo be one TMA box with the dilation as its row step.
inline int phase_row_tiles(int64_t out_h, int rows, int64_t dilation_h) {
  const int64_t span = rows * dilation_h;
  return static_cast<int>((out_h + span - 1) / span * dilation_h);
}
// First output row of row tile `tile_h` of that tiling.
C10_HOST_DEVICE inline int phase_row0(int tile_h, int rows, int dilation_h) {
  return (tile_h / dilation_h) * rows * dilation_h + tile_h % dilation_h;
}

// Largest dynamic shared memory one block may opt into on a GPU of compute
// capability `sm`. Per-architecture constants (CUDA programming guide), so
// that the plan can decide without a device query.
inline int64_t max_block_smem_bytes(int sm) {
  if (sm == 90 || sm >= 100) return 227 * 1024;
  if (sm == 80 || sm == 87) return 163 * 1024;
  return 99 * 1024;  // sm_86, sm_89 and others
}

}  // namespace conv2d_ext
