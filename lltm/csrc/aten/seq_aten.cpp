// "aten" backend, sequence operators: one LLTM layer over T steps with the
// time loop in C++, written with ATen ops (any device).
//
// Forward: the input projection of all T steps is one GEMM over T*B rows,
// written straight into the gates buffer; each step then adds h_{t-1} W_h^T
// (one GEMM) and runs the cell's pointwise math in place (5 ops).
//
// Backward: every factor of the gate derivatives that does not depend on
// the incoming gradient is computed for all T steps at once before the loop
// (one op each over T*B*S elements):
//   A_t   = o_t (1 - tanh(c_t)^2)              d c_t / d h-path
//   P_i,t = elu(z_c) * i (1 - i)                d pre_i = dc * P_i
//   P_o,t = tanh(c_t) * o (1 - o)               d pre_o = dh * P_o
//   P_c,t = i * elu'(z_c)                       d pre_c = dc * P_c
// so the reverse-time loop is 6 ops per step (5 pointwise + one GEMM with
// W_h), and grad_weights, grad_input and grad_bias are one GEMM / reduction
// each over all T*B rows after it.
//
// Variable lengths: rows whose step t is past their length get zero gates,
// which makes the cell update keep c and write h = 0 (the output's padding);
// the carried h is kept beside the output. In backward the zero gates make
// every P and A vanish on those rows, so d_pre = 0 and dc passes through;
// dh passes through by one extra term per step.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>
#include <torch/library.h>

#include "../lltm.h"

namespace lltm {
namespace {

constexpr const char* kForwardOp = "lltm::aten_seq_forward";
constexpr const char* kBackwardOp = "lltm::aten_seq_backward";

bool has(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined();
}

// (T, B, 1) in the input's dtype: 1 where step t of row b is inside the
// row's length, else 0.
at::Tensor step_mask(const at::Tensor& lengths, int64_t steps,
                     const at::Tensor& like) {
  const at::Tensor t = at::arange(steps, lengths.options()).unsqueeze(1);
  return at::lt(t, lengths.unsqueeze(0)).to(like.scalar_type()).unsqueeze(2);
}

}  // namespace

SeqForwardResult aten_seq_forward(const at::Tensor& input,
                                  const at::Tensor& weights,
                                  const std::optional<at::Tensor>& bias,
                                  const at::Tensor& h0, const at::Tensor& c0,
                                  const std::optional<at::Tensor>& lengths) {
  check_seq_forward_args(kForwardOp, input, weights, bias, h0, c0, lengths);
  const int64_t steps = input.size(0), batch = input.size(1),
                features = input.size(2), state = weights.size(0) / 3;
  const auto options = input.options();
  at::Tensor output = at::empty({steps, batch, state}, options);
  at::Tensor gates = at::empty({steps, batch, 3 * state}, options);
  if (steps == 0) {
    return {output, h0.clone(at::MemoryFormat::Contiguous),
            c0.clone(at::MemoryFormat::Contiguous), gates};
  }
  // W_h^T (S, 3S) as a contiguous copy, made once: a transposed view of a
  // row-major matrix is the slower operand of the small per-step GEMM on CPU
  // BLAS (17 vs 10 us at 16 x 128 x 384). The one projection GEMM over T*B
  // rows takes W_x^T as a view: there the copy costs more than it saves
  // (2 threads, 800 x 32 x 384: 88 us with the view, 105 + 9 with the copy).
  const at::Tensor w_h_t = weights.narrow(1, 0, state).t().contiguous();
  const at::Tensor w_x_t = weights.narrow(1, state, features).t();
  // gates[t] = x_t W_x^T + b for every t: one GEMM over T*B rows.
  const at::Tensor x_all = input.reshape({steps * batch, features});
  at::Tensor gates_all = gates.view({steps * batch, 3 * state});
  if (has(bias)) {
    at::addmm_out(gates_all, *bias, x_all, w_x_t);
  } else {
    at::mm_out(gates_all, x_all, w_x_t);
  }
  const bool masked = has(lengths);
  at::Tensor mask, unmask;  // (T, B, 1): inside / past each row's length
  if (masked) {
    mask = step_mask(*lengths, steps, input);
    unmask = 1 - mask;
  }
  // Views of every step's gates, made once (a view per step and gate costs
  // about a microsecond of dispatch).
  const at::Tensor io_all = gates.narrow(2, 0, 2 * state);  // (T, B, 2S)
  const at::Tensor i_all = gates.narrow(2, 0, state);
  const at::Tensor o_all = gates.narrow(2, state, state);
  const at::Tensor cand_all = gates.narrow(2, 2 * state, state);
  at::Tensor h = h0;
  at::Tensor c = c0;
  for (int64_t t = 0; t < steps; ++t) {
    at::Tensor g = gates[t];  // (B, 3S)
    g.addmm_(h, w_h_t);       // + h_{t-1} W_h^T
    io_all[t].sigmoid_();
    at::Tensor candidate = cand_all[t];
    at::elu_(candidate);
    if (masked) g.mul_(mask[t]);
    // c_t = c + elu(z_c) * i;  h_t = tanh(c_t) * o
    const at::Tensor c_t = at::addcmul(c, candidate, i_all[t]);
    at::Tensor h_t = output[t];
    at::tanh_out(h_t, c_t).mul_(o_all[t]);
    // Past its length a row's output is 0 and its h is carried.
    h = masked ? at::addcmul(h_t, h, unmask[t]) : h_t;
    c = c_t;
  }
  return {output, h.clone(at::MemoryFormat::Contiguous),
          c.clone(at::MemoryFormat::Contiguous), gates};
}

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
    const at::Tensor& h0, const at::Tensor& output, bool want_input,
    bool want_weights, bool want_bias) {
  const int64_t steps = input.size(0), batch = input.size(1),
                features = input.size(2), state = weights.size(0) / 3;
  const auto options = input.options();
  const auto not_asked = [&] { return at::empty({0}, options); };
  const at::Tensor d_all = d_pre.reshape({steps * batch, 3 * state});
  at::Tensor grad_input = not_asked();
  if (want_input) {
    grad_input = d_all.mm(weights.narrow(1, state, features))
                     .view({steps, batch, features});
  }
  at::Tensor grad_weights = not_asked();
  if (want_weights) {
    grad_weights = at::empty({3 * state, state + features}, options);
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
  at::Tensor grad_bias = want_bias ? d_all.sum(0) : not_asked();
  return {grad_input, grad_weights, grad_bias};
}

SeqBackwardResult aten_seq_backward(
    const std::optional<at::Tensor>& grad_output,
    const std::optional<at::Tensor>& grad_h_n,
    const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input,
    const at::Tensor& weights, const at::Tensor& h0, const at::Tensor& c0,
    const at::Tensor& output, const at::Tensor& gates,
    const std::optional<at::Tensor>& lengths, OutputMask output_mask) {
  check_seq_backward_args(kBackwardOp, grad_output, grad_h_n, grad_c_n, input,
                          weights, h0, c0, output, gates, lengths);
  const auto options = input.options();
  const auto not_asked = [&] { return at::empty({0}, options); };
  const bool want_input = output_mask[0], want_weights = output_mask[1],
             want_bias = output_mask[2], want_h0 = output_mask[3],
             want_c0 = output_mask[4];
  if (!(want_input || want_weights || want_bias || want_h0 || want_c0)) {
    return {not_asked(), not_asked(), not_asked(), not_asked(), not_asked()};
  }
  const int64_t steps = input.size(0), batch = input.size(1),
                state = weights.size(0) / 3;
  const at::Tensor w_h = weights.narrow(1, 0, state);

  // Carried gradients of h and c, starting from those of h_n and c_n.
  at::Tensor dh = has(grad_h_n) ? *grad_h_n : at::zeros({batch, state}, options);
  at::Tensor dc = has(grad_c_n) ? *grad_c_n : at::zeros({batch, state}, options);
  at::Tensor d_pre = at::empty({steps, batch, 3 * state}, options);

  if (steps > 0) {
    const at::Tensor i = gates.narrow(2, 0, state);
    const at::Tensor o = gates.narrow(2, state, state);
    const at::Tensor candidate = gates.narrow(2, 2 * state, state);
    at::Tensor p_i = d_pre.narrow(2, 0, state);
    at::Tensor p_o = d_pre.narrow(2, state, state);
    at::Tensor p_c = d_pre.narrow(2, 2 * state, state);
    const at::Tensor tanh_cells = at::tanh(seq_cells(c0, gates));
    // A = o (1 - tanh(c)^2): d c_t / d h_t through h_t = tanh(c_t) o
    const at::Tensor a = at::tanh_backward(o, tanh_cells);
    // d sigmoid(z) = s (1 - s);  d elu(z) = 1 if z > 0 else elu(z) + 1
    at::sigmoid_backward_out(p_i, candidate, i);
    at::sigmoid_backward_out(p_o, tanh_cells, o);
    at::elu_backward_out(p_c, i, /*alpha=*/1, /*scale=*/1, /*input_scale=*/1,
                         /*is_result=*/true, candidate);

    const bool masked = has(lengths);
    at::Tensor unmask, grad_out;
    if (has(grad_output)) grad_out = *grad_output;
    if (masked) {
      const at::Tensor mask = step_mask(*lengths, steps, input);
      unmask = 1 - mask;
      // The output is a constant 0 past a row's length.
      if (grad_out.defined()) grad_out = grad_out * mask;
    }
    // The input and candidate factors of d_pre both scale with d c_t: one
    // strided view (T, B, 2, S) of columns [0, S) and [2S, 3S) per step.
    const at::Tensor p_ic = d_pre.view({steps, batch, 3, state}).slice(2, 0, 3, 2);
    for (int64_t t = steps - 1; t >= 0; --t) {
      // Total gradient of h_t: carried from step t + 1 plus the output's.
      const at::Tensor gh = grad_out.defined() ? dh + grad_out[t] : dh;
      // Total gradient of c_t.
      const at::Tensor dc_t = at::addcmul(dc, gh, a[t]);
      p_ic[t].mul_(dc_t.unsqueeze(1));
      p_o[t].mul_(gh);
      const at::Tensor dp = d_pre[t];  // (B, 3S)
      if (t > 0 || want_h0) {
        // d h_{t-1} = d_pre W_h (+ gh on rows past their length)
        dh = masked ? at::addmm(gh * unmask[t], dp, w_h) : dp.mm(w_h);
      }
      dc = dc_t;  // d c_t / d c_{t-1} = 1
    }
  }

  auto [grad_input, grad_weights, grad_bias] = seq_parameter_gradients(
      d_pre, input, weights, h0, output, want_input, want_weights, want_bias);
  // With T = 0 the carried gradients are the incoming ones: copy them, as
  // outputs of an operator must not alias its inputs. Otherwise they are
  // results of the loop.
  const auto fresh = [&](const at::Tensor& g) {
    return steps == 0 ? g.clone(at::MemoryFormat::Contiguous) : g.contiguous();
  };
  at::Tensor grad_h0 = want_h0 ? fresh(dh) : not_asked();
  at::Tensor grad_c0 = want_c0 ? fresh(dc) : not_asked();
  return {grad_input, grad_weights, grad_bias, grad_h0, grad_c0};
}

}  // namespace lltm

TORCH_LIBRARY_IMPL(lltm, CompositeExplicitAutograd, m) {
  m.impl("aten_seq_forward", &lltm::aten_seq_forward);
  m.impl("aten_seq_backward", &lltm::aten_seq_backward);
}
