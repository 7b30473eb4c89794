#include "plan.h"

#include <ATen/Context.h>
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#else
#include <torch/version.h>
#endif

namespace conv2d_ext {

bool allow_tf32_conv() {
  // Since the per-operator precision API, asking without an operator throws
  // when conv and RNN flags differ; ask for convolutions explicitly.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 10)
  return at::globalContext().allowTF32CuDNN(at::Float32Op::CONV);
#else
  return at::globalContext().allowTF32CuDNN();
#endif
}

MathMode math_mode(at::ScalarType dtype) {
  return (dtype == at::kFloat && allow_tf32_conv()) ? MathMode::kTF32
                                                    : MathMode::kIEEE;
}

Plan choose_plan(const ConvParams& p, Pass pass, at::ScalarType dtype) {
  (void)p;
  (void)pass;
  Plan plan;
  plan.math = math_mode(dtype);
  // Only the FFMA direct kernels exist so far; they are FP32-accurate, so
  // they serve both modes.
  plan.algo = Algo::kDirect;
  return plan;
}

const char* to_string(Algo algo) {
  switch (algo) {
    case Algo::kDirect:
      return "direct";
  }
  return "?";
}

const char* to_string(MathMode math) {
  return math == MathMode::kTF32 ? "tf32" : "ieee";
}

}  // namespace conv2d_ext
