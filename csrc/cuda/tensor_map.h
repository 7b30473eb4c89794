// Tensor maps for Hopper's tensor-copy engine (TMA), shared by the sm_90
// kernels.
#pragma once

#include <ATen/core/TensorBase.h>
#include <cuda.h>

namespace conv2d_ext {
namespace cuda {

// A contiguous float32 NCHW tensor as a 4-D tensor map (W innermost) read
// in boxes of box_w columns x box_h rows x box_c channels of one image,
// every row_step-th row (box_h counts the rows stepped over too); reads
// outside the tensor give zeros. Needs a 16-byte aligned base and rows of
// a multiple of 16 bytes.
CUtensorMap nchw_tensor_map(const at::TensorBase& t, uint32_t box_w, uint32_t box_h, uint32_t box_c,
                            uint32_t row_step, bool swizzle_128b = false);

// The same tensor with the box's channels outside its columns and inside
// its rows (coordinates: column, channel, row, image): a box lands in
// shared memory as [row][channel][column].
CUtensorMap nwch_box_tensor_map(const at::TensorBase& t, uint32_t box_w, uint32_t box_c,
                                uint32_t box_h, bool swizzle_128b);

}  // namespace cuda
}  // namespace conv2d_ext
