// What every sequence backward operator shares, whatever its backend: the
// recomputed cell states (seq_cells) and the parameter and input gradients
// over all T*B rows once the reverse-time loop has produced d_pre
// (seq_parameter_gradients). ATen ops, plus a row-wise loop on CPU and a
// kernel on CUDA for the cell states.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "lltm.h"

namespace lltm {

at::Tensor seq_cells(const at::Tensor& c0, const at::Tensor& gates) {
  const int64_t steps = gates.size(0), batch = gates.size(1),
                state = gates.size(2) / 3;
  const c10::ScalarType dtype = gates.scalar_type();
  if (steps == 0) return at::empty({0, batch, state}, gates.options());
#ifdef LLTM_WITH_CUDA
  // at::cumsum over the time dimension waits on memory once per step.
  if (gates.is_cuda()) return seq_cells_cuda(c0, gates);
#endif
  if (gates.is_cpu()) {
    // Each batch row walks t over contiguous rows of S (at::cumsum over the
    // time dimension walks every (b, j) column apart, with a stride, and
    // cost as much as the rest of the backward at T=50, B=16, S=128).
    const at::Tensor g = gates.contiguous();
    const at::Tensor c_init = c0.contiguous();
    at::Tensor cells = at::empty({steps, batch, state}, gates.options());
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kHalf, at::kBFloat16, dtype, "lltm_seq_cells", [&] {
          using acc_t = at::opmath_type<scalar_t>;
          const scalar_t* gp = g.const_data_ptr<scalar_t>();
          const scalar_t* cp = c_init.const_data_ptr<scalar_t>();
          scalar_t* out = cells.mutable_data_ptr<scalar_t>();
          const int64_t grain = std::max<int64_t>(1, 32768 / (steps * state + 1));
          at::parallel_for(0, batch, grain, [&](int64_t begin, int64_t end) {
            std::vector<acc_t> c(state);
            for (int64_t b = begin; b < end; ++b) {
              for (int64_t j = 0; j < state; ++j) c[j] = static_cast<acc_t>(cp[b * state + j]);
              for (int64_t t = 0; t < steps; ++t) {
                const scalar_t* i = gp + (t * batch + b) * 3 * state;
                const scalar_t* candidate = i + 2 * state;
                scalar_t* c_t = out + (t * batch + b) * state;
                for (int64_t j = 0; j < state; ++j) {
                  c[j] = c[j] + static_cast<acc_t>(candidate[j]) * static_cast<acc_t>(i[j]);
                  c_t[j] = static_cast<scalar_t>(c[j]);
                }
              }
            }
          });
        });
    return cells;
  }
  const c10::ScalarType acc = at::toOpMathType(dtype);
  // c_t = c_{t-1} + candidate_t * input_gate_t, summed in the forward's
  // order: c0 goes into the first increment, then a running sum over t.
  at::Tensor increments = gates.narrow(2, 2 * state, state).to(acc) *
                          gates.narrow(2, 0, state).to(acc);
  increments[0].add_(c0.to(acc));
  return at::cumsum(increments, 0).to(dtype);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> seq_parameter_gradients(
    const at::Tensor& d_pre, const at::Tensor& input, const at::Tensor& weights,
    const at::Tensor& h0, const at::Tensor& output,
    const AskedGradients& asked) {
  const int64_t steps = input.size(0), batch = input.size(1),
                features = input.size(2), state = weights.size(0) / 3;
  const at::Tensor d_all = d_pre.reshape({steps * batch, 3 * state});
  at::Tensor grad_input = asked.placeholder();
  if (asked.input) {
    grad_input = d_all.mm(weights.narrow(1, state, features))
                     .view({steps, batch, features});
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
        gw_h.addmm_(d_pre.narrow(0, 1, steps - 1)
                        .reshape({(steps - 1) * batch, 3 * state})
                        .t(),
                    output.narrow(0, 0, steps - 1)
                        .reshape({(steps - 1) * batch, state}));
      }
    }
  }
  at::Tensor grad_bias = asked.bias ? d_all.sum(0) : asked.placeholder();
  return {grad_input, grad_weights, grad_bias};
}

}  // namespace lltm
