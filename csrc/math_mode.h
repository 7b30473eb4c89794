// How float32 products are formed, one name from the plan down to the
// kernels' template arguments.
#pragma once

namespace conv2d_ext {

// kIEEE must be FP32-accurate: on tensor cores that is 3xTF32 (each operand
// split into a TF32 big part and a TF32 small part, three products, only
// small*small dropped; mma.cuh has the bounds), elsewhere FFMA. kTF32 may
// round operands to TF32 (PyTorch's default for convolutions): one product.
enum class MathMode { kIEEE, kTF32 };

}  // namespace conv2d_ext
