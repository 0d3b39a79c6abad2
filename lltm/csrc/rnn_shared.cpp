// Host code every backend of the seam's cells shares: gathering an
// operator's arguments, allocating its outputs, and the parameter and input
// gradients over all T*B rows once a reverse-time loop has produced the
// gradients of every step's zx and zh (ATen GEMMs and reductions).
#include <ATen/ATen.h>

#include "rnn.h"

namespace lltm {

namespace {

at::Tensor defined_or_empty(const OptTensor& t) { return t.has_value() ? *t : at::Tensor(); }

}  // namespace

RnnArgs rnn_args(const at::Tensor& input, const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                 const OptTensor& bias_ih, const OptTensor& bias_hh, at::TensorList state,
                 const OptTensor& lengths) {
  RnnArgs a;
  a.input = input;
  a.w_ih = weight_ih;
  a.w_hh = weight_hh;
  a.b_ih = defined_or_empty(bias_ih);
  a.b_hh = defined_or_empty(bias_hh);
  a.state = state.vec();
  a.lengths = defined_or_empty(lengths);
  return a;
}

RnnBackwardArgs rnn_backward_args(const OptTensor& grad_output, const OptTensorList& grad_state_n,
                                  const at::Tensor& output, const at::Tensor& saved) {
  RnnBackwardArgs b;
  b.grad_output = defined_or_empty(grad_output);
  for (size_t s = 0; s < grad_state_n.size(); ++s)
    b.grad_state.push_back(defined_or_empty(grad_state_n.get(s)));
  b.output = output;
  b.saved = saved;
  return b;
}

RnnForwardResult allocate_forward(const CellShape& cell, const RnnArgs& args) {
  const auto options = args.input.options();
  const int64_t T = args.steps(), B = args.batch(), S = args.hidden();
  std::vector<at::Tensor> state_n;
  for (int s = 0; s < cell.states; ++s) state_n.push_back(at::empty({B, S}, options));
  return {at::empty({T, B, S}, options), std::move(state_n), at::empty({T, B, cell.saved * S}, options)};
}

RnnGradients allocate_gradients(const RnnArgs& args, const RnnOutputMask& mask) {
  const auto options = args.input.options();
  RnnGradients g;
  if (mask[0]) g.input = at::empty(args.input.sizes(), options);
  if (mask[1]) g.w_ih = at::empty(args.w_ih.sizes(), options);
  if (mask[2]) g.w_hh = at::empty(args.w_hh.sizes(), options);
  // (G S,): a backward cannot tell whether its forward had biases; autograd asks only for those it had
  if (mask[3]) g.b_ih = at::empty({args.w_hh.size(0)}, options);
  if (mask[4]) g.b_hh = at::empty({args.w_hh.size(0)}, options);
  if (mask[5]) {
    for (const at::Tensor& s : args.state) g.state.push_back(at::empty(s.sizes(), options));
  }
  return g;
}

RnnBackwardResult gradients_result(const RnnArgs& args, RnnGradients&& grads) {
  // An output not asked for: a fresh empty (0,) tensor (outputs of an
  // operator must not alias each other).
  auto out = [&](at::Tensor& t) { return t.defined() ? std::move(t) : at::empty({0}, args.input.options()); };
  return {out(grads.input), out(grads.w_ih), out(grads.w_hh),
          out(grads.b_ih),  out(grads.b_hh), std::move(grads.state)};
}

void rnn_parameter_gradients(const RnnArgs& args, const at::Tensor& output, const at::Tensor& dzx,
                             const at::Tensor& dzh, RnnGradients& grads) {
  const int64_t T = args.steps(), B = args.batch(), I = args.features(), S = args.hidden();
  const int64_t GS = args.w_hh.size(0);
  const at::Tensor dx_all = dzx.reshape({T * B, GS});
  if (grads.input.defined()) {
    if (T * B == 0 || I == 0) {
      grads.input.zero_();
    } else {
      at::Tensor gi = grads.input.view({T * B, I});
      at::mm_out(gi, dx_all, args.w_ih);  // d x = dzx W_ih
    }
  }
  if (grads.w_ih.defined()) {
    at::mm_out(grads.w_ih, dx_all.t(), args.input.reshape({T * B, I}));  // dW_ih = sum_t dzx_t^T x_t
  }
  if (grads.w_hh.defined()) {
    // dW_hh = sum_t dzh_t^T h_{t-1}: h0 at t = 0, else the output of step
    // t - 1 (the carried h on every row still inside its length, the only
    // rows with dzh != 0).
    if (T == 0) {
      grads.w_hh.zero_();
    } else {
      at::mm_out(grads.w_hh, dzh[0].t(), args.state[0]);
      if (T > 1) {
        grads.w_hh.addmm_(dzh.narrow(0, 1, T - 1).reshape({(T - 1) * B, GS}).t(),
                          output.narrow(0, 0, T - 1).reshape({(T - 1) * B, S}));
      }
    }
  }
  if (grads.b_ih.defined()) at::sum_out(grads.b_ih, dx_all, {0});
  if (grads.b_hh.defined()) at::sum_out(grads.b_hh, dzh.reshape({T * B, GS}), {0});
}

}  // namespace lltm
