// "fused" backend on the CPU, sequence operators: one LLTM layer over T
// steps, the time loop in C++ over preallocated buffers (no allocation per
// step).
//
// Forward: the input projection of all T steps is one GEMM over T*B rows,
// written into the gates output; each step is one GEMM h_{t-1} W_h^T into a
// workspace and one pass (pointwise.h) that adds it and the bias, applies
// the activations, updates the cell and writes c_t, h_t and the activated
// gates in place.
//
// Backward: each reverse step is one pass (the gradient of h_t, the gradient
// of c_t carried in fp32 for bf16 / fp16, every gate derivative) and one
// GEMM d_pre_t W_h for the gradient of h_{t-1}; the gradients of the input,
// the weights and the bias are one GEMM / reduction each over all T*B rows
// afterwards, as in the aten backend (aten/seq_aten.cpp).
//
// Variable lengths: past its length a row gets zero gates, keeps c, outputs
// 0 and carries h (in a workspace beside the output). In backward such a
// row has d_pre = 0 and passes both carried gradients on: the pass zeroes
// the h gradient only on rows inside their length, and the GEMM accumulates
// into it.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include "../lltm.h"
#include "pointwise.h"
#include "register.h"
#include "rows.h"

namespace lltm {
namespace {

using cpu::for_rows;
using cpu::has;
using cpu::step_ptr;

SeqForwardResult fused_seq_forward_cpu(const at::Tensor& input,                   // (T, B, I)
                                       const at::Tensor& weights,                 // (3S, S + I)
                                       const std::optional<at::Tensor>& bias,     // (3S,)
                                       const at::Tensor& h0,                      // (B, S)
                                       const at::Tensor& c0,                      // (B, S)
                                       const std::optional<at::Tensor>& lengths)  // (B,) int64
{
  check_seq_forward_args("lltm::fused_seq_forward", input, weights, bias, h0, c0, lengths);
  const cpu::PointwiseKernels kernels = cpu::kernels_for(input);
  const int64_t steps = input.size(0), batch = input.size(1), features = input.size(2),
                state = weights.size(0) / 3;
  const auto options = input.options();
  at::Tensor output = at::empty({steps, batch, state}, options);
  at::Tensor gates = at::empty({steps, batch, 3 * state}, options);
  if (steps == 0) {
    return {output, h0.clone(at::MemoryFormat::Contiguous), c0.clone(at::MemoryFormat::Contiguous), gates};
  }
  const at::Tensor w = weights.contiguous();
  const at::Tensor w_h = w.narrow(1, 0, state);         // (3S, S)
  const at::Tensor w_x = w.narrow(1, state, features);  // (3S, I)
  // gates[t] = x_t W_x^T for every t: one GEMM over T*B rows.
  at::Tensor gates_all = gates.view({steps * batch, 3 * state});
  at::mm_out(gates_all, input.reshape({steps * batch, features}), w_x.t());

  const at::Tensor b = cpu::contiguous_or_undefined(bias);
  const at::Tensor len = cpu::contiguous_or_undefined(lengths);
  const at::Tensor c_init = c0.contiguous();
  const bool masked = len.defined();
  // With lengths, h is carried beside the output (which is 0 past a row's
  // length); without, h_{t-1} is output[t - 1].
  at::Tensor h_carry = masked ? h0.clone(at::MemoryFormat::Contiguous) : at::Tensor();
  at::Tensor hproj = at::empty({batch, 3 * state}, options);  // h_{t-1} W_h^T
  // W_h^T made contiguous once: MKL then runs the per-step GEMM without
  // packing W_h again on every call (16 x 128 x 384: 10 us a step instead of
  // 17 us, for a copy of ~35 us once per sequence).
  const at::Tensor w_h_t = w_h.t().contiguous();  // (S, 3S)
  // c_t in two (B, S) buffers written in turn (backward recomputes the
  // cell states, so they are not kept).
  at::Tensor c_buf = at::empty({2, batch, state}, options);
  const int64_t* len_ptr = masked ? len.const_data_ptr<int64_t>() : nullptr;
  for (int64_t t = 0; t < steps; ++t) {
    const at::Tensor h_prev = masked ? h_carry : (t == 0 ? h0 : output[t - 1]);
    at::mm_out(hproj, h_prev, w_h_t);
    const void* c_prev = t == 0 ? c_init.const_data_ptr() : step_ptr(c_buf, (t - 1) % 2);
    const cpu::ForwardStep step{step_ptr(gates, t), hproj.const_data_ptr(), cpu::ptr_or_null(b), c_prev,
                                step_ptr(c_buf, t % 2), step_ptr(output, t),
                                masked ? h_carry.data_ptr() : nullptr, len_ptr, t, state};
    for_rows(batch, state, [&](int64_t begin, int64_t end) { kernels.forward(step, begin, end); });
  }
  at::Tensor h_n = masked ? h_carry : output[steps - 1].clone(at::MemoryFormat::Contiguous);
  return {output, h_n, c_buf[(steps - 1) % 2].clone(at::MemoryFormat::Contiguous), gates};
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
  check_seq_backward_args("lltm::fused_seq_backward", grad_output, grad_h_n, grad_c_n, input, weights, h0,
                          c0, output, gates, lengths);
  const auto options = input.options();
  const AskedGradients asked(output_mask, options);
  if (!asked.any()) return asked.placeholders();
  const auto not_asked = [&] { return asked.placeholder(); };
  const bool want_h0 = asked.h, want_c0 = asked.c;
  const cpu::PointwiseKernels kernels = cpu::kernels_for(input);
  const int64_t steps = input.size(0), batch = input.size(1), state = weights.size(0) / 3;
  const at::Tensor w = weights.contiguous();
  const at::Tensor w_h = w.narrow(1, 0, state);
  const auto acc_options = options.dtype(at::toOpMathType(input.scalar_type()));

  // Carried gradients of h (the dtype of the GEMM that produces it) and of c
  // (fp32 for bf16 / fp16), fresh buffers updated in place every step.
  at::Tensor dh = has(grad_h_n) ? grad_h_n->clone(at::MemoryFormat::Contiguous)
                                : at::zeros({batch, state}, options);
  at::Tensor dc = has(grad_c_n) ? grad_c_n->to(acc_options, /*non_blocking=*/false, /*copy=*/true,
                                               at::MemoryFormat::Contiguous)
                                : at::zeros({batch, state}, acc_options);
  at::Tensor d_pre = at::empty({steps, batch, 3 * state}, options);
  if (steps > 0) {
    const at::Tensor go = cpu::contiguous_or_undefined(grad_output);
    const at::Tensor cs = seq_cells(c0, gates).contiguous(), g = gates.contiguous();
    const at::Tensor len = cpu::contiguous_or_undefined(lengths);
    const bool masked = len.defined();
    const int64_t* len_ptr = masked ? len.const_data_ptr<int64_t>() : nullptr;
    for (int64_t t = steps - 1; t >= 0; --t) {
      const cpu::BackwardStep step{dh.data_ptr(), go.defined() ? step_ptr(go, t) : nullptr,
                                   dc.const_data_ptr(), dc.data_ptr(), step_ptr(cs, t),
                                   step_ptr(g, t), step_ptr(d_pre, t), len_ptr, t, state,
                                   /*zero_grad_h=*/masked, /*dc_opmath=*/true};
      for_rows(batch, state, [&](int64_t begin, int64_t end) { kernels.backward(step, begin, end); });
      if (t > 0 || want_h0) {
        // d h_{t-1} = d_pre_t W_h (+ the carried gradient on rows past their length)
        if (masked) {
          dh.addmm_(d_pre[t], w_h);
        } else {
          at::mm_out(dh, d_pre[t], w_h);
        }
      }
    }
  }

  auto [grad_input, grad_weights, grad_bias] = seq_parameter_gradients(
      d_pre, input, weights, h0, output, asked);
  // dh and dc are this call's own buffers: fresh outputs as they are.
  at::Tensor grad_h0 = want_h0 ? dh : not_asked();
  at::Tensor grad_c0 = not_asked();
  if (want_c0) grad_c0 = dc.scalar_type() == input.scalar_type() ? dc : dc.to(input.scalar_type());
  return {grad_input, grad_weights, grad_bias, grad_h0, grad_c0};
}

void register_seq(torch::Library& m) {
  m.impl("fused_seq_forward", &fused_seq_forward_cpu);
  m.impl("fused_seq_backward", &fused_seq_backward_cpu);
}

}  // namespace
}  // namespace lltm

LLTM_REGISTER_CPU_KERNELS(lltm::register_seq)
