// "fused" backend on the CPU, cell operators: one GEMM with torch's BLAS for
// the gates, then the whole pointwise math in one vectorised pass over the
// gates (bias add, sigmoid, sigmoid, ELU, cell update, tanh), parallel over
// batch rows; backward is one pass for every gate derivative and the cell
// gradient, then the GEMMs of the gradients asked for.
//
// Same results and conventions as the aten backend (aten/cell_aten.cpp):
// output_mask, fresh (0,) placeholders for gradients not asked for, fresh
// contiguous outputs with the fake kernels' shapes. dtypes: float32,
// float64, bfloat16 and float16 (fp32 math inside, one rounding per stored
// value).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../lltm.h"
#include "pointwise.h"
#include "register.h"
#include "rows.h"

namespace lltm {
namespace {

using cpu::for_rows;

CellForwardResult fused_cell_forward_cpu(const at::Tensor& input,      // (B, I)
                                         const at::Tensor& weights,    // (3S, S + I)
                                         const std::optional<at::Tensor>& bias,  // (3S,)
                                         const at::Tensor& old_h,      // (B, S)
                                         const at::Tensor& old_cell) { // (B, S)
  check_cell_forward_args("lltm::fused_cell_forward", input, weights, bias, old_h, old_cell);
  const cpu::PointwiseKernels kernels = cpu::kernels_for(input);
  const int64_t batch = input.size(0), state = weights.size(0) / 3;
  // gates = [old_h | input] W^T: (B, 3S), one GEMM; the bias is added in the
  // pass (in fp32 for bf16 / fp16, where addmm would round the sum first).
  at::Tensor gates = at::mm(at::cat({old_h, input}, 1), weights.t());
  const at::Tensor b = cpu::contiguous_or_undefined(bias);
  const at::Tensor c = old_cell.contiguous();
  at::Tensor new_h = at::empty({batch, state}, input.options());
  at::Tensor new_cell = at::empty({batch, state}, input.options());
  const cpu::ForwardStep step{gates.data_ptr(), nullptr, cpu::ptr_or_null(b), c.const_data_ptr(),
                              new_cell.data_ptr(), new_h.data_ptr(), nullptr, nullptr, 0, state};
  for_rows(batch, state, [&](int64_t begin, int64_t end) { kernels.forward(step, begin, end); });
  return {new_h, new_cell, gates};
}

CellBackwardResult fused_cell_backward_cpu(const at::Tensor& grad_h,     // (B, S)
                                           const at::Tensor& grad_cell,  // (B, S)
                                           const at::Tensor& new_cell,   // (B, S)
                                           const at::Tensor& gates,      // (B, 3S)
                                           const at::Tensor& input,      // (B, I)
                                           const at::Tensor& weights,    // (3S, S + I)
                                           const at::Tensor& old_h,      // (B, S)
                                           OutputMask output_mask) {
  check_cell_backward_args("lltm::fused_cell_backward", grad_h, grad_cell, new_cell, gates, input,
                           weights, old_h);
  const AskedGradients asked(output_mask, input.options());
  if (!asked.any()) return asked.placeholders();
  const auto not_asked = [&] { return asked.placeholder(); };
  const cpu::PointwiseKernels kernels = cpu::kernels_for(input);
  const int64_t batch = input.size(0), features = input.size(1), state = weights.size(0) / 3;
  const at::Tensor gh = grad_h.contiguous(), gc = grad_cell.contiguous(),
                   cn = new_cell.contiguous(), g = gates.contiguous();
  at::Tensor d_pre = at::empty({batch, 3 * state}, input.options());  // d loss / d pre-activations
  at::Tensor grad_old_cell = output_mask[4] ? at::empty({batch, state}, input.options()) : not_asked();
  // grad_h is only read (zero_grad_h is false), hence the const_cast.
  const cpu::BackwardStep step{const_cast<void*>(gh.const_data_ptr()), nullptr, gc.const_data_ptr(),
                               output_mask[4] ? grad_old_cell.data_ptr() : nullptr, cn.const_data_ptr(),
                               g.const_data_ptr(), d_pre.data_ptr(), nullptr, 0, state,
                               /*zero_grad_h=*/false, /*dc_opmath=*/false};
  for_rows(batch, state, [&](int64_t begin, int64_t end) { kernels.backward(step, begin, end); });

  // dX = d_pre W = [grad_old_h | grad_input]: one GEMM per column block of W
  // asked for, straight into the output (measured at 16 x 32 x 128: two
  // GEMMs 20 us, one GEMM over W and two slice copies 22 us).
  const at::Tensor grad_input = output_mask[0] ? at::mm(d_pre, weights.narrow(1, state, features)) : not_asked();
  const at::Tensor grad_old_h = output_mask[3] ? at::mm(d_pre, weights.narrow(1, 0, state)) : not_asked();
  // dW = d_pre^T [old_h | input]: one GEMM (cheaper than one per block here).
  at::Tensor grad_weights = output_mask[1] ? at::mm(d_pre.t(), at::cat({old_h, input}, 1)) : not_asked();
  at::Tensor grad_bias = output_mask[2] ? d_pre.sum(0) : not_asked();
  return {grad_input, grad_weights, grad_bias, grad_old_h, grad_old_cell};
}

void register_cell(torch::Library& m) {
  m.impl("fused_cell_forward", &fused_cell_forward_cpu);
  m.impl("fused_cell_backward", &fused_cell_backward_cpu);
}

}  // namespace
}  // namespace lltm

LLTM_REGISTER_CPU_KERNELS(lltm::register_cell)
