// What every sequence backward operator shares, whatever its backend: the
// recomputed cell states (seq_cells) and the parameter and input gradients
// over all T*B rows once the reverse-time loop has produced d_pre
// (seq_parameter_gradients). ATen ops, plus the cell's recompute by the
// fused kernels of each device for the cell states.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include "lltm.h"

namespace lltm {

// seq_cells for CPU tensors (cpu/rnn_cpu.cpp): the LLTM cell's recompute
// (cells/lltm.h) by the fused CPU kernels of the capability ATen runs with,
// so that c' = c + candidate * input_gate rounds as the forwards round it:
// ATen's at::addcmul (the aten backend) and the fused CPU kernels are one
// fused multiply-add in the AVX2 and AVX512 builds of their kernels, and a
// product then a sum in the default build. Backward must see the forward's
// cell states bit for bit: a recomputation that rounds differently drifts
// from them, step after step, and at T = 3000 that alone made the float32
// gradients ~15x less accurate than the python backend's. Each row walks t
// over contiguous rows of S (at::cumsum over the time dimension walks every
// (b, j) column apart, with a stride, and cost as much as the rest of the
// backward at T=50, B=16, S=128); the state is carried in the tensor's
// dtype, as the forward stores it after every step.
at::Tensor seq_cells_cpu(const at::Tensor& c0, const at::Tensor& gates);

at::Tensor seq_cells(const at::Tensor& c0, const at::Tensor& gates) {
  const int64_t steps = gates.size(0), batch = gates.size(1), state = gates.size(2) / 3;
  const c10::ScalarType dtype = gates.scalar_type();
  if (steps == 0) return at::empty({0, batch, state}, gates.options());
#ifdef LLTM_WITH_CUDA
  // One thread per (row, unit) walking t with fused multiply-adds, as
  // nvcc compiles the forwards' update (at::addcmul's and the fused
  // kernels'); at::cumsum over the time dimension waited on memory once per
  // step and rounded each increment before adding it.
  if (gates.is_cuda()) return seq_cells_cuda(c0, gates);
#endif
  if (gates.is_cpu()) return seq_cells_cpu(c0, gates);
  // Other devices: c_t = c_{t-1} + candidate_t * input_gate_t as a running
  // sum over t (c0 in the first increment), in opmath.
  const c10::ScalarType acc = at::toOpMathType(dtype);
  at::Tensor increments = gates.narrow(2, 2 * state, state).to(acc) * gates.narrow(2, 0, state).to(acc);
  increments[0].add_(c0.to(acc));
  return at::cumsum(increments, 0).to(dtype);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> seq_parameter_gradients(
    const at::Tensor& d_pre, const at::Tensor& input, const at::Tensor& weights, const at::Tensor& h0,
    const at::Tensor& output, const AskedGradients& asked) {
  const int64_t steps = input.size(0), batch = input.size(1), features = input.size(2),
                state = weights.size(0) / 3;
  const at::Tensor d_all = d_pre.reshape({steps * batch, 3 * state});
  at::Tensor grad_input = asked.placeholder();
  if (asked.input) {
    grad_input = d_all.mm(weights.narrow(1, state, features)).view({steps, batch, features});
  }
  at::Tensor grad_weights = asked.placeholder();
  if (asked.weights) {
    grad_weights = at::empty({3 * state, state + features}, asked.options);
    at::Tensor gw_h = grad_weights.narrow(1, 0, state);
    at::Tensor gw_x = grad_weights.narrow(1, state, features);
    // dW_x = sum_t d_pre_t^T x_t: one GEMM over T*B rows
    at::mm_out(gw_x, d_all.t(), input.reshape({steps * batch, features}));
    // dW_h = sum_t d_pre_t^T h_{t-1}, h_{t-1} = h0 at t = 0, else the
    // output of step t - 1 (equal to the carried h on every row still
    // inside its length, the only rows with d_pre != 0).
    if (steps == 0) {
      gw_h.zero_();
    } else {
      at::mm_out(gw_h, d_pre[0].t(), h0);
      if (steps > 1) {
        gw_h.addmm_(d_pre.narrow(0, 1, steps - 1).reshape({(steps - 1) * batch, 3 * state}).t(),
                    output.narrow(0, 0, steps - 1).reshape({(steps - 1) * batch, state}));
      }
    }
  }
  at::Tensor grad_bias = asked.bias ? d_all.sum(0) : asked.placeholder();
  return {grad_input, grad_weights, grad_bias};
}

}  // namespace lltm
