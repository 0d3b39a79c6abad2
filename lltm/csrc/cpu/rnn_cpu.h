// The fused CPU backend's sequence operators for any cell (cells/cell.h),
// as templates: rnn_cpu.cpp instantiates them for the built-in cells, a
// cell defined with lltm.cells.define for its own (its generated source).
// How the layer runs is described in rnn_cpu.cpp.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../rnn.h"
#include "../rnn_ops.h"
#include "common.h"
#include "kernels.h"

namespace lltm {
namespace cpu {

// The biases of zx and zh in opmath (undefined where absent): a cell
// without kSplit gets their sum in zx.
template <typename Cell>
std::pair<at::Tensor, at::Tensor> forward_biases(const RnnArgs& a) {
  const auto acc = opmath(a.input);
  const auto as_acc = [&](const at::Tensor& b) {
    return b.defined() ? b.to(acc).contiguous() : at::Tensor();
  };
  if constexpr (Cell::kSplit) {
    return {as_acc(a.b_ih), as_acc(a.b_hh)};
  } else {
    if (a.b_ih.defined() && a.b_hh.defined()) return {a.b_ih.to(acc) + a.b_hh.to(acc), at::Tensor()};
    return {as_acc(a.b_ih.defined() ? a.b_ih : a.b_hh), at::Tensor()};
  }
}

// The initial states other than h, (NS - 1, B, S) contiguous (undefined for NS = 1).
inline at::Tensor other_states(const std::vector<at::Tensor>& state) {
  if (state.size() < 2) return at::Tensor();
  if (state.size() == 2) return state[1].contiguous().unsqueeze(0);
  return at::stack(at::TensorList(state).slice(1)).contiguous();
}

// The states other than h after every step, (NS - 1, T, B, S), rebuilt from
// the initial ones (s0: (NS - 1, B, S) contiguous) and the saved values.
inline at::Tensor recompute_states(const Kernels& k, const at::Tensor& saved, const at::Tensor& s0,
                                   const at::Tensor& lengths, int64_t states) {
  const int64_t T = saved.size(0), B = saved.size(1), S = s0.size(2);
  at::Tensor out = at::empty({states - 1, T, B, S}, saved.options());
  const RecomputeStates p{saved.const_data_ptr(),
                          s0.const_data_ptr(),
                          out.data_ptr(),
                          lengths.defined() ? lengths.const_data_ptr<int64_t>() : nullptr,
                          T,
                          B,
                          S};
  // a row's walk over t is its own: rows split over torch's threads
  const int64_t grain = std::max<int64_t>(1, 32768 / (T * S + 1));
  at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) { k.recompute(p, begin, end); });
  return out;
}

template <typename Cell>
void rnn_forward(const RnnArgs& a, at::Tensor& output, std::vector<at::Tensor>& state_n, at::Tensor& saved) {
  constexpr int NS = Cell::kStates;
  const int64_t T = a.steps(), B = a.batch(), I = a.features(), S = a.hidden();
  if (T == 0 || B == 0) {
    for (int k = 0; k < NS; ++k) state_n[k].copy_(a.state[k]);
    return;
  }
  const Kernels kernels = kernels_for<Cell>(a.input);
  const auto options = a.input.options();
  const at::Tensor w_hh = rows_contiguous(a.w_hh), w_ih = rows_contiguous(a.w_ih);
  const at::Tensor x = rows_contiguous(a.input);  // rows of x_t at any (T, B) strides
  const at::Tensor h_init = a.state[0].contiguous();
  const auto [bias_x, bias_h] = forward_biases<Cell>(a);
  const bool masked = a.lengths.defined();
  const at::Tensor len = masked ? a.lengths.contiguous() : at::Tensor();
  // With lengths, h is carried beside the output (which is 0 past a row's
  // length), in two buffers: h_{t-1} in carry[t % 2], h_t into the other.
  at::Tensor carry;
  if (masked) {
    carry = at::empty({2, B, S}, options);
    carry[0].copy_(h_init);
  }
  // The other states in two (NS - 1, B, S) buffers written in turn (backward
  // recomputes them, so they are not kept): step t reads slot (t + 1) % 2
  // (the initial states in slot 1) and writes slot t % 2.
  at::Tensor s_buf;
  if (NS > 1) {
    s_buf = at::empty({2, NS - 1, B, S}, options);
    const at::Tensor initial = s_buf.select(0, 1);
    for (int k = 1; k < NS; ++k) initial.select(0, k - 1).copy_(a.state[k]);
  }
  const int64_t blocks = kernels.blocks(S);
  at::Tensor packed = at::empty({kernels.forward_packed_size(S, I)}, options.dtype(opmath(a.input)));
  const int64_t workers = team_size(B * kernels.gates * S * (S + I), blocks);
  run_team(blocks, workers, [&](int64_t j0, int64_t j1, TeamSync& sync) {
    kernels.pack_forward(w_hh.const_data_ptr(), w_hh.stride(0), w_ih.const_data_ptr(), w_ih.stride(0), S, I,
                         packed.data_ptr(), j0, j1);
    ForwardStep step{};
    step.ld_h = S;
    step.ld_x = x.stride(1);
    step.packed = packed.const_data_ptr();
    step.bias_x = ptr_or_null(bias_x);
    step.bias_h = ptr_or_null(bias_h);
    step.ld_s = S;
    step.s_stride = B * S;
    step.lengths = masked ? len.const_data_ptr<int64_t>() : nullptr;
    step.batch = B;
    step.state = S;
    step.features = I;
    for (int64_t t = 0; t < T; ++t) {
      step.h_prev = masked   ? step_ptr(carry, t % 2)
                    : t == 0 ? h_init.const_data_ptr()
                             : step_ptr(output, t - 1);
      step.x = static_cast<const char*>(x.const_data_ptr()) + t * x.stride(0) * x.element_size();
      step.h_carry = masked ? step_ptr(carry, (t + 1) % 2) : nullptr;
      step.s_prev = NS > 1 ? step_ptr(s_buf, (t + 1) % 2) : nullptr;
      step.s_next = NS > 1 ? step_ptr(s_buf, t % 2) : nullptr;
      step.h_new = step_ptr(output, t);
      step.saved = step_ptr(saved, t);
      step.step = t;
      kernels.forward(step, j0, j1);
      // h_t complete before any worker reads it as h_{t-1}
      if (t + 1 < T) sync.wait();
    }
  });
  state_n[0].copy_(masked ? carry[T % 2] : output[T - 1]);
  for (int k = 1; k < NS; ++k) state_n[k].copy_(s_buf[(T - 1) % 2][k - 1]);
}

// A gradient to write as an opmath matrix with unit column stride: itself
// where it is one (LLTM's column blocks of grad_weights in float), else a
// buffer copied to it by `finish`.
struct Destination {
  at::Tensor target, buffer;
  void finish() {
    if (!buffer.is_same(target)) target.copy_(buffer);
  }
};
inline Destination destination(const at::Tensor& t) {
  if (t.scalar_type() == opmath(t) && t.stride(1) == 1 && (t.size(0) <= 1 || t.stride(0) >= t.size(1))) {
    return {t, t};
  }
  return {t, at::empty(t.sizes(), t.options().dtype(opmath(t)))};
}

// grad_input, grad_W_ih and grad_W_hh from dzx and dzh (T, B, G S), where
// `grads` asks for them.
inline void parameter_gradients(const Kernels& k, const RnnArgs& a, const at::Tensor& output,
                                const at::Tensor& h0, const at::Tensor& dzx, const at::Tensor& dzh,
                                RnnGradients& grads) {
  const int64_t T = a.steps(), B = a.batch(), I = a.features(), S = a.hidden(), GS = a.w_hh.size(0);
  if (parameter_gemms_by_aten(a.input)) {
    RnnGradients gemms;
    gemms.input = grads.input;
    gemms.w_ih = grads.w_ih;
    gemms.w_hh = grads.w_hh;
    rnn_parameter_gradients(a, output, dzx, dzh, gemms);
    return;
  }
  if (grads.input.defined() && I > 0) {
    // dx = dzx W_ih over all T*B rows
    const at::Tensor w_ih = rows_contiguous(a.w_ih);
    Destination d = destination(grads.input.view({T * B, I}));
    gemm_out(k, d.buffer, dzx.const_data_ptr(), GS, 1, w_ih.const_data_ptr(), w_ih.stride(0), GS);
    d.finish();
  }
  if (grads.w_ih.defined()) {
    // dW_ih = dzx^T x: A = dzx^T (strides 1, G S) over all T*B rows
    const at::Tensor x = a.input.contiguous();
    Destination d = destination(grads.w_ih);
    gemm_out(k, d.buffer, dzx.const_data_ptr(), 1, GS, x.const_data_ptr(), I, T * B);
    d.finish();
  }
  if (grads.w_hh.defined()) {
    // dW_hh = dzh_0^T h0 + dzh_{1:}^T output_{:-1}
    Destination d = destination(grads.w_hh);
    gemm_out(k, d.buffer, dzh.const_data_ptr(), 1, GS, h0.const_data_ptr(), S, B);
    if (T > 1) {
      gemm_out(k, d.buffer, step_ptr(dzh, 1), 1, GS, output.const_data_ptr(), S, (T - 1) * B,
               /*accumulate=*/true);
    }
    d.finish();
  }
}

template <typename Cell>
void rnn_backward(const RnnArgs& a, const RnnBackwardArgs& from, RnnGradients& grads) {
  constexpr int NS = Cell::kStates;
  const int64_t T = a.steps(), B = a.batch(), S = a.hidden(), GS = a.w_hh.size(0);
  if (T == 0 || B == 0) {
    gradients_of_no_step(from, grads);
    return;
  }
  const Kernels kernels = kernels_for<Cell>(a.input);
  const auto options = a.input.options();
  const auto acc = options.dtype(opmath(a.input));
  const at::Tensor w_hh = rows_contiguous(a.w_hh);
  const at::Tensor saved = from.saved.contiguous(), output = from.output.contiguous();
  const at::Tensor go = from.grad_output.defined() ? from.grad_output.contiguous() : at::Tensor();
  const at::Tensor len = a.lengths.defined() ? a.lengths.contiguous() : at::Tensor();
  const at::Tensor h0 = a.state[0].contiguous(), s0 = other_states(a.state);
  const at::Tensor states = NS > 1 ? recompute_states(kernels, saved, s0, len, NS) : at::Tensor();
  const char* states_base = NS > 1 ? static_cast<const char*>(states.const_data_ptr()) : nullptr;
  const int64_t state_bytes = B * S * a.input.element_size();  // one (B, S) step of `states`

  // Carried gradients in opmath, updated in place: dh (the part of d h_t
  // beside the next step's GEMM) and those of the other states.
  const auto carried = [&](const at::Tensor& g) {
    return g.defined() ? g.to(acc, false, true, at::MemoryFormat::Contiguous) : at::zeros({B, S}, acc);
  };
  at::Tensor dh = carried(from.grad_state[0]);
  at::Tensor ds;
  if (NS > 1) {
    ds = at::empty({NS - 1, B, S}, acc);
    for (int k = 1; k < NS; ++k) ds[k - 1].copy_(carried(from.grad_state[k]));
  }
  at::Tensor dzx = at::empty({T, B, GS}, options);
  at::Tensor dzh = Cell::kSplit ? at::empty({T, B, GS}, options) : dzx;
  // the bias gradients, summed in the time loop (without kSplit both are dzx's sums)
  const bool want_bx = grads.b_ih.defined() || (!Cell::kSplit && grads.b_hh.defined());
  const bool want_bh = Cell::kSplit && grads.b_hh.defined();
  const bool want_h0 = !grads.state.empty();
  at::Tensor grad_h0 = want_h0 ? at::empty({B, S}, acc) : at::Tensor();

  const int64_t blocks = kernels.blocks(S);
  at::Tensor packed = at::empty({kernels.backward_packed_size(S)}, acc);
  const int64_t workers = team_size(B * GS * S, blocks);
  // A batch row's gradients depend on no other row's for the whole loop.
  // Where W_hh's panels fit a core's L2 beside the rows, the workers split
  // the rows, not the units: they never meet, and no step's dzh goes from
  // one core to another. Split by units (every worker multiplies all rows
  // by its panels, then the team meets after every step), the loop of LSTM
  // 16x32x128 took 1,088 us on 2 threads against 982 on 1 (Intel Xeon,
  // docs/benchmarks-history.md section 24).
  const bool by_rows = workers > 1 && B >= 2 * workers && packed.nbytes() <= kRowSplitPackedBytes;
  const int64_t parts = by_rows ? workers : 1;  // bias sums: one row per participant, added after
  at::Tensor bias_x = want_bx ? at::zeros({parts, GS}, acc) : at::Tensor();
  at::Tensor bias_h = want_bh ? at::zeros({parts, GS}, acc) : at::Tensor();

  // One participant's time loop over batch rows [b0, b1) and unit blocks
  // [j0, j1), its bias sums in row `part`; `per_step`: the team meets after
  // every step (units split), else (rows split, or alone) never.
  const int64_t elem = a.input.element_size(), acc_elem = dh.element_size();
  const auto rows = [](const void* p, int64_t row0, int64_t row_elems, int64_t bytes) -> char* {
    return const_cast<char*>(static_cast<const char*>(p)) + row0 * row_elems * bytes;
  };
  const auto time_loop = [&](int64_t b0, int64_t b1, int64_t j0, int64_t j1, int64_t part,
                             TeamSync* per_step) {
    BackwardStep step{};
    step.packed = packed.const_data_ptr();
    step.dh_in = rows(dh.const_data_ptr(), b0, S, acc_elem);
    step.dh_out = rows(dh.data_ptr(), b0, S, acc_elem);
    step.ds = ds.defined() ? rows(ds.data_ptr(), b0, S, acc_elem) : nullptr;
    step.ds_stride = B * S;
    step.ld_h_old = S;
    step.s_new_stride = T * B * S;
    step.bias_grad_x = want_bx ? bias_x[part].data_ptr() : nullptr;
    step.bias_grad_h = want_bh ? bias_h[part].data_ptr() : nullptr;
    step.lengths = len.defined() ? len.const_data_ptr<int64_t>() + b0 : nullptr;
    step.batch = b1 - b0;
    step.state = S;
    for (int64_t t = T - 1; t >= 0; --t) {
      step.dzh_next = t + 1 < T ? rows(step_ptr(dzh, t + 1), b0, GS, elem) : nullptr;
      step.grad_out = go.defined() ? rows(step_ptr(go, t), b0, S, elem) : nullptr;
      step.saved = rows(step_ptr(saved, t), b0, Cell::kSaved * S, elem);
      step.h_new = rows(step_ptr(output, t), b0, S, elem);
      step.h_old = rows(t > 0 ? step_ptr(output, t - 1) : h0.const_data_ptr(), b0, S, elem);
      if (NS > 1) {
        // state k after step t at states[k - 1][t]; before step 0 the initial ones
        step.s_new = rows(states_base + t * state_bytes, b0, S, elem);
        step.s_old = rows(t > 0 ? states_base + (t - 1) * state_bytes : s0.const_data_ptr(), b0, S, elem);
        step.ld_s_old = S;
        step.s_old_stride = t > 0 ? T * B * S : B * S;
      }
      step.dzx = rows(step_ptr(dzx, t), b0, GS, elem);
      step.dzh = Cell::kSplit ? rows(step_ptr(dzh, t), b0, GS, elem) : nullptr;
      step.step = t;
      kernels.backward(step, j0, j1);
      // dzh_t complete before any worker multiplies it by W_hh
      if (per_step != nullptr && (t > 0 || want_h0)) per_step->wait();
    }
    if (want_h0) {
      // d h0 = dzh_0 W_hh + the cell's direct term (the carried gradient on rows of length 0)
      step.dzh_next = rows(step_ptr(dzh, 0), b0, GS, elem);
      step.dh_h0 = rows(grad_h0.data_ptr(), b0, S, acc_elem);
      step.step = -1;
      kernels.backward(step, j0, j1);
    }
  };
  const auto pack = [&](int64_t j0, int64_t j1) {
    kernels.pack_backward(w_hh.const_data_ptr(), w_hh.stride(0), S, packed.data_ptr(), j0, j1);
  };
  if (by_rows) {
    // W_hh packed whole, in the panels of the loop over all blocks (64K
    // floats at S = 128: a few microseconds); then each participant runs
    // workers [w0, w1)'s share of the rows, meeting nobody.
    pack(0, blocks);
    run_team(workers, workers, [&](int64_t w0, int64_t w1, TeamSync&) {
      time_loop(share(B, workers, w0).first, share(B, workers, w1 - 1).second, 0, blocks, w0, nullptr);
    });
    if (want_bx) bias_x = bias_x.sum(0);
    if (want_bh) bias_h = bias_h.sum(0);
  } else {
    run_team(blocks, workers, [&](int64_t j0, int64_t j1, TeamSync& sync) {
      pack(j0, j1);
      time_loop(0, B, j0, j1, 0, &sync);
    });
    if (want_bx) bias_x = bias_x[0];
    if (want_bh) bias_h = bias_h[0];
  }

  if (want_h0) {
    grads.state[0].copy_(grad_h0);
    for (int k = 1; k < NS; ++k) grads.state[k].copy_(ds[k - 1]);
  }
  if (grads.b_ih.defined()) grads.b_ih.copy_(bias_x);
  if (grads.b_hh.defined()) grads.b_hh.copy_(Cell::kSplit ? bias_h : bias_x);
  parameter_gradients(kernels, a, output, h0, dzx, dzh, grads);
}

// ------------------------------------------------------------ the operators

// The fused CPU backend as rnn_ops.h takes it.
struct FusedCpu : NoGuard {
  static constexpr const char* kName = "fused";
  template <typename Cell>
  static void forward(const RnnArgs& a, at::Tensor& output, std::vector<at::Tensor>& state_n,
                      at::Tensor& saved) {
    rnn_forward<Cell>(a, output, state_n, saved);
  }
  template <typename Cell>
  static void backward(const RnnArgs& a, const RnnBackwardArgs& from, RnnGradients& grads) {
    rnn_backward<Cell>(a, from, grads);
  }
};

}  // namespace cpu
}  // namespace lltm
