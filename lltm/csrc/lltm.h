// Shared declarations of the lltm extension.
//
// Operator schemas live in ops.cpp (one TORCH_LIBRARY block); each backend
// folder only adds TORCH_LIBRARY_IMPL registrations for the functions below.
//
// Shapes (B = batch, I = input features, S = state size):
//   input    (B, I)          weights (3S, S + I)     bias (3S,) or none
//   old_h    (B, S)          old_cell (B, S)
//   new_h    (B, S)          new_cell (B, S)
//   gates    (B, 3S)  activated gates [input_gate | output_gate | candidate]:
//            sigmoid, sigmoid and elu of the pre-activations; saved for
//            backward instead of the pre-activations (every derivative is a
//            function of the activation, see the backward kernels).
//
// Sequence operators (one layer over T steps, time-major; the time loop runs
// inside the operator):
//   input    (T, B, I)       h0, c0 (B, S)
//   lengths  (B,) int64 on input's device, or none (every row has T steps);
//            row b takes steps t < lengths[b] and keeps its state after
//   output   (T, B, S)  h_t; 0 where t >= lengths[b]
//   h_n, c_n (B, S)     the state after each row's last step (h0, c0 for
//                       a row of length 0)
//   gates    (T, B, 3S) activated gates of every step (0 past a row's length)
// gates is what backward needs besides the inputs and output: the cell
// states are not saved, backward recomputes them as
// c_t = c0 + sum_{s <= t} candidate_s * input_gate_s (seq_cells).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace lltm {

using CellForwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
// (grad_input, grad_weights, grad_bias, grad_old_h, grad_old_cell)
using CellBackwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
// Which of the five backward outputs to compute, in the order above. An
// output not asked for is returned as an empty tensor of shape (0,), a fresh
// one per output (outputs of an operator must not alias each other).
using OutputMask = std::array<bool, 5>;

// (output, h_n, c_n, gates)
using SeqForwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
// (grad_input, grad_weights, grad_bias, grad_h0, grad_c0); output_mask as
// for the cell.
using SeqBackwardResult = CellBackwardResult;

// The operators' C++ signatures, as the schemas in ops.cpp declare them
// (typed dispatcher handles in the autograd and autocast kernels use them).
using OptTensor = std::optional<at::Tensor>;
using CellForwardSig = CellForwardResult(const at::Tensor& input, const at::Tensor& weights,
                                         const OptTensor& bias, const at::Tensor& old_h,
                                         const at::Tensor& old_cell);
using CellBackwardSig = CellBackwardResult(const at::Tensor& grad_h, const at::Tensor& grad_cell,
                                           const at::Tensor& new_cell, const at::Tensor& gates,
                                           const at::Tensor& input, const at::Tensor& weights,
                                           const at::Tensor& old_h, OutputMask output_mask);
using SeqForwardSig = SeqForwardResult(const at::Tensor& input, const at::Tensor& weights,
                                       const OptTensor& bias, const at::Tensor& h0, const at::Tensor& c0,
                                       const OptTensor& lengths);
using SeqBackwardSig = SeqBackwardResult(const OptTensor& grad_output, const OptTensor& grad_h_n,
                                         const OptTensor& grad_c_n, const at::Tensor& input,
                                         const at::Tensor& weights, const at::Tensor& h0,
                                         const at::Tensor& c0, const at::Tensor& output,
                                         const at::Tensor& gates, const OptTensor& lengths,
                                         OutputMask output_mask);

// The prologue of every backward operator: which of the five gradients
// (input, weights, bias, state h, state c) output_mask asks for, and the
// outputs of those it does not.
struct AskedGradients {
  AskedGradients(const OutputMask& mask, const at::TensorOptions& options)
      : input(mask[0]), weights(mask[1]), bias(mask[2]), h(mask[3]), c(mask[4]), options(options) {}

  const bool input, weights, bias, h, c;
  const at::TensorOptions options;

  bool any() const { return input || weights || bias || h || c; }
  // An output not asked for: an empty (0,) tensor, a fresh one each time
  // (outputs of an operator must not alias each other).
  at::Tensor placeholder() const { return at::empty({0}, options); }
  // A buffer of `shape` for an output asked for, else a placeholder.
  at::Tensor allocate(bool asked, at::IntArrayRef shape) const {
    return asked ? at::empty(shape, options) : placeholder();
  }
  // The result when nothing is asked for.
  CellBackwardResult placeholders() const {
    return {placeholder(), placeholder(), placeholder(), placeholder(), placeholder()};
  }
};

// Argument checks (checks.cpp), the mirror of lltm/_checks.py.
//
// Validates the arguments of a cell forward: ranks, matching sizes, one
// floating dtype and one device for all tensors. Errors name the argument,
// what was expected and what was given. `op` names the caller in messages.
void check_cell_forward_args(const char* op, const at::Tensor& input, const at::Tensor& weights,
                             const std::optional<at::Tensor>& bias, const at::Tensor& old_h,
                             const at::Tensor& old_cell);

// Validates the arguments of a cell backward against the forward's shapes.
void check_cell_backward_args(const char* op, const at::Tensor& grad_h, const at::Tensor& grad_cell,
                              const at::Tensor& new_cell, const at::Tensor& gates, const at::Tensor& input,
                              const at::Tensor& weights, const at::Tensor& old_h);

// Validates the arguments of a sequence forward / backward, with the same
// rules and messages as the cell's.
void check_seq_forward_args(const char* op, const at::Tensor& input, const at::Tensor& weights,
                            const std::optional<at::Tensor>& bias, const at::Tensor& h0, const at::Tensor& c0,
                            const std::optional<at::Tensor>& lengths);
void check_seq_backward_args(const char* op, const std::optional<at::Tensor>& grad_output,
                             const std::optional<at::Tensor>& grad_h_n,
                             const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input,
                             const at::Tensor& weights, const at::Tensor& h0, const at::Tensor& c0,
                             const at::Tensor& output, const at::Tensor& gates,
                             const std::optional<at::Tensor>& lengths);

// ATen backend (aten/cell_aten.cpp, aten/seq_aten.cpp): ATen ops only, so it runs on any device.
CellForwardResult aten_cell_forward(const at::Tensor& input, const at::Tensor& weights,
                                    const std::optional<at::Tensor>& bias, const at::Tensor& old_h,
                                    const at::Tensor& old_cell);
CellBackwardResult aten_cell_backward(const at::Tensor& grad_h, const at::Tensor& grad_cell,
                                      const at::Tensor& new_cell, const at::Tensor& gates,
                                      const at::Tensor& input, const at::Tensor& weights,
                                      const at::Tensor& old_h, OutputMask output_mask);

SeqForwardResult aten_seq_forward(const at::Tensor& input, const at::Tensor& weights,
                                  const std::optional<at::Tensor>& bias, const at::Tensor& h0,
                                  const at::Tensor& c0, const std::optional<at::Tensor>& lengths);
SeqBackwardResult aten_seq_backward(const std::optional<at::Tensor>& grad_output,
                                    const std::optional<at::Tensor>& grad_h_n,
                                    const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input,
                                    const at::Tensor& weights, const at::Tensor& h0, const at::Tensor& c0,
                                    const at::Tensor& output, const at::Tensor& gates,
                                    const std::optional<at::Tensor>& lengths, OutputMask output_mask);

// Shared by the sequence backward operators (seq_shared.cpp):
//
// The cell states c_t (T, B, S) of a layer from c0 (B, S) and its saved
// activated gates (T, B, 3S): c0 + the running sum over t of candidate *
// input_gate, in the forward's order (zero gates past a row's length, so c
// carries over there), summed in float for half and bfloat16. One walk over
// t per batch row on CPU, a kernel on CUDA (seq_cells_cuda), ATen's cumsum
// on other devices.
at::Tensor seq_cells(const at::Tensor& c0, const at::Tensor& gates);

// After a layer's reverse-time loop: grad_input (T, B, I), grad_weights
// (3S, S + I) and grad_bias (3S,) from d_pre (T, B, 3S), the gradient of
// every step's gate pre-activations, as one GEMM / reduction each over all
// T*B rows, with ATen ops. An output not asked for is a placeholder.
std::tuple<at::Tensor, at::Tensor, at::Tensor> seq_parameter_gradients(
    const at::Tensor& d_pre, const at::Tensor& input, const at::Tensor& weights, const at::Tensor& h0,
    const at::Tensor& output, const AskedGradients& asked);

// Fused CUDA backend (cuda/cell_forward.cu, cuda/cell_backward.cu), compiled
// only with CUDA.
CellForwardResult fused_cell_forward_cuda(const at::Tensor& input, const at::Tensor& weights,
                                          const std::optional<at::Tensor>& bias, const at::Tensor& old_h,
                                          const at::Tensor& old_cell);
CellBackwardResult fused_cell_backward_cuda(const at::Tensor& grad_h, const at::Tensor& grad_cell,
                                            const at::Tensor& new_cell, const at::Tensor& gates,
                                            const at::Tensor& input, const at::Tensor& weights,
                                            const at::Tensor& old_h, OutputMask output_mask);
// Fused CUDA sequence operators (cuda/rnn_cuda.cu: the LLTM over the generic kernels).
SeqForwardResult fused_seq_forward_cuda(const at::Tensor& input, const at::Tensor& weights,
                                        const std::optional<at::Tensor>& bias, const at::Tensor& h0,
                                        const at::Tensor& c0, const std::optional<at::Tensor>& lengths);
SeqBackwardResult fused_seq_backward_cuda(const std::optional<at::Tensor>& grad_output,
                                          const std::optional<at::Tensor>& grad_h_n,
                                          const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input,
                                          const at::Tensor& weights, const at::Tensor& h0,
                                          const at::Tensor& c0, const at::Tensor& output,
                                          const at::Tensor& gates, const std::optional<at::Tensor>& lengths,
                                          OutputMask output_mask);
// seq_cells for CUDA tensors (cuda/rnn_cuda.cu): one thread per (row,
// unit) walking t, with the loads of several steps in flight.
at::Tensor seq_cells_cuda(const at::Tensor& c0, const at::Tensor& gates);
// The fused CUDA sequence ops' time-loop plan for one direction of a layer
// of `cell` (cells/registry.h) in `dtype` on CUDA device `device`: every candidate path with the cost
// model's estimate, and the choice (cuda/seq_persistent.cu;
// lltm::_fused_cuda_seq_plan, read by the benchmarks).
std::string fused_cuda_seq_plan(bool backward, int64_t steps, int64_t batch, int64_t state,
                                c10::ScalarType dtype, int64_t device, c10::string_view cell);
// (eager first sightings, captures, replays) of the CUDA graphs of the fused
// CUDA step loops since the process started (cuda/seq_graph.cpp;
// lltm::_fused_cuda_seq_graph_stats, read by tests and benchmarks).
std::vector<int64_t> fused_cuda_seq_graph_stats();
// The measuring planner's counts since the process started: classes timed,
// classes read from LLTM_SEQ_TUNE_CACHE, calls that took the cost model's plan
// because timing was not possible (capture, deterministic mode)
// (cuda/seq_tune.cpp; lltm::_fused_cuda_seq_tune_stats, read by tests).
std::vector<int64_t> fused_cuda_seq_tune_stats();
// Comma-separated list of the architectures the CUDA sources were built for,
// as nvcc's __CUDA_ARCH_LIST__ spells them (e.g. "900" or "800,900").
std::string cuda_arch_list();

}  // namespace lltm
