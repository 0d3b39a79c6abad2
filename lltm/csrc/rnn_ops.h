// The two operators of a cell on one backend (rnn.h), written once around
// the backend's layer code: the argument checks under the operator's name,
// the arguments gathered, the outputs allocated (forward) or the gradients
// output_mask asks for (backward, which runs only when one is asked).
//
// Backend is a struct with
//   static constexpr const char* kName;            "fused", "aten"
//   static auto guard(const char* op, const at::Tensor& input);
//                                                  held while the layer runs (a device guard, or nothing)
//   template <typename Cell> static void forward(const RnnArgs&, at::Tensor& output,
//                                                std::vector<at::Tensor>& state_n, at::Tensor& saved);
//   template <typename Cell> static void backward(const RnnArgs&, const RnnBackwardArgs&, RnnGradients&);
#pragma once

#include <algorithm>
#include <string>
#include <utility>

#include "lltm.h"
#include "rnn.h"

namespace lltm {

// A backend without a device to select.
struct NoGuard {
  static int guard(const char* /*op*/, const at::Tensor& /*input*/) { return 0; }
};

template <typename Backend, typename Cell>
RnnForwardResult rnn_forward_op(const at::Tensor& input,      // (T, B, I)
                                const at::Tensor& weight_ih,  // (G S, I)
                                const at::Tensor& weight_hh,  // (G S, S)
                                const OptTensor& bias_ih,     // (G S,)
                                const OptTensor& bias_hh,     // (G S,)
                                at::TensorList state,         // NS (B, S)
                                const OptTensor& lengths) {   // (B,) int64
  static const std::string op = rnn_op_name(Backend::kName, Cell::kName, "seq_forward");
  check_rnn_forward_args(op.c_str(), shape_of<Cell>(), input, weight_ih, weight_hh, bias_ih, bias_hh, state,
                         lengths);
  [[maybe_unused]] const auto guard = Backend::guard(op.c_str(), input);
  const RnnArgs args = rnn_args(input, weight_ih, weight_hh, bias_ih, bias_hh, state, lengths);
  auto result = allocate_forward(shape_of<Cell>(), args);
  auto& [output, state_n, saved] = result;
  Backend::template forward<Cell>(args, output, state_n, saved);
  return result;
}

template <typename Backend, typename Cell>
RnnBackwardResult rnn_backward_op(const OptTensor& grad_output,       // (T, B, S)
                                  const OptTensorList& grad_state_n,  // NS (B, S), each optional
                                  const at::Tensor& input,            // (T, B, I)
                                  const at::Tensor& weight_ih,        // (G S, I)
                                  const at::Tensor& weight_hh,        // (G S, S)
                                  at::TensorList state,               // NS (B, S)
                                  const at::Tensor& output,           // (T, B, S)
                                  const at::Tensor& saved,            // (T, B, NV S)
                                  const OptTensor& lengths,           // (B,) int64
                                  RnnOutputMask output_mask) {
  static const std::string op = rnn_op_name(Backend::kName, Cell::kName, "seq_backward");
  check_rnn_backward_args(op.c_str(), shape_of<Cell>(), grad_output, grad_state_n, input, weight_ih,
                          weight_hh, state, output, saved, lengths);
  [[maybe_unused]] const auto guard = Backend::guard(op.c_str(), input);
  const RnnArgs args = rnn_args(input, weight_ih, weight_hh, std::nullopt, std::nullopt, state, lengths);
  RnnGradients grads = allocate_gradients(args, output_mask);
  if (std::any_of(output_mask.begin(), output_mask.end(), [](bool b) { return b; })) {
    Backend::template backward<Cell>(args, rnn_backward_args(grad_output, grad_state_n, output, saved),
                                     grads);
  }
  return gradients_result(args, std::move(grads));
}

// A backend's backward where no step ran (T or B is 0): the states'
// gradients pass through, the others are sums over nothing.
inline void gradients_of_no_step(const RnnBackwardArgs& from, RnnGradients& grads) {
  for (at::Tensor* t : {&grads.input, &grads.w_ih, &grads.w_hh, &grads.b_ih, &grads.b_hh}) {
    if (t->defined()) t->zero_();
  }
  for (size_t k = 0; k < grads.state.size(); ++k) {
    if (from.grad_state[k].defined()) {
      grads.state[k].copy_(from.grad_state[k]);
    } else {
      grads.state[k].zero_();
    }
  }
}

// LLTM's own operators (lltm.h) on the same layer code: its weights (3S, S + I)
// are [W_hh | W_ih], read in place as the two column blocks.
inline RnnArgs lltm_rnn_args(const at::Tensor& input, const at::Tensor& weights, const OptTensor& bias,
                             const at::Tensor& h0, const at::Tensor& c0, const OptTensor& lengths) {
  const int64_t S = weights.size(0) / 3, I = input.size(2);
  RnnArgs a;
  a.input = input;
  a.w_hh = weights.narrow(1, 0, S);
  a.w_ih = weights.narrow(1, S, I);
  a.b_ih = bias.has_value() ? *bias : at::Tensor();
  a.state = {h0, c0};
  a.lengths = lengths.has_value() ? *lengths : at::Tensor();
  return a;
}

template <typename Backend>
SeqForwardResult lltm_seq_forward_op(const at::Tensor& input,     // (T, B, I)
                                     const at::Tensor& weights,   // (3S, S + I)
                                     const OptTensor& bias,       // (3S,)
                                     const at::Tensor& h0,        // (B, S)
                                     const at::Tensor& c0,        // (B, S)
                                     const OptTensor& lengths) {  // (B,) int64
  static const std::string op = std::string("lltm::") + Backend::kName + "_seq_forward";
  check_seq_forward_args(op.c_str(), input, weights, bias, h0, c0, lengths);
  [[maybe_unused]] const auto guard = Backend::guard(op.c_str(), input);
  const RnnArgs args = lltm_rnn_args(input, weights, bias, h0, c0, lengths);
  auto [output, state_n, gates] = allocate_forward(shape_of<cells::LLTM>(), args);
  Backend::template forward<cells::LLTM>(args, output, state_n, gates);
  return {output, state_n[0], state_n[1], gates};
}

template <typename Backend>
SeqBackwardResult lltm_seq_backward_op(const OptTensor& grad_output,  // (T, B, S)
                                       const OptTensor& grad_h_n,     // (B, S)
                                       const OptTensor& grad_c_n,     // (B, S)
                                       const at::Tensor& input,       // (T, B, I)
                                       const at::Tensor& weights,     // (3S, S + I)
                                       const at::Tensor& h0,          // (B, S)
                                       const at::Tensor& c0,          // (B, S)
                                       const at::Tensor& output,      // (T, B, S)
                                       const at::Tensor& gates,       // (T, B, 3S)
                                       const OptTensor& lengths,      // (B,) int64
                                       OutputMask output_mask) {
  static const std::string op = std::string("lltm::") + Backend::kName + "_seq_backward";
  check_seq_backward_args(op.c_str(), grad_output, grad_h_n, grad_c_n, input, weights, h0, c0, output, gates,
                          lengths);
  [[maybe_unused]] const auto guard = Backend::guard(op.c_str(), input);
  const int64_t S = weights.size(0) / 3, I = input.size(2);
  const AskedGradients asked(output_mask, input.options());
  at::Tensor grad_input = asked.allocate(asked.input, input.sizes());
  at::Tensor grad_weights = asked.allocate(asked.weights, weights.sizes());
  at::Tensor grad_bias = asked.allocate(asked.bias, {3 * S});
  at::Tensor grad_h0 = asked.allocate(asked.h, h0.sizes());
  at::Tensor grad_c0 = asked.allocate(asked.c, c0.sizes());
  if (!asked.any()) return {grad_input, grad_weights, grad_bias, grad_h0, grad_c0};
  const RnnArgs args = lltm_rnn_args(input, weights, std::nullopt, h0, c0, lengths);
  RnnGradients grads;
  if (asked.input) grads.input = grad_input;
  if (asked.weights) {
    grads.w_hh = grad_weights.narrow(1, 0, S);
    grads.w_ih = grad_weights.narrow(1, S, I);
  }
  if (asked.bias) grads.b_ih = grad_bias;
  // The initial states' gradients come as a pair (the backward computes both at once).
  if (asked.h || asked.c) {
    grads.state = {asked.h ? grad_h0 : at::empty(h0.sizes(), input.options()),
                   asked.c ? grad_c0 : at::empty(c0.sizes(), input.options())};
  }
  RnnBackwardArgs from;
  from.grad_output = grad_output.has_value() ? *grad_output : at::Tensor();
  from.grad_state = {grad_h_n.has_value() ? *grad_h_n : at::Tensor(),
                     grad_c_n.has_value() ? *grad_c_n : at::Tensor()};
  from.output = output;
  from.saved = gates;
  Backend::template backward<cells::LLTM>(args, from, grads);
  return {grad_input, grad_weights, grad_bias, grad_h0, grad_c0};
}

// Registers Backend's two operators of Cell in `m` (a TORCH_LIBRARY_IMPL block of the backend's key).
template <typename Backend, typename Cell, typename Library>
void register_rnn_ops(Library& m) {
  m.impl((std::string(Backend::kName) + "_" + Cell::kName + "_seq_forward").c_str(),
         &rnn_forward_op<Backend, Cell>);
  m.impl((std::string(Backend::kName) + "_" + Cell::kName + "_seq_backward").c_str(),
         &rnn_backward_op<Backend, Cell>);
}

}  // namespace lltm
