// The operators of the seam's cells (cells/registry.h) other than LLTM, and
// the cell-generic host interface every backend implements for them and for
// LLTM's own operators (lltm.h), which pass views of LLTM's weights.
//
// Per cell <c> and compiled backend <b> (schemas in ops.cpp):
//   lltm::<b>_<c>_seq_forward(input, weight_ih, weight_hh, bias_ih?, bias_hh?,
//                             state[], lengths?) -> (output, state_n[], saved)
//   lltm::<b>_<c>_seq_backward(grad_output?, grad_state_n?[], input, weight_ih,
//                              weight_hh, state[], output, saved, lengths?,
//                              output_mask[6])
//       -> (grad_input, grad_weight_ih, grad_weight_hh, grad_bias_ih,
//           grad_bias_hh, grad_state[])
// Shapes (G gates, NS states, NV saved values of the cell; torch's layout):
//   input (T, B, I)   weight_ih (G S, I)   weight_hh (G S, S)   biases (G S,)
//   state: NS tensors (B, S), h first      lengths (B,) int64 or none
//   output (T, B, S)  state_n: NS (B, S)   saved (T, B, NV S)
// output_mask: (input, weight_ih, weight_hh, bias_ih, bias_hh, state); an
// output not asked for is an empty (0,) tensor (the state gradients: an
// empty list). Their autograd is autograd_rnn.h (C++, one node per layer);
// their fake kernels are registered in Python (lltm/_seam.py).
#pragma once

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "cells/registry.h"

namespace lltm {

using OptTensor = std::optional<at::Tensor>;

// A cell's sizes as the host code reads them at run time.
struct CellShape {
  const char* name;
  int gates, states, saved;
  bool split;
};
template <typename Cell>
constexpr CellShape shape_of() {
  return {Cell::kName, Cell::kGates, Cell::kStates, Cell::kSaved, Cell::kSplit};
}

using RnnOutputMask = std::array<bool, 6>;
using OptTensorList = c10::List<std::optional<at::Tensor>>;
// (output, state_n, saved)
using RnnForwardResult = std::tuple<at::Tensor, std::vector<at::Tensor>, at::Tensor>;
// (grad_input, grad_weight_ih, grad_weight_hh, grad_bias_ih, grad_bias_hh, grad_state)
using RnnBackwardResult =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, std::vector<at::Tensor>>;

// One direction of one layer, as the generic code takes it. Weights may be
// strided views (LLTM's W_hh and W_ih are the two column blocks of its
// (3S, S + I) weights); undefined tensors are absent.
struct RnnArgs {
  at::Tensor input;               // (T, B, I)
  at::Tensor w_ih, w_hh;          // (G S, I), (G S, S)
  at::Tensor b_ih, b_hh;          // (G S,) or undefined
  std::vector<at::Tensor> state;  // NS (B, S)
  at::Tensor lengths;             // (B,) int64 or undefined
  int64_t steps() const { return input.size(0); }
  int64_t batch() const { return input.size(1); }
  int64_t features() const { return input.size(2); }
  int64_t hidden() const { return w_hh.size(1); }
};

// What a backward reads besides RnnArgs.
struct RnnBackwardArgs {
  at::Tensor grad_output;              // (T, B, S) or undefined
  std::vector<at::Tensor> grad_state;  // NS (B, S), each may be undefined
  at::Tensor output, saved;            // the forward's
};

// Where a backward writes: tensors allocated by the caller (possibly strided
// views, as LLTM's grad_weights column blocks), undefined where not asked.
struct RnnGradients {
  at::Tensor input, w_ih, w_hh, b_ih, b_hh;  // shaped as RnnArgs' (biases (G S,))
  std::vector<at::Tensor> state;             // NS (B, S), or empty: not asked
};

// The forward's outputs, allocated for `args` (contiguous, like every backend's).
RnnForwardResult allocate_forward(const CellShape& cell, const RnnArgs& args);

// Argument checks of the generic operators (checks.cpp), with the messages
// and exception types of the LLTM operators' checks.
void check_rnn_forward_args(const char* op, const CellShape& cell, const at::Tensor& input,
                            const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                            const OptTensor& bias_ih, const OptTensor& bias_hh, at::TensorList state,
                            const OptTensor& lengths);
void check_rnn_backward_args(const char* op, const CellShape& cell, const OptTensor& grad_output,
                             const OptTensorList& grad_state_n, const at::Tensor& input,
                             const at::Tensor& weight_ih, const at::Tensor& weight_hh, at::TensorList state,
                             const at::Tensor& output, const at::Tensor& saved, const OptTensor& lengths);

// Gathers the operator's arguments into RnnArgs / RnnBackwardArgs /
// RnnGradients (the outputs output_mask asks for, allocated).
RnnArgs rnn_args(const at::Tensor& input, const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                 const OptTensor& bias_ih, const OptTensor& bias_hh, at::TensorList state,
                 const OptTensor& lengths);
RnnBackwardArgs rnn_backward_args(const OptTensor& grad_output, const OptTensorList& grad_state_n,
                                  const at::Tensor& output, const at::Tensor& saved);
RnnGradients allocate_gradients(const RnnArgs& args, const RnnOutputMask& mask);
RnnBackwardResult gradients_result(const RnnArgs& args, RnnGradients&& grads);

// After a reverse-time loop: the gradients of the input, weights and biases
// that `grads` asks for, from dzx and dzh (T, B, G S), the gradients of every
// step's zx and zh (dzh may be dzx itself), as one GEMM or reduction each
// over all T*B rows (rnn_shared.cpp).
void rnn_parameter_gradients(const RnnArgs& args, const at::Tensor& output, const at::Tensor& dzx,
                             const at::Tensor& dzh, RnnGradients& grads);

// "lltm::<backend>_<cell>_<what>"
inline std::string rnn_op_name(const std::string& backend, const char* cell, const char* what) {
  return "lltm::" + backend + "_" + cell + "_" + what;
}

}  // namespace lltm
