// Autograd of the cell operators, in C++ so that backward runs without the
// Python interpreter (the engine calls straight into the backward op).
//
// One torch::autograd::Function serves every backend: forward calls the
// backend's `<backend>_cell_forward` op below autograd and saves only what
// backward needs (new_cell, the activated gates, the inputs); backward is the
// backend's own `<backend>_cell_backward` op, called through the dispatcher
// so torch.compile and torch.export see it as one operator.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "autograd_common.h"
#include "lltm.h"

namespace lltm {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

template <std::size_t kBackend>
class CellFunction : public torch::autograd::Function<CellFunction<kBackend>> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weights,
                               const std::optional<at::Tensor>& bias, const at::Tensor& old_h,
                               const at::Tensor& old_cell) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow(op_name(kBackend, "cell_forward").c_str(), "")
                               .template typed<CellForwardSig>();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [new_h, new_cell, gates] = op.call(input, weights, bias, old_h, old_cell);
    // old_cell is not needed: d new_cell / d old_cell = 1.
    ctx->save_for_backward({new_cell, gates, input, weights, old_h});
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    ctx->mark_non_differentiable({gates});
    // Only the unused one of new_h / new_cell needs zeros; materialising
    // would also allocate them for the gates, which never get a gradient.
    ctx->set_materialize_grads(false);
    return {new_h, new_cell, gates};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow(op_name(kBackend, "cell_backward").c_str(), "")
                               .template typed<CellBackwardSig>();
    const auto saved = ctx->get_saved_variables();
    // grads[0..1]: new_h, new_cell (undefined when unused);
    // grads[2] belongs to the non-differentiable gates and is ignored.
    const auto grad_or_zeros = [&](const at::Tensor& grad) {
      return grad.defined() ? grad : at::zeros_like(saved[0]);
    };
    // Gradients nobody needs (inputs without requires_grad, a missing bias)
    // are not computed; the op returns empty placeholders for them.
    const OutputMask mask = needed_gradients(ctx);
    variable_list out;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      out = asked_only(op.call(grad_or_zeros(grads[0]), grad_or_zeros(grads[1]), saved[0], saved[1], saved[2],
                               saved[3], saved[4], mask),
                       mask);
    }
    return once_differentiable(std::move(out), kBackend);
  }
};

template <std::size_t kBackend>
CellForwardResult cell_forward_autograd(const at::Tensor& input, const at::Tensor& weights,
                                        const std::optional<at::Tensor>& bias, const at::Tensor& old_h,
                                        const at::Tensor& old_cell) {
  auto out = CellFunction<kBackend>::apply(input, weights, bias, old_h, old_cell);
  return {out[0], out[1], out[2]};
}

}  // namespace
}  // namespace lltm

TORCH_LIBRARY_IMPL(lltm, Autograd, m) {
  lltm::for_each_backend([&](auto backend) {
    constexpr std::size_t b = decltype(backend)::value;
    m.impl((lltm::backend_name(b) + "_cell_forward").c_str(), &lltm::cell_forward_autograd<b>);
  });
}
