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
#include <torch/library.h>

#include "../lltm.h"
#include "../precision.h"

namespace lltm {
namespace {

constexpr const char* kForwardOp = "lltm::aten_seq_forward";
constexpr const char* kBackwardOp = "lltm::aten_seq_backward";

bool has(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// (T, B, 1) in the input's dtype: 1 where step t of row b is inside the
// row's length, else 0.
at::Tensor step_mask(const at::Tensor& lengths, int64_t steps, const at::Tensor& like) {
  const at::Tensor t = at::arange(steps, lengths.options()).unsqueeze(1);
  return at::lt(t, lengths.unsqueeze(0)).to(like.scalar_type()).unsqueeze(2);
}

}  // namespace

SeqForwardResult aten_seq_forward(const at::Tensor& input, const at::Tensor& weights,
                                  const std::optional<at::Tensor>& bias, const at::Tensor& h0,
                                  const at::Tensor& c0, const std::optional<at::Tensor>& lengths) {
  check_seq_forward_args(kForwardOp, input, weights, bias, h0, c0, lengths);
  const Fp32PassGuard precision(false);  // the forward's products as lltm's mode wants (precision.h)
  const int64_t steps = input.size(0), batch = input.size(1), features = input.size(2),
                state = weights.size(0) / 3;
  const auto options = input.options();
  at::Tensor output = at::empty({steps, batch, state}, options);
  at::Tensor gates = at::empty({steps, batch, 3 * state}, options);
  if (steps == 0) {
    return {output, h0.clone(at::MemoryFormat::Contiguous), c0.clone(at::MemoryFormat::Contiguous), gates};
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
    addmm_rows_out(gates_all, *bias, x_all, w_x_t);
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
  return {output, h.clone(at::MemoryFormat::Contiguous), c.clone(at::MemoryFormat::Contiguous), gates};
}

SeqBackwardResult aten_seq_backward(const std::optional<at::Tensor>& grad_output,
                                    const std::optional<at::Tensor>& grad_h_n,
                                    const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input,
                                    const at::Tensor& weights, const at::Tensor& h0, const at::Tensor& c0,
                                    const at::Tensor& output, const at::Tensor& gates,
                                    const std::optional<at::Tensor>& lengths, OutputMask output_mask) {
  check_seq_backward_args(kBackwardOp, grad_output, grad_h_n, grad_c_n, input, weights, h0, c0, output, gates,
                          lengths);
  const Fp32PassGuard precision(true);  // the backward's products as lltm's mode wants (precision.h)
  const auto options = input.options();
  const AskedGradients asked(output_mask, options);
  if (!asked.any()) return asked.placeholders();
  const int64_t steps = input.size(0), batch = input.size(1), state = weights.size(0) / 3;
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
      if (t > 0 || asked.h) {
        // d h_{t-1} = d_pre W_h (+ gh on rows past their length)
        dh = masked ? at::addmm(gh * unmask[t], dp, w_h) : dp.mm(w_h);
      }
      dc = dc_t;  // d c_t / d c_{t-1} = 1
    }
  }

  auto [grad_input, grad_weights, grad_bias] =
      seq_parameter_gradients(d_pre, input, weights, h0, output, asked);
  // With T = 0 the carried gradients are the incoming ones: copy them, as
  // outputs of an operator must not alias its inputs. Otherwise they are
  // results of the loop.
  const auto fresh = [&](const at::Tensor& g) {
    return steps == 0 ? g.clone(at::MemoryFormat::Contiguous) : g.contiguous();
  };
  at::Tensor grad_h0 = asked.h ? fresh(dh) : asked.placeholder();
  at::Tensor grad_c0 = asked.c ? fresh(dc) : asked.placeholder();
  return {grad_input, grad_weights, grad_bias, grad_h0, grad_c0};
}

}  // namespace lltm

TORCH_LIBRARY_IMPL(lltm, CompositeExplicitAutograd, m) {
  m.impl("aten_seq_forward", &lltm::aten_seq_forward);
  m.impl("aten_seq_backward", &lltm::aten_seq_backward);
}
