// "fused" backend on the CPU, LLTM's cell operators: one step of the
// sequence operators' kernels (rnn_cpu.cpp, kernels.h) for the LLTM cell of
// the seam (cells/lltm.h), over views of its weights as W_hh = W[:, :S] and
// W_ih = W[:, S:]. Forward is the fused GEMM +
// cell kernel on [old_h | input] and W packed for it, each thread packing
// its own unit blocks (5 us at 16 x 32 x 128 on the AMD EPYC of
// docs/benchmarks.md). The packed W is not kept between calls: a cache
// keyed on W's version counter misses changes made through `.data`, which
// torch.autograd.gradcheck itself makes. Backward is the cell's backward
// math (with the bias gradient summed on the way), then the GEMMs of the
// gradients asked for.
//
// Same results and conventions as the aten backend (aten/cell_aten.cpp):
// output_mask, fresh (0,) placeholders for gradients not asked for, fresh
// contiguous outputs with the fake kernels' shapes. dtypes: float32,
// float64, bfloat16 and float16 (fp32 math inside, one rounding per stored
// value).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../cells/lltm.h"
#include "../lltm.h"
#include "common.h"
#include "kernels.h"
#include "register.h"

namespace lltm {
namespace {

CellForwardResult fused_cell_forward_cpu(const at::Tensor& input,                // (B, I)
                                         const at::Tensor& weights,              // (3S, S + I)
                                         const std::optional<at::Tensor>& bias,  // (3S,)
                                         const at::Tensor& old_h,                // (B, S)
                                         const at::Tensor& old_cell) {           // (B, S)
  check_cell_forward_args("lltm::fused_cell_forward", input, weights, bias, old_h, old_cell);
  const cpu::Kernels kernels = cpu::kernels_for<cells::LLTM>(input);
  const int64_t batch = input.size(0), features = input.size(1), state = weights.size(0) / 3;
  const auto options = input.options();
  at::Tensor new_h = at::empty({batch, state}, options);
  at::Tensor new_cell = at::empty({batch, state}, options);
  at::Tensor gates = at::empty({batch, 3 * state}, options);
  if (batch == 0) return {new_h, new_cell, gates};
  const at::Tensor x = cpu::rows_contiguous(input), h = cpu::rows_contiguous(old_h),
                   c = old_cell.contiguous();
  const at::Tensor w = cpu::rows_contiguous(weights);
  const at::Tensor b = cpu::has(bias) ? bias->to(cpu::opmath(input)).contiguous() : at::Tensor();
  const int64_t blocks = kernels.blocks(state);
  at::Tensor packed =
      at::empty({kernels.forward_packed_size(state, features)}, options.dtype(cpu::opmath(input)));
  // one step of the sequence kernel: [W_hh | W_ih] = [W[:, :S] | W[:, S:]], c the one other state
  cpu::ForwardStep step{};
  step.h_prev = h.const_data_ptr();
  step.ld_h = h.stride(0);
  step.x = x.const_data_ptr();
  step.ld_x = x.stride(0);
  step.packed = packed.const_data_ptr();
  step.bias_x = cpu::ptr_or_null(b);
  step.s_prev = c.const_data_ptr();
  step.ld_s = state;
  step.s_stride = batch * state;
  step.s_next = new_cell.data_ptr();
  step.h_new = new_h.data_ptr();
  step.saved = gates.data_ptr();
  step.batch = batch;
  step.state = state;
  step.features = features;
  const char* w_ih = static_cast<const char*>(w.const_data_ptr()) + state * w.element_size();
  const int64_t workers = cpu::team_size(batch * 3 * state * (state + features), blocks);
  cpu::run_team(blocks, workers, [&](int64_t j0, int64_t j1, cpu::TeamSync&) {
    kernels.pack_forward(w.const_data_ptr(), w.stride(0), w_ih, w.stride(0), state, features,
                         packed.data_ptr(), j0, j1);
    kernels.forward(step, j0, j1);
  });
  return {new_h, new_cell, gates};
}

// The cell's backward reads c_t and nothing of the previous states (the
// operator has no old_cell argument) nor h_t.
static_assert(cells::LLTM::kOldRead == 0 && cells::LLTM::kNewRead == 0b10);

CellBackwardResult fused_cell_backward_cpu(const at::Tensor& grad_h,     // (B, S)
                                           const at::Tensor& grad_cell,  // (B, S)
                                           const at::Tensor& new_cell,   // (B, S)
                                           const at::Tensor& gates,      // (B, 3S)
                                           const at::Tensor& input,      // (B, I)
                                           const at::Tensor& weights,    // (3S, S + I)
                                           const at::Tensor& old_h,      // (B, S)
                                           OutputMask output_mask) {
  check_cell_backward_args("lltm::fused_cell_backward", grad_h, grad_cell, new_cell, gates, input, weights,
                           old_h);
  const AskedGradients asked(output_mask, input.options());
  if (!asked.any()) return asked.placeholders();
  const auto options = input.options();
  const cpu::Kernels kernels = cpu::kernels_for<cells::LLTM>(input);
  const int64_t batch = input.size(0), features = input.size(1), state = weights.size(0) / 3;
  const auto dtype = input.scalar_type();
  const auto acc = options.dtype(cpu::opmath(input));
  // the carried gradients are opmath in the kernels: grad_h read only, grad_cell's copy
  // updated in place into the gradient of old_cell
  const at::Tensor gh = grad_h.to(acc).contiguous(), cn = new_cell.contiguous(), g = gates.contiguous(),
                   w = cpu::rows_contiguous(weights);
  at::Tensor dc = grad_cell.to(acc, false, true, at::MemoryFormat::Contiguous);
  at::Tensor dz = at::empty({batch, 3 * state}, options);  // d loss / d pre-activations
  at::Tensor dh_direct = at::empty({batch, state}, acc);   // the cell's own d old_h term
  at::Tensor grad_bias = asked.bias ? at::zeros({3 * state}, acc) : at::Tensor();
  cpu::BackwardStep step{};
  step.dh_in = gh.const_data_ptr();
  step.dh_out = dh_direct.data_ptr();
  step.ds = dc.data_ptr();
  step.ds_stride = batch * state;
  step.saved = g.const_data_ptr();
  step.s_new = cn.const_data_ptr();
  step.s_new_stride = batch * state;
  step.dzx = dz.data_ptr();
  step.bias_grad_x = asked.bias ? grad_bias.data_ptr() : nullptr;
  step.batch = batch;
  step.state = state;
  const int64_t blocks = kernels.blocks(state);
  // ~30 multiply-adds' worth of math per element
  cpu::run_team(blocks, cpu::team_size(batch * state * 32, blocks),
                [&](int64_t j0, int64_t j1, cpu::TeamSync&) { kernels.backward(step, j0, j1); });

  // [grad_old_h | grad_input] = dz W (+ the cell's direct term), one GEMM per
  // column block of W asked for (opmath: through a buffer).
  const auto dz_times_w = [&](int64_t col, int64_t cols, at::Tensor out, bool accumulate) {
    cpu::gemm_out(kernels, out, dz.const_data_ptr(), 3 * state, 1,
                  static_cast<const char*>(w.const_data_ptr()) + col * w.element_size(), w.stride(0),
                  3 * state, accumulate);
    return out.to(dtype);
  };
  const at::Tensor grad_input = asked.input
                                    ? dz_times_w(state, features, at::empty({batch, features}, acc), false)
                                    : asked.placeholder();
  const at::Tensor grad_old_h = asked.h ? dz_times_w(0, state, dh_direct, true) : asked.placeholder();
  at::Tensor grad_weights = asked.placeholder();
  if (asked.weights) {
    // dW = dz^T [old_h | input]: A = dz^T (strides 1, 3S)
    grad_weights = at::empty({3 * state, state + features}, acc);
    const at::Tensor h = cpu::rows_contiguous(old_h), x = cpu::rows_contiguous(input);
    cpu::gemm_out(kernels, grad_weights.narrow(1, 0, state), dz.const_data_ptr(), 1, 3 * state,
                  h.const_data_ptr(), h.stride(0), batch);
    cpu::gemm_out(kernels, grad_weights.narrow(1, state, features), dz.const_data_ptr(), 1, 3 * state,
                  x.const_data_ptr(), x.stride(0), batch);
    grad_weights = grad_weights.to(dtype);
  }
  return {grad_input, grad_weights, asked.bias ? grad_bias.to(dtype) : asked.placeholder(), grad_old_h,
          asked.c ? dc.to(dtype) : asked.placeholder()};
}

void register_cell(torch::Library& m) {
  m.impl("fused_cell_forward", &fused_cell_forward_cpu);
  m.impl("fused_cell_backward", &fused_cell_backward_cpu);
}

}  // namespace
}  // namespace lltm

LLTM_REGISTER_CPU_KERNELS(lltm::register_cell)
