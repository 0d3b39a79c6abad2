// "fused" backend on the CPU, sequence operators, written once for every
// cell of cells/registry.h: lltm::fused_<cell>_seq_forward / _backward
// (rnn.h) and LLTM's own lltm::fused_seq_forward / _backward (lltm.h), which
// pass views of LLTM's (3S, S + I) weights as W_hh and W_ih. The time loop
// runs in C++ over preallocated buffers, with the backend's own GEMM
// (kernels.h), whose speed does not depend on the BLAS torch links.
//
// Forward: W_hh and W_ih are packed once per call; each step is one fused
// GEMM + cell kernel per unit block: [h_{t-1} | x_t] [W_hh | W_ih]^T straight
// into the cell's math (the input projection rides in the same K loop, or a
// second one for cells that keep x W_ih^T and h W_hh^T apart, instead of a
// GEMM over T*B rows: the same multiply-adds, and no (T, B, G S) buffer of
// pre-activations written and read back).
//
// Backward: the states other than h are rebuilt from the saved values (the
// cell's recompute, in the forward's rounding), W_hh is packed once per
// call, and each reverse step is one fused GEMM + cell-backward kernel per
// panel of unit blocks: dh_t = dzh_{t+1} W_hh (+ the cell's direct term)
// into the cell's backward of step t, which writes dzx and dzh; the bias
// gradients are summed in the same kernel. After the loop, over all T*B
// rows (at::mm where it is the faster, see common.h: parameter_gemms_by_aten):
//   grad_input = dzx W_ih,  grad_W_ih = dzx^T x
//   grad_W_hh  = dzh_0^T h0 + dzh_{1:}^T output_{:-1}  (h_{t-1} is the previous
//                output on every row whose dzh is not 0)
//
// Threads: the unit blocks are split over a team that runs the whole time
// loop in one parallel region, each thread packing and keeping its own share
// of the weights in its caches, one barrier per step (common.h: run_team).
//
// Variable lengths: past its length a row gets zero saved values, keeps its
// states, outputs 0 and carries h (in two buffers beside the output, written
// in turn: a step reads every unit of h_{t-1} while the team writes h_t). In
// backward such a row has dzx = dzh = 0 and passes its carried gradients on.
#include "rnn_cpu.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

#include "../lltm.h"
#include "../rnn.h"
#include "register.h"

namespace lltm {
namespace cpu {
namespace {
constexpr const char* kLltmForward = "lltm::fused_seq_forward";
constexpr const char* kLltmBackward = "lltm::fused_seq_backward";

// LLTM's weights (3S, S + I) are [W_hh | W_ih]: the generic code reads the two column blocks in place.
RnnArgs lltm_args(const at::Tensor& input, const at::Tensor& weights, const std::optional<at::Tensor>& bias,
                  const at::Tensor& h0, const at::Tensor& c0, const std::optional<at::Tensor>& lengths) {
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

SeqForwardResult fused_seq_forward_cpu(const at::Tensor& input,                   // (T, B, I)
                                       const at::Tensor& weights,                 // (3S, S + I)
                                       const std::optional<at::Tensor>& bias,     // (3S,)
                                       const at::Tensor& h0,                      // (B, S)
                                       const at::Tensor& c0,                      // (B, S)
                                       const std::optional<at::Tensor>& lengths)  // (B,) int64
{
  check_seq_forward_args(kLltmForward, input, weights, bias, h0, c0, lengths);
  const RnnArgs args = lltm_args(input, weights, bias, h0, c0, lengths);
  auto [output, state_n, gates] = allocate_forward(shape_of<cells::LLTM>(), args);
  rnn_forward<cells::LLTM>(args, output, state_n, gates);
  return {output, state_n[0], state_n[1], gates};
}

SeqBackwardResult fused_seq_backward_cpu(const std::optional<at::Tensor>& grad_output,  // (T, B, S)
                                         const std::optional<at::Tensor>& grad_h_n,     // (B, S)
                                         const std::optional<at::Tensor>& grad_c_n,     // (B, S)
                                         const at::Tensor& input,                       // (T, B, I)
                                         const at::Tensor& weights,                     // (3S, S + I)
                                         const at::Tensor& h0,                          // (B, S)
                                         const at::Tensor& c0,                          // (B, S)
                                         const at::Tensor& output,                      // (T, B, S)
                                         const at::Tensor& gates,                       // (T, B, 3S)
                                         const std::optional<at::Tensor>& lengths,      // (B,) int64
                                         OutputMask output_mask) {
  check_seq_backward_args(kLltmBackward, grad_output, grad_h_n, grad_c_n, input, weights, h0, c0, output,
                          gates, lengths);
  const int64_t S = weights.size(0) / 3, I = input.size(2);
  const AskedGradients asked(output_mask, input.options());
  at::Tensor grad_input = asked.allocate(asked.input, input.sizes());
  at::Tensor grad_weights = asked.allocate(asked.weights, weights.sizes());
  at::Tensor grad_bias = asked.allocate(asked.bias, {3 * S});
  at::Tensor grad_h0 = asked.allocate(asked.h, h0.sizes());
  at::Tensor grad_c0 = asked.allocate(asked.c, c0.sizes());
  if (!asked.any()) return {grad_input, grad_weights, grad_bias, grad_h0, grad_c0};
  const RnnArgs args = lltm_args(input, weights, std::nullopt, h0, c0, lengths);
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
  rnn_backward<cells::LLTM>(args, from, grads);
  return {grad_input, grad_weights, grad_bias, grad_h0, grad_c0};
}

void register_seq(torch::Library& m) {
  m.impl("fused_seq_forward", &fused_seq_forward_cpu);
  m.impl("fused_seq_backward", &fused_seq_backward_cpu);
  cells::for_each_cell([&](auto cell) {
    using Cell = decltype(cell);
    if constexpr (!std::is_same_v<Cell, cells::LLTM>) {
      register_rnn_ops<FusedCpu, Cell>(m);
    }
  });
}

}  // namespace
}  // namespace cpu

// seq_cells for CPU tensors (seq_shared.cpp): LLTM's recompute, by the
// kernels of the capability the forwards run with (the fused kernels' and
// ATen's at::addcmul round c' = c + a i alike: one fused multiply-add in
// the AVX2 and AVX-512 builds, a product then a sum in the baseline one).
at::Tensor seq_cells_cpu(const at::Tensor& c0, const at::Tensor& gates) {
  const at::Tensor g = gates.contiguous();
  return cpu::recompute_states(cpu::kernels_for<cells::LLTM>(g), g, c0.contiguous().unsqueeze(0),
                               at::Tensor(), cells::LLTM::kStates)[0];
}

}  // namespace lltm

LLTM_REGISTER_CPU_KERNELS(lltm::cpu::register_seq)
