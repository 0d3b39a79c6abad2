// "aten" backend for the seam's cells (cells/registry.h; LLTM keeps its own
// hand-written ATen code in seq_aten.cpp): one layer over T steps with the
// time loop in C++, every operation an ATen op, so it runs on any device.
// The cell's math is its traits' code on whole (B, S) tensors
// (tensor_math.h).
//
// Forward: zx for all T steps is one GEMM over T*B rows; per step one GEMM
// gives zh, the cell's forward runs on its G slices, and rows past their
// length keep their states (torch.where) with zero output and saved values.
// Backward: the non-h states are rebuilt from the saved values (the cell's
// recompute, forward in time), then the reverse-time loop runs the cell's
// backward per step with one GEMM d h_{t-1} += dzh_t W_hh; the weight,
// bias and input gradients are one GEMM or reduction each over all T*B rows
// (rnn_parameter_gradients).
//
// The templates, for any cell (cells/cell.h): rnn_aten.cpp instantiates them
// for the built-in cells, a cell defined with lltm.cells.define for its own.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <string>
#include <vector>

#include "../precision.h"
#include "../rnn.h"
#include "../rnn_ops.h"
#include "tensor_math.h"

namespace lltm {
namespace aten_rnn {

using aten_detail::TensorMath;
using aten_detail::Value;

// (B, 1) bool: step t is inside row b's length; undefined without lengths.
inline at::Tensor active_rows(const at::Tensor& lengths, int64_t t) {
  return lengths.defined() ? at::gt(lengths, t).unsqueeze(1) : at::Tensor();
}

inline at::Tensor keep_where(const at::Tensor& active, const at::Tensor& value, const at::Tensor& otherwise) {
  return active.defined() ? at::where(active, value, otherwise) : value;
}

// The G (or NV) (B, S) slices of a (B, n S) tensor.
template <int N>
std::array<Value, N> slices(const at::Tensor& t, int64_t S) {
  std::array<Value, N> out;
  for (int g = 0; g < N; ++g) out[g] = Value(t.narrow(1, g * S, S));
  return out;
}

// The cells' operations take C arrays.
template <int N>
using Values = Value[N];

template <typename Cell>
void forward(const RnnArgs& a, at::Tensor& output, std::vector<at::Tensor>& state_n, at::Tensor& saved) {
  constexpr int G = Cell::kGates, NS = Cell::kStates, NV = Cell::kSaved;
  const int64_t T = a.steps(), B = a.batch(), I = a.features(), S = a.hidden();
  std::vector<at::Tensor> s(a.state.begin(), a.state.end());
  if (T > 0) {
    // zx for every step: (T*B, G S) = x W_ih^T + b_ih
    const at::Tensor x_all = a.input.reshape({T * B, I});
    const at::Tensor zx_all =
        a.b_ih.defined() ? addmm_rows(a.b_ih, x_all, a.w_ih.t()) : at::mm(x_all, a.w_ih.t());
    const at::Tensor w_hh_t = a.w_hh.t().contiguous();
    for (int64_t t = 0; t < T; ++t) {
      const at::Tensor zh = a.b_hh.defined() ? addmm_rows(a.b_hh, s[0], w_hh_t) : at::mm(s[0], w_hh_t);
      const auto zx_v = slices<G>(zx_all.narrow(0, t * B, B), S);
      const auto zh_v = slices<G>(zh, S);
      Values<G> zx, zhv;
      Values<NS> old, next;
      Values<NV> sv;
      for (int g = 0; g < G; ++g) zx[g] = zx_v[g], zhv[g] = zh_v[g];
      for (int k = 0; k < NS; ++k) old[k] = Value(s[k]);
      Cell::template forward<TensorMath>(zx, zhv, old, next, sv);
      const at::Tensor active = active_rows(a.lengths, t);
      for (int k = 0; k < NV; ++k) {
        saved[t].narrow(1, k * S, S).copy_(keep_where(active, sv[k].t, at::zeros_like(sv[k].t)));
      }
      output[t].copy_(keep_where(active, next[0].t, at::zeros_like(next[0].t)));
      for (int k = 0; k < NS; ++k) s[k] = keep_where(active, next[k].t, s[k]);
    }
  }
  for (int k = 0; k < NS; ++k) state_n[k].copy_(s[k]);
}

// The non-h states of every step, rebuilt from the initial ones and the
// saved values: states[k][t] is state k after step t (k >= 1).
template <typename Cell>
std::vector<at::Tensor> recompute(const RnnArgs& a, const at::Tensor& saved) {
  constexpr int NS = Cell::kStates, NV = Cell::kSaved;
  const int64_t T = a.steps(), S = a.hidden();
  std::vector<at::Tensor> states(NS);
  if constexpr (NS > 1) {
    for (int k = 1; k < NS; ++k) states[k] = at::empty({T, a.batch(), S}, a.input.options());
    std::vector<at::Tensor> s(a.state.begin(), a.state.end());
    for (int64_t t = 0; t < T; ++t) {
      const auto sv_v = slices<NV>(saved[t], S);
      Values<NV> sv;
      Values<NS> old, next;
      for (int k = 0; k < NV; ++k) sv[k] = sv_v[k];
      for (int k = 0; k < NS; ++k) old[k] = Value(s[k]);
      Cell::template recompute<TensorMath>(old, sv, next);
      const at::Tensor active = active_rows(a.lengths, t);
      for (int k = 1; k < NS; ++k) {
        s[k] = keep_where(active, next[k].t, s[k]);
        states[k][t].copy_(s[k]);
      }
    }
  }
  return states;
}

template <typename Cell>
void backward(const RnnArgs& a, const RnnBackwardArgs& from, RnnGradients& grads) {
  constexpr int G = Cell::kGates, NS = Cell::kStates, NV = Cell::kSaved;
  const int64_t T = a.steps(), B = a.batch(), S = a.hidden();
  const auto options = a.input.options();
  // The carried gradients of the states (h's without the output's term).
  std::vector<at::Tensor> d(NS);
  for (int k = 0; k < NS; ++k) {
    const at::Tensor& g = from.grad_state[k];
    d[k] = g.defined() ? g.clone() : at::zeros({B, S}, options);
  }
  at::Tensor dzx_all = at::zeros({T, B, G * S}, options);
  at::Tensor dzh_all = Cell::kSplit ? at::zeros({T, B, G * S}, options) : dzx_all;
  const std::vector<at::Tensor> states = recompute<Cell>(a, from.saved);
  for (int64_t t = T - 1; t >= 0; --t) {
    const at::Tensor active = active_rows(a.lengths, t);
    Values<NS> dnext, old, next;
    dnext[0] = Value(from.grad_output.defined() ? d[0] + from.grad_output[t] : d[0]);
    for (int k = 1; k < NS; ++k) dnext[k] = Value(d[k]);
    // h_{t-1}: h0 or the previous output (the carried h on every row inside its length)
    old[0] = Value(t == 0 ? a.state[0] : from.output[t - 1]);
    next[0] = Value(from.output[t]);
    for (int k = 1; k < NS; ++k) {
      old[k] = Value(t == 0 ? a.state[k] : states[k][t - 1]);
      next[k] = Value(states[k][t]);
    }
    const auto sv_v = slices<NV>(from.saved[t], S);
    Values<NV> sv;
    for (int k = 0; k < NV; ++k) sv[k] = sv_v[k];
    Values<G> dzx, dzh;
    Values<NS> ds;
    Cell::template backward<TensorMath>(dnext, old, next, sv, dzx, dzh, ds);
    for (int g = 0; g < G; ++g) {
      dzx_all[t].narrow(1, g * S, S).copy_(keep_where(active, dzx[g].t, at::zeros_like(dzx[g].t)));
      if constexpr (Cell::kSplit) {
        dzh_all[t].narrow(1, g * S, S).copy_(keep_where(active, dzh[g].t, at::zeros_like(dzh[g].t)));
      }
    }
    // rows past their length pass every carried gradient on unchanged
    for (int k = 1; k < NS; ++k) d[k] = keep_where(active, ds[k].t, d[k]);
    if (t > 0 || !grads.state.empty()) {
      const at::Tensor dh = ds[0].is_constant() ? at::zeros({B, S}, options) : ds[0].t;
      d[0] = keep_where(active, at::addmm(dh, dzh_all[t], a.w_hh), d[0]);  // + dzh_t W_hh
    }
  }
  for (size_t k = 0; k < grads.state.size(); ++k) grads.state[k].copy_(d[k]);
  rnn_parameter_gradients(a, from.output, dzx_all, dzh_all, grads);
}

// The ATen backend as rnn_ops.h takes it.
struct Aten : NoGuard {
  static constexpr const char* kName = "aten";
  template <typename Cell>
  static void forward(const RnnArgs& a, at::Tensor& output, std::vector<at::Tensor>& state_n,
                      at::Tensor& saved) {
    const Fp32PassGuard precision(false);  // the pass's products as lltm's mode wants (precision.h)
    aten_rnn::forward<Cell>(a, output, state_n, saved);
  }
  template <typename Cell>
  static void backward(const RnnArgs& a, const RnnBackwardArgs& from, RnnGradients& grads) {
    const Fp32PassGuard precision(true);
    aten_rnn::backward<Cell>(a, from, grads);
  }
};

}  // namespace aten_rnn
}  // namespace lltm
