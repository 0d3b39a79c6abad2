// "aten" backend, cell operators: forward and backward written with ATen
// ops, so they run on every device ATen supports. Registered as
// CompositeExplicitAutograd: one kernel for all backends, autograd provided
// by autograd_cell.cpp.
//
// The op count is kept low on purpose: at the tutorial's size (16 x 32 x 128)
// each ATen call costs more than its arithmetic. The activations are applied
// in place on the GEMM output, and backward uses ATen's fused derivative
// kernels (sigmoid_backward, tanh_backward, elu_backward) instead of spelling
// each derivative out of several elementwise ops.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../lltm.h"
#include "../precision.h"

namespace lltm {

CellForwardResult aten_cell_forward(const at::Tensor& input, const at::Tensor& weights,
                                    const std::optional<at::Tensor>& bias, const at::Tensor& old_h,
                                    const at::Tensor& old_cell) {
  check_cell_forward_args("lltm::aten_cell_forward", input, weights, bias, old_h, old_cell);
  const Fp32PassGuard precision(false);  // the forward's products as lltm's mode wants (precision.h)
  const int64_t state = weights.size(0) / 3;
  // X = [old_h, input]: (B, S + I); gates = X W^T + b: (B, 3S)
  const at::Tensor X = at::cat({old_h, input}, 1);
  at::Tensor gates =
      (bias.has_value() && bias->defined()) ? addmm_rows(*bias, X, weights.t()) : at::mm(X, weights.t());
  // gates <- [sigmoid(i), sigmoid(o), elu(c)], in place (gates is ours).
  gates.narrow(1, 0, 2 * state).sigmoid_();
  at::Tensor candidate = gates.narrow(1, 2 * state, state);
  at::elu_(candidate);
  const at::Tensor input_gate = gates.narrow(1, 0, state);
  const at::Tensor output_gate = gates.narrow(1, state, state);
  // c' = c + elu(c~) * sigmoid(i);  h' = tanh(c') * sigmoid(o)
  at::Tensor new_cell = at::addcmul(old_cell, candidate, input_gate);
  at::Tensor new_h = at::tanh(new_cell).mul_(output_gate);
  return {new_h, new_cell, gates};
}

CellBackwardResult aten_cell_backward(const at::Tensor& grad_h, const at::Tensor& grad_cell,
                                      const at::Tensor& new_cell, const at::Tensor& gates,
                                      const at::Tensor& input, const at::Tensor& weights,
                                      const at::Tensor& old_h, OutputMask output_mask) {
  check_cell_backward_args("lltm::aten_cell_backward", grad_h, grad_cell, new_cell, gates, input, weights,
                           old_h);
  const Fp32PassGuard precision(true);  // the backward's products as lltm's mode wants (precision.h)
  const AskedGradients asked(output_mask, gates.options());
  if (!asked.any()) return asked.placeholders();
  const int64_t state = weights.size(0) / 3;
  const int64_t features = input.size(1);
  const at::Tensor input_gate = gates.narrow(1, 0, state);
  const at::Tensor output_gate = gates.narrow(1, state, state);
  const at::Tensor candidate = gates.narrow(1, 2 * state, state);

  const at::Tensor tanh_cell = at::tanh(new_cell);
  // dL/dc' = grad_cell + grad_h * o * (1 - tanh(c')^2)
  at::Tensor grad_old_cell = at::tanh_backward(grad_h * output_gate, tanh_cell).add_(grad_cell);

  // d_pre: gradient w.r.t. the gate pre-activations, (B, 3S).
  at::Tensor d_pre = at::empty_like(gates, at::MemoryFormat::Contiguous);
  at::Tensor d_input_gate = d_pre.narrow(1, 0, state);
  at::Tensor d_output_gate = d_pre.narrow(1, state, state);
  at::Tensor d_candidate = d_pre.narrow(1, 2 * state, state);
  // d sigmoid(z) = s (1 - s)
  at::sigmoid_backward_out(d_input_gate, grad_old_cell * candidate, input_gate);
  at::sigmoid_backward_out(d_output_gate, grad_h * tanh_cell, output_gate);
  // d elu(z) = 1 if z > 0 else elu(z) + 1, from the saved activation
  at::elu_backward_out(d_candidate, grad_old_cell * input_gate, /*alpha=*/1,
                       /*scale=*/1, /*input_scale=*/1, /*is_result=*/true, candidate);

  // dX = d_pre W: (B, S + I) = [grad_old_h | grad_input]. With both asked
  // for, one GEMM and two slice copies beat two GEMMs over W's column blocks:
  // the copies move B (S + I) elements, the GEMM does 3S times that in
  // multiply-adds, and at small sizes each GEMM call costs more than its
  // arithmetic. With one asked for, one GEMM over its column block. (The
  // outputs of an operator must not alias each other, hence the copies.)
  // Backward's GEMMs run only for the gradients asked for: inside a model
  // the input often needs none, and they are most of backward's work.
  at::Tensor grad_input, grad_old_h;
  if (asked.input && asked.h) {
    const at::Tensor dX = d_pre.mm(weights);
    // clone, not contiguous(): an empty or single-column slice counts as
    // contiguous and would come back as a view of dX.
    grad_old_h = dX.narrow(1, 0, state).clone(at::MemoryFormat::Contiguous);
    grad_input = dX.narrow(1, state, features).clone(at::MemoryFormat::Contiguous);
  } else {
    grad_input = asked.input ? d_pre.mm(weights.narrow(1, state, features)) : asked.placeholder();
    grad_old_h = asked.h ? d_pre.mm(weights.narrow(1, 0, state)) : asked.placeholder();
  }
  // dW = d_pre^T X with X = [old_h | input] rebuilt (B (S + I) elements
  // copied for a GEMM of 3S times that), one GEMM instead of two.
  at::Tensor grad_weights = asked.weights ? d_pre.t().mm(at::cat({old_h, input}, 1)) : asked.placeholder();
  at::Tensor grad_bias = asked.bias ? d_pre.sum(0) : asked.placeholder();
  if (!asked.c) grad_old_cell = asked.placeholder();
  return {grad_input, grad_weights, grad_bias, grad_old_h, grad_old_cell};
}

}  // namespace lltm

TORCH_LIBRARY_IMPL(lltm, CompositeExplicitAutograd, m) {
  m.impl("aten_cell_forward", &lltm::aten_cell_forward);
  m.impl("aten_cell_backward", &lltm::aten_cell_backward);
}
