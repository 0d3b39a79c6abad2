// Autograd of a seam cell's sequence operator, lltm::<b>_<cell>_seq_forward
// (rnn.h), written once for every cell and backend, in C++ like the LLTM
// operators' own (autograd_seq.cpp): one node for the whole layer, whatever
// T. A formula registered from Python (torch.library.register_autograd) does
// the same work but flattens and rebuilds the arguments on every call, which
// costs more host time than a small layer's kernels take.
//
// Forward calls the operator below autograd and saves the input, the weights,
// the initial states, the output and the cell's saved values (not the biases:
// their gradients need no value of them); backward calls
// lltm::<b>_<cell>_seq_backward through the dispatcher, asking only for the
// gradients the engine needs. The gradients are not differentiable again.
//
// Used by autograd_rnn.cpp for the built-in cells and by the source
// lltm.cells.define generates for a cell of the user's. Backend: a type
// with a static kName ("fused", "aten", ...).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>

#include <string>
#include <utility>
#include <vector>

#include "autograd_common.h"
#include "rnn.h"

namespace lltm {

template <typename Backend, typename Cell>
class RnnFunction : public torch::autograd::Function<RnnFunction<Backend, Cell>> {
 public:
  using ForwardSig = RnnForwardResult(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      const OptTensor&, const OptTensor&, at::TensorList, const OptTensor&);
  using BackwardSig = RnnBackwardResult(const OptTensor&, const OptTensorList&, const at::Tensor&,
                                        const at::Tensor&, const at::Tensor&, at::TensorList,
                                        const at::Tensor&, const at::Tensor&, const OptTensor&,
                                        RnnOutputMask);

  static std::string op_name(const char* what) {
    return "lltm::" + std::string(Backend::kName) + "_" + Cell::kName + "_seq_" + what;
  }

  // Returns (output, state_n[0], ..., state_n[NS - 1], saved).
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& input,      // (T, B, I)
                                                const at::Tensor& weight_ih,  // (G S, I)
                                                const at::Tensor& weight_hh,  // (G S, S)
                                                const OptTensor& bias_ih,     // (G S,)
                                                const OptTensor& bias_hh,     // (G S,)
                                                at::TensorList state,         // NS (B, S)
                                                const OptTensor& lengths) {   // (B,) int64
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow(op_name("forward").c_str(), "")
                               .template typed<ForwardSig>();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [output, state_n, saved] = op.call(input, weight_ih, weight_hh, bias_ih, bias_hh, state, lengths);
    torch::autograd::variable_list to_save = {input,  weight_ih, weight_hh,
                                              output, saved,     lengths.value_or(at::Tensor())};
    to_save.insert(to_save.end(), state.begin(), state.end());
    ctx->save_for_backward(to_save);
    ctx->saved_data["has_bias_ih"] = bias_ih.has_value() && bias_ih->defined();
    ctx->saved_data["has_bias_hh"] = bias_hh.has_value() && bias_hh->defined();
    ctx->mark_non_differentiable({saved});
    // Undefined output gradients (a loss on the output alone) stay undefined:
    // the operator skips their terms instead of adding zeros.
    ctx->set_materialize_grads(false);
    torch::autograd::variable_list out = {output};
    out.insert(out.end(), state_n.begin(), state_n.end());
    out.push_back(saved);
    return out;
  }

  // grads: (output, state_n..., saved); returns one entry per forward argument
  // and state tensor: input, weight_ih, weight_hh, bias_ih, bias_hh, state...,
  // lengths (undefined where not asked for or not a tensor).
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow(op_name("backward").c_str(), "")
                               .template typed<BackwardSig>();
    const auto saved = ctx->get_saved_variables();
    const std::vector<at::Tensor> state(saved.begin() + 6, saved.end());
    const bool has_bias_ih = ctx->saved_data["has_bias_ih"].toBool();
    const bool has_bias_hh = ctx->saved_data["has_bias_hh"].toBool();
    // Edges exist only for tensor arguments: an absent bias has none.
    const size_t bias_hh_edge = has_bias_ih ? 4 : 3, state_edge = bias_hh_edge + (has_bias_hh ? 1 : 0);
    bool any_state = false;
    for (size_t i = 0; i < state.size(); ++i) any_state = any_state || ctx->needs_input_grad(state_edge + i);
    const RnnOutputMask mask = {ctx->needs_input_grad(0),
                                ctx->needs_input_grad(1),
                                ctx->needs_input_grad(2),
                                has_bias_ih && ctx->needs_input_grad(3),
                                has_bias_hh && ctx->needs_input_grad(bias_hh_edge),
                                any_state};
    OptTensorList grad_state_n;
    for (size_t i = 0; i < state.size(); ++i) {
      const at::Tensor& g = grads[1 + i];
      grad_state_n.push_back(g.defined() ? std::optional<at::Tensor>(g) : std::nullopt);
    }
    const OptTensor grad_output = grads[0].defined() ? OptTensor(grads[0]) : std::nullopt;
    const OptTensor lengths = saved[5].defined() ? OptTensor(saved[5]) : std::nullopt;
    torch::autograd::variable_list out;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      auto [gi, gwi, gwh, gbi, gbh, gs] = op.call(grad_output, grad_state_n, saved[0], saved[1], saved[2],
                                                  state, saved[3], saved[4], lengths, mask);
      out = {gi, gwi, gwh, gbi, gbh};
      for (size_t i = 0; i < out.size(); ++i) {
        if (!mask[i]) out[i] = at::Tensor();
      }
      for (size_t i = 0; i < state.size(); ++i) out.push_back(mask[5] ? gs[i] : at::Tensor());
    }
    out.emplace_back();  // lengths: not differentiable
    return once_differentiable(std::move(out), std::string(Backend::kName));
  }
};

// The Autograd kernel of lltm::<Backend>_<Cell>_seq_forward.
template <typename Backend, typename Cell>
RnnForwardResult rnn_forward_autograd(const at::Tensor& input, const at::Tensor& weight_ih,
                                      const at::Tensor& weight_hh, const OptTensor& bias_ih,
                                      const OptTensor& bias_hh, at::TensorList state,
                                      const OptTensor& lengths) {
  auto out = RnnFunction<Backend, Cell>::apply(input, weight_ih, weight_hh, bias_ih, bias_hh, state, lengths);
  std::vector<at::Tensor> state_n(out.begin() + 1, out.end() - 1);
  return {out.front(), std::move(state_n), out.back()};
}

// Registers it in `m` (a TORCH_LIBRARY_IMPL block of the Autograd key).
template <typename Backend, typename Cell, typename Library>
void register_rnn_autograd(Library& m) {
  m.impl((std::string(Backend::kName) + "_" + Cell::kName + "_seq_forward").c_str(),
         &rnn_forward_autograd<Backend, Cell>);
}

}  // namespace lltm
