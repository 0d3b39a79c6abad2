// Autograd of the sequence operators: one node for a whole layer over T
// steps, whatever T. (The other cells' operators: autograd_rnn.h, registered
// at the end of this file.) Forward calls `<backend>_seq_forward` below autograd
// and saves the inputs, the output and the per-step activated gates (not the
// cell states: backward recomputes them from c0 and the gates);
// backward is `<backend>_seq_backward` (the reverse-time loop and the
// weight gradients over all T*B rows), called through the dispatcher.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <string_view>
#include <type_traits>

#include "autograd_common.h"
#include "autograd_rnn.h"
#include "cells/registry.h"
#include "lltm.h"

namespace lltm {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

OptTensor defined_or_none(const at::Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

template <std::size_t kBackend>
class SeqFunction : public torch::autograd::Function<SeqFunction<kBackend>> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weights,
                               const OptTensor& bias, const at::Tensor& h0, const at::Tensor& c0,
                               const OptTensor& lengths) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow(op_name(kBackend, "seq_forward").c_str(), "")
                               .template typed<SeqForwardSig>();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [output, h_n, c_n, gates] = op.call(input, weights, bias, h0, c0, lengths);
    // Not the bias: its gradient needs no value of it.
    ctx->save_for_backward({input, weights, h0, c0, output, gates, lengths.value_or(at::Tensor())});
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    ctx->mark_non_differentiable({gates});
    // Undefined output gradients (a loss on the output alone, say) are
    // passed on as such: the op skips their terms instead of adding zeros.
    ctx->set_materialize_grads(false);
    return {output, h_n, c_n, gates};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow(op_name(kBackend, "seq_backward").c_str(), "")
                               .template typed<SeqBackwardSig>();
    const auto saved = ctx->get_saved_variables();
    const OutputMask mask = needed_gradients(ctx);
    variable_list out;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      // grads[3] belongs to the non-differentiable gates.
      out = asked_only(
          op.call(defined_or_none(grads[0]), defined_or_none(grads[1]), defined_or_none(grads[2]), saved[0],
                  saved[1], saved[2], saved[3], saved[4], saved[5], defined_or_none(saved[6]), mask),
          mask);
    }
    out.emplace_back();  // lengths: not differentiable
    return once_differentiable(std::move(out), kBackend);
  }
};

template <std::size_t kBackend>
SeqForwardResult seq_forward_autograd(const at::Tensor& input, const at::Tensor& weights,
                                      const OptTensor& bias, const at::Tensor& h0, const at::Tensor& c0,
                                      const OptTensor& lengths) {
  auto out = SeqFunction<kBackend>::apply(input, weights, bias, h0, c0, lengths);
  return {out[0], out[1], out[2], out[3]};
}

// The name of compiled backend B, as autograd_rnn.h's templates take it.
template <std::size_t B>
struct CompiledBackend {
  static constexpr std::string_view kName = kCompiledBackends[B];
};

}  // namespace
}  // namespace lltm

TORCH_LIBRARY_IMPL(lltm, Autograd, m) {
  lltm::for_each_backend([&](auto backend) {
    constexpr std::size_t b = decltype(backend)::value;
    m.impl((lltm::backend_name(b) + "_seq_forward").c_str(), &lltm::seq_forward_autograd<b>);
    lltm::cells::for_each_cell([&](auto cell) {
      using Cell = decltype(cell);
      if constexpr (!std::is_same_v<Cell, lltm::cells::LLTM>)
        lltm::register_rnn_autograd<lltm::CompiledBackend<b>, Cell>(m);
    });
  });
}
