// "fused" backend on the CPU, sequence operators: one LLTM layer over T
// steps, the time loop in C++ over preallocated buffers, with the backend's
// own GEMM (kernels.h), whose speed does not depend on the BLAS torch links.
//
// Forward: W (3S, S + I) is packed once per call; each step is one fused
// GEMM + cell kernel per unit block, [h_{t-1} | x_t] W^T straight into the
// cell's math (the input projection rides in the same K loop instead of a
// separate GEMM over T*B rows: the same multiply-adds, and no (T, B, 3S)
// buffer of pre-activations written and read back).
//
// Backward: W_h is packed once per call; each reverse step is one fused
// GEMM + cell-backward kernel per panel of unit blocks, dh_t = d_pre_{t+1} W_h
// into the gate derivatives of step t; the bias gradient is summed in the
// same kernel. The gradients of the input and the weights are GEMMs over all
// T*B rows afterwards (bfloat16 with native bfloat16 multiplies: at::mm,
// see common.h).
//
// Threads: the unit blocks are split over a team that runs the
// whole time loop in one parallel region, each thread packing and keeping
// its own share of the weights in its caches, one barrier per step (common.h:
// run_team).
//
// Variable lengths: past its length a row gets zero gates, keeps c, outputs
// 0 and carries h (in two buffers beside the output, written in turn: a step
// reads every unit of h_{t-1} while the team writes h_t). In backward such a
// row has d_pre = 0 and passes both carried gradients on.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../lltm.h"
#include "common.h"
#include "kernels.h"
#include "register.h"

namespace lltm {
namespace {

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
  const cpu::Kernels kernels = cpu::kernels_for(input);
  const int64_t steps = input.size(0), batch = input.size(1), features = input.size(2),
                state = weights.size(0) / 3;
  const auto options = input.options();
  at::Tensor output = at::empty({steps, batch, state}, options);
  at::Tensor gates = at::empty({steps, batch, 3 * state}, options);
  if (steps == 0 || batch == 0) {
    return {output, h0.clone(at::MemoryFormat::Contiguous), c0.clone(at::MemoryFormat::Contiguous), gates};
  }
  const at::Tensor w = cpu::rows_contiguous(weights);
  const at::Tensor x = cpu::rows_contiguous(input);  // rows of x_t at any (T, B) strides
  const at::Tensor b = cpu::contiguous_or_undefined(bias);
  const at::Tensor len = cpu::contiguous_or_undefined(lengths);
  const at::Tensor h_init = h0.contiguous(), c_init = c0.contiguous();
  const bool masked = len.defined();
  // With lengths, h is carried beside the output (which is 0 past a row's
  // length), in two buffers: h_{t-1} in carry[t % 2], h_t into the other.
  at::Tensor carry;
  if (masked) {
    carry = at::empty({2, batch, state}, options);
    carry[0].copy_(h_init);
  }
  // c_t in two (B, S) buffers written in turn (backward recomputes the cell
  // states, so they are not kept).
  at::Tensor c_buf = at::empty({2, batch, state}, options);
  const int64_t blocks = kernels.gate_blocks(state);
  at::Tensor packed =
      at::empty({kernels.gates_packed_size(state, state + features)}, options.dtype(cpu::opmath(input)));
  const int64_t* len_ptr = masked ? len.const_data_ptr<int64_t>() : nullptr;
  const int64_t workers = cpu::team_size(batch * 3 * state * (state + features), blocks);
  cpu::run_team(blocks, workers, [&](int64_t j0, int64_t j1, cpu::TeamSync& sync) {
    kernels.pack_gates(w.const_data_ptr(), w.stride(0), state, state + features, packed.data_ptr(), j0, j1);
    for (int64_t t = 0; t < steps; ++t) {
      cpu::ForwardStep step;
      step.h_prev = masked   ? step_ptr(carry, t % 2)
                    : t == 0 ? h_init.const_data_ptr()
                             : step_ptr(output, t - 1);
      step.ld_h = state;
      step.x = static_cast<const char*>(x.const_data_ptr()) + t * x.stride(0) * x.element_size();
      step.ld_x = x.stride(1);
      step.h_carry = masked ? step_ptr(carry, (t + 1) % 2) : nullptr;
      step.packed = packed.const_data_ptr();
      step.bias = cpu::ptr_or_null(b);
      step.c_prev = t == 0 ? c_init.const_data_ptr() : step_ptr(c_buf, (t - 1) % 2);
      step.c_new = step_ptr(c_buf, t % 2);
      step.h_new = step_ptr(output, t);
      step.gates = step_ptr(gates, t);
      step.lengths = len_ptr;
      step.step = t;
      step.batch = batch;
      step.state = state;
      step.features = features;
      kernels.forward(step, j0, j1);
      // h_t complete before any worker reads it as h_{t-1}
      if (t + 1 < steps) sync.wait();
    }
  });
  at::Tensor h_n = masked ? carry[steps % 2].clone() : output[steps - 1].clone(at::MemoryFormat::Contiguous);
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
  check_seq_backward_args("lltm::fused_seq_backward", grad_output, grad_h_n, grad_c_n, input, weights, h0, c0,
                          output, gates, lengths);
  const auto options = input.options();
  const AskedGradients asked(output_mask, options);
  if (!asked.any()) return asked.placeholders();
  const cpu::Kernels kernels = cpu::kernels_for(input);
  const int64_t steps = input.size(0), batch = input.size(1), features = input.size(2),
                state = weights.size(0) / 3;
  const auto dtype = input.scalar_type();
  const auto acc = options.dtype(cpu::opmath(input));
  const at::Tensor w = cpu::rows_contiguous(weights);

  // Carried gradients of h and c, in opmath, updated in place.
  at::Tensor dh = has(grad_h_n) ? grad_h_n->to(acc, false, true, at::MemoryFormat::Contiguous)
                                : at::zeros({batch, state}, acc);
  at::Tensor dc = has(grad_c_n) ? grad_c_n->to(acc, false, true, at::MemoryFormat::Contiguous)
                                : at::zeros({batch, state}, acc);
  at::Tensor d_pre = at::empty({steps, batch, 3 * state}, options);
  at::Tensor grad_bias = asked.bias ? at::zeros({3 * state}, acc) : at::Tensor();
  at::Tensor grad_h0 = asked.h ? at::empty({batch, state}, acc) : at::Tensor();
  if (steps > 0 && batch > 0) {
    const at::Tensor go = cpu::contiguous_or_undefined(grad_output);
    const at::Tensor cells = seq_cells(c0, gates).contiguous(), g = gates.contiguous();
    const at::Tensor len = cpu::contiguous_or_undefined(lengths);
    const int64_t* len_ptr = len.defined() ? len.const_data_ptr<int64_t>() : nullptr;
    const int64_t blocks = kernels.gate_blocks(state);
    at::Tensor packed = at::empty({kernels.units_packed_size(state)}, acc);
    const int64_t workers = cpu::team_size(batch * 3 * state * state, blocks);
    cpu::run_team(blocks, workers, [&](int64_t j0, int64_t j1, cpu::TeamSync& sync) {
      kernels.pack_units(w.const_data_ptr(), w.stride(0), state, packed.data_ptr(), j0, j1);
      cpu::BackwardStep step{};
      step.packed = packed.const_data_ptr();
      step.dh_carry = dh.data_ptr();
      step.dc_in = dc.const_data_ptr();
      step.dc_out = dc.data_ptr();
      step.bias_grad = asked.bias ? grad_bias.data_ptr() : nullptr;
      step.lengths = len_ptr;
      step.batch = batch;
      step.state = state;
      for (int64_t t = steps - 1; t >= 0; --t) {
        step.d_pre_next = t + 1 < steps ? step_ptr(d_pre, t + 1) : nullptr;
        step.grad_out = go.defined() ? step_ptr(go, t) : nullptr;
        step.cell = step_ptr(cells, t);
        step.gates = step_ptr(g, t);
        step.d_pre = step_ptr(d_pre, t);
        step.step = t;
        kernels.backward(step, j0, j1);
        // d_pre_t complete before any worker multiplies it by W_h
        if (t > 0 || asked.h) sync.wait();
      }
      if (asked.h) {
        // d h0 = d_pre_0 W_h (+ the carried gradient on rows of length 0)
        step.d_pre_next = step_ptr(d_pre, 0);
        step.dh_out = grad_h0.data_ptr();
        step.step = -1;
        kernels.backward(step, j0, j1);
      }
    });
  } else if (asked.h) {
    grad_h0.copy_(dh);
  }

  at::Tensor grad_input = asked.placeholder(), grad_weights = asked.placeholder();
  if (cpu::bf16_gemm_by_onednn(input)) {
    // the bias gradient is summed in the time loop
    const AskedGradients gemms({asked.input, asked.weights, false, false, false}, options);
    std::tie(grad_input, grad_weights, std::ignore) =
        seq_parameter_gradients(d_pre, input, weights, h0, output, gemms);
  } else {
    if (asked.input) {
      // dx = d_pre W_x over all T*B rows
      grad_input = at::empty({steps * batch, features}, acc);
      cpu::gemm_out(kernels, grad_input, d_pre.const_data_ptr(), 3 * state, 1,
                    static_cast<const char*>(w.const_data_ptr()) + state * w.element_size(), w.stride(0),
                    3 * state);
      grad_input = grad_input.view({steps, batch, features}).to(dtype);
    }
    if (asked.weights) {
      grad_weights = at::empty({3 * state, state + features}, acc);
      // dW = sum_t d_pre_t^T [h_{t-1} | x_t]: A = d_pre^T (strides 1, 3S)
      // over all T*B rows; h_{t-1} = h0 at t = 0, else output[t - 1] (equal
      // to the carried h on every row still inside its length, the only
      // rows with d_pre != 0).
      const at::Tensor gw_h = grad_weights.narrow(1, 0, state),
                       gw_x = grad_weights.narrow(1, state, features);
      const at::Tensor x = input.contiguous(), h_init = h0.contiguous(), out = output.contiguous();
      const int64_t ld = 3 * state;
      cpu::gemm_out(kernels, gw_x, d_pre.const_data_ptr(), 1, ld, x.const_data_ptr(), features,
                    steps * batch);
      cpu::gemm_out(kernels, gw_h, d_pre.const_data_ptr(), 1, ld, h_init.const_data_ptr(), state,
                    steps > 0 ? batch : 0);
      if (steps > 1) {
        cpu::gemm_out(kernels, gw_h, step_ptr(d_pre, 1), 1, ld, out.const_data_ptr(), state,
                      (steps - 1) * batch, /*accumulate=*/true);
      }
      grad_weights = grad_weights.to(dtype);
    }
  }
  // The carried gradients are this call's own buffers: fresh outputs.
  return {grad_input, grad_weights, asked.bias ? grad_bias.to(dtype) : asked.placeholder(),
          asked.h ? grad_h0.to(dtype) : asked.placeholder(), asked.c ? dc.to(dtype) : asked.placeholder()};
}

void register_seq(torch::Library& m) {
  m.impl("fused_seq_forward", &fused_seq_forward_cpu);
  m.impl("fused_seq_backward", &fused_seq_backward_cpu);
}

}  // namespace
}  // namespace lltm

LLTM_REGISTER_CPU_KERNELS(lltm::register_seq)
