// Autograd for the three ops, registered in C++ for every backend.
//
// A Python autograd kernel (torch.library.register_autograd) runs on every
// call, gradients wanted or not, and its host time per call was as much as
// the cuDNN call it is compared with, a visible share of a small layer's
// time. Here a call that needs no
// gradient only passes through, and one that does records a node.
//
// Each op's backward is written with the ops themselves, called through
// the dispatcher, which makes every pass differentiable again (double
// backward): for the bilinear maps fprop(x, w), dgrad(gy, w) and
// wgrad(gy, x) the adjoint of each argument is one of the other two passes.
// Sizes and geometry stay SymInts, so that torch.compile traces these
// backwards with dynamic shapes.
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <vector>

#include "conv_params.h"

namespace conv2d_ext {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using c10::SymInt;
using c10::SymIntArrayRef;

using FpropSig = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            SymIntArrayRef, SymIntArrayRef, SymIntArrayRef, SymInt);
// dgrad(grad_output, weight, input_size, ...), wgrad(grad_output, input, weight_size, ...)
using GradSig = at::Tensor(const at::Tensor&, const at::Tensor&, SymIntArrayRef, SymIntArrayRef,
                           SymIntArrayRef, SymIntArrayRef, SymInt);

template <typename Sig>
c10::TypedOperatorHandle<Sig> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}
const c10::TypedOperatorHandle<FpropSig>& fprop_op() {
  static const auto handle = op<FpropSig>("conv2d_ext::conv2d");
  return handle;
}
const c10::TypedOperatorHandle<GradSig>& dgrad_op() {
  static const auto handle = op<GradSig>("conv2d_ext::conv2d_backward_input");
  return handle;
}
const c10::TypedOperatorHandle<GradSig>& wgrad_op() {
  static const auto handle = op<GradSig>("conv2d_ext::conv2d_backward_weight");
  return handle;
}

// stride, padding, dilation, groups: what every pass of one layer shares.
struct Geometry {
  std::vector<SymInt> stride, padding, dilation;
  SymInt groups;

  void save(AutogradContext* ctx) const {
    ctx->saved_data["stride"] = SymIntArrayRef(stride);
    ctx->saved_data["padding"] = SymIntArrayRef(padding);
    ctx->saved_data["dilation"] = SymIntArrayRef(dilation);
    ctx->saved_data["groups"] = groups;
  }
  static Geometry load(AutogradContext* ctx) {
    return {ctx->saved_data["stride"].toSymIntVector(),
            ctx->saved_data["padding"].toSymIntVector(),
            ctx->saved_data["dilation"].toSymIntVector(), ctx->saved_data["groups"].toSymInt()};
  }
  at::Tensor fprop(const at::Tensor& x, const at::Tensor& w) const {
    return fprop_op().call(x, w, std::nullopt, stride, padding, dilation, groups);
  }
  at::Tensor dgrad(const at::Tensor& gy, const at::Tensor& w, SymIntArrayRef x_size) const {
    return dgrad_op().call(gy, w, x_size, stride, padding, dilation, groups);
  }
  at::Tensor wgrad(const at::Tensor& gy, const at::Tensor& x, SymIntArrayRef w_size) const {
    return wgrad_op().call(gy, x, w_size, stride, padding, dilation, groups);
  }
};

Geometry geometry(SymIntArrayRef stride, SymIntArrayRef padding, SymIntArrayRef dilation,
                  const SymInt& groups) {
  return {stride.vec(), padding.vec(), dilation.vec(), groups};
}

// A gradient with its parameter's strides: DDP's buckets are views with
// the parameter's strides and warn (and copy) when a gradient's differ. A
// copy only where the op's own choice (result_memory_format of the other
// operands) was another format, or the same one with other strides (one
// channel, 1 x 1 kernels); none for a parameter that is a view with gaps.
at::Tensor with_strides_of(const at::Tensor& grad, const at::Tensor& param) {
  if (!grad.defined() || !param.is_non_overlapping_and_dense() ||
      grad.sym_strides() == param.sym_strides())
    return grad;
  at::Tensor out = at::empty_like(param, grad.options(), at::MemoryFormat::Preserve);
  out.copy_(grad);
  return out;
}

// A gradient in `format`, as PyTorch's convolution gives it.
at::Tensor in_format(const at::Tensor& grad, at::MemoryFormat format) {
  if (!grad.defined() || grad.suggest_memory_format() == format) return grad;
  return grad.contiguous(format);
}

// backward returns a gradient per forward argument; the geometry's four
// have none.
variable_list grads(std::initializer_list<at::Tensor> tensor_grads) {
  variable_list out(tensor_grads);
  out.resize(out.size() + 4);
  return out;
}

// fprop(x, w) + b
struct Conv2dFunction : torch::autograd::Function<Conv2dFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, SymIntArrayRef stride,
                            SymIntArrayRef padding, SymIntArrayRef dilation, SymInt groups) {
    ctx->save_for_backward({input, weight});
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    geometry(stride, padding, dilation, groups).save(ctx);
    at::AutoDispatchBelowADInplaceOrView below;
    return fprop_op().call(input, weight, bias, stride, padding, dilation, groups);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &input = saved[0], &weight = saved[1], &grad = grad_outputs[0];
    const Geometry geo = Geometry::load(ctx);
    at::Tensor grad_input, grad_weight, grad_bias;
    // grad_input in the forward's format (the dgrad op chooses it from
    // grad_output, which usually has it); grad_weight with the weight's strides.
    if (ctx->needs_input_grad(0)) {
      grad_input = in_format(geo.dgrad(grad, weight, input.sym_sizes()),
                             result_memory_format(input, weight));
    }
    if (ctx->needs_input_grad(1)) {
      grad_weight = with_strides_of(geo.wgrad(grad, input, weight.sym_sizes()), weight);
    }
    // The bias is an edge only when it was given.
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) {
      // An input without channels gives an output without any (as
      // PyTorch's): the bias never reached it, and its gradient is 0.
      grad_bias = TORCH_GUARD_OR_FALSE(input.sym_size(1).sym_eq(0))
                      ? at::zeros_symint({weight.sym_size(0)}, grad.options())
                      : grad.sum({0, 2, 3});
    }
    return grads({grad_input, grad_weight, grad_bias});
  }
};

// dgrad(gy, w): <g, dgrad(gy, w)> = <fprop(g, w), gy>
struct DgradFunction : torch::autograd::Function<DgradFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad_output,
                            const at::Tensor& weight, SymIntArrayRef input_size,
                            SymIntArrayRef stride, SymIntArrayRef padding, SymIntArrayRef dilation,
                            SymInt groups) {
    ctx->save_for_backward({grad_output, weight});
    const Geometry geo = geometry(stride, padding, dilation, groups);
    geo.save(ctx);
    at::AutoDispatchBelowADInplaceOrView below;
    return geo.dgrad(grad_output, weight, input_size);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &grad_output = saved[0], &weight = saved[1], &grad = grad_outputs[0];
    const Geometry geo = Geometry::load(ctx);
    at::Tensor d_grad_output, d_weight;
    if (ctx->needs_input_grad(0)) d_grad_output = geo.fprop(grad, weight);
    if (ctx->needs_input_grad(1)) {
      d_weight = with_strides_of(geo.wgrad(grad_output, grad, weight.sym_sizes()), weight);
    }
    return grads({d_grad_output, d_weight, at::Tensor()});
  }
};

// wgrad(gy, x): <g, wgrad(gy, x)> = <fprop(x, g), gy>
struct WgradFunction : torch::autograd::Function<WgradFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad_output,
                            const at::Tensor& input, SymIntArrayRef weight_size,
                            SymIntArrayRef stride, SymIntArrayRef padding, SymIntArrayRef dilation,
                            SymInt groups) {
    ctx->save_for_backward({grad_output, input});
    const Geometry geo = geometry(stride, padding, dilation, groups);
    geo.save(ctx);
    at::AutoDispatchBelowADInplaceOrView below;
    return geo.wgrad(grad_output, input, weight_size);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &grad_output = saved[0], &input = saved[1], &grad = grad_outputs[0];
    const Geometry geo = Geometry::load(ctx);
    at::Tensor d_grad_output, d_input;
    if (ctx->needs_input_grad(0)) d_grad_output = geo.fprop(input, grad);
    if (ctx->needs_input_grad(1)) d_input = geo.dgrad(grad_output, grad, input.sym_sizes());
    return grads({d_grad_output, d_input, at::Tensor()});
  }
};

// Whether a call records a node: Function::apply builds one (and runs the
// forward's saves) even when nothing needs a gradient.
bool records_graph(const at::Tensor& a, const at::Tensor& b,
                   const std::optional<at::Tensor>& c = std::nullopt) {
  return at::GradMode::is_enabled() &&
         (a.requires_grad() || b.requires_grad() ||
          (c.has_value() && c->defined() && c->requires_grad()));
}

at::Tensor conv2d_autograd(const at::Tensor& input, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, SymIntArrayRef stride,
                           SymIntArrayRef padding, SymIntArrayRef dilation, SymInt groups) {
  if (records_graph(input, weight, bias)) {
    return Conv2dFunction::apply(input, weight, bias, stride, padding, dilation,
                                 std::move(groups));
  }
  at::AutoDispatchBelowADInplaceOrView below;
  return fprop_op().call(input, weight, bias, stride, padding, dilation, std::move(groups));
}
at::Tensor dgrad_autograd(const at::Tensor& grad_output, const at::Tensor& weight,
                          SymIntArrayRef input_size, SymIntArrayRef stride, SymIntArrayRef padding,
                          SymIntArrayRef dilation, SymInt groups) {
  if (records_graph(grad_output, weight)) {
    return DgradFunction::apply(grad_output, weight, input_size, stride, padding, dilation,
                                std::move(groups));
  }
  at::AutoDispatchBelowADInplaceOrView below;
  return dgrad_op().call(grad_output, weight, input_size, stride, padding, dilation,
                         std::move(groups));
}
at::Tensor wgrad_autograd(const at::Tensor& grad_output, const at::Tensor& input,
                          SymIntArrayRef weight_size, SymIntArrayRef stride,
                          SymIntArrayRef padding, SymIntArrayRef dilation, SymInt groups) {
  if (records_graph(grad_output, input)) {
    return WgradFunction::apply(grad_output, input, weight_size, stride, padding, dilation,
                                std::move(groups));
  }
  at::AutoDispatchBelowADInplaceOrView below;
  return wgrad_op().call(grad_output, input, weight_size, stride, padding, dilation,
                         std::move(groups));
}

}  // namespace
}  // namespace conv2d_ext

TORCH_LIBRARY_IMPL(conv2d_ext, Autograd, m) {
  m.impl("conv2d", &conv2d_ext::conv2d_autograd);
  m.impl("conv2d_backward_input", &conv2d_ext::dgrad_autograd);
  m.impl("conv2d_backward_weight", &conv2d_ext::wgrad_autograd);
}
