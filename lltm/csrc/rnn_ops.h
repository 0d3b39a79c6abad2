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

// Registers Backend's two operators of Cell in `m` (a TORCH_LIBRARY_IMPL block of the backend's key).
template <typename Backend, typename Cell, typename Library>
void register_rnn_ops(Library& m) {
  m.impl((std::string(Backend::kName) + "_" + Cell::kName + "_seq_forward").c_str(),
         &rnn_forward_op<Backend, Cell>);
  m.impl((std::string(Backend::kName) + "_" + Cell::kName + "_seq_backward").c_str(),
         &rnn_backward_op<Backend, Cell>);
}

}  // namespace lltm
