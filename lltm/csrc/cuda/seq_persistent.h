// The persistent recurrent kernels of the fused CUDA sequence operators:
// the whole time loop of one direction in one launch, over thread-block
// clusters (sm_90+) or over a cooperative grid (sm_80+), for every cell of
// cells/registry.h. Each entry point asks the planner (seq_plan.h) for the
// time loop of its problem and either launches the chosen persistent kernel
// and returns true, or launches nothing and returns false when the plan is
// the step loop over cuBLAS (rnn_cuda.cu), which gives the same results.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "../cells/registry.h"
#include "launch_utils.h"
#include "seq_plan.h"

namespace lltm {
namespace cuda_detail {

// Forward over all T steps of a cell with G gates, NS states, NV saved
// values. zx (T, B, G S) contiguous holds x W_ih^T (no bias); saved
// (T, B, NV S) contiguous is written (it may be zx itself when NV == G);
// output (T, B, S) and state_n (NS x (B, S)) are contiguous and fully
// written. b_ih, b_hh (G S,) contiguous and lengths (B,) int64 contiguous
// may be undefined; state0 holds the NS initial states.
template <typename Cell>
bool rnn_forward_persistent(const at::Tensor& zx, const at::Tensor& saved, const RowMajor& w_hh,
                            const at::Tensor& b_ih, const at::Tensor& b_hh,
                            const std::vector<RowMajor>& state0, const at::Tensor& lengths,
                            const at::Tensor& output, const std::vector<at::Tensor>& state_n);

// Reverse-time loop of the backward: writes dzx (T, B, G S) contiguous (and
// dzh, likewise, for cells with kSplit; else undefined) and, where defined,
// the entries of grad_state0 (NS x (B, S) contiguous). grad_output
// (T, B, S) and the entries of grad_state_n (B, S) are contiguous or
// undefined (zero); saved and output are the forward's, contiguous; states
// (NS - 1, T, B, S) contiguous holds the other states after every step
// (undefined for NS = 1). bias_rows, where defined ((1 or 2, B, G S)
// contiguous, float; double for double), gets each batch row's sums over
// the steps of dzx ([0]) and of dzh ([1], kSplit): the bias gradients
// before their sum over the rows.
template <typename Cell>
bool rnn_backward_persistent(const at::Tensor& grad_output, const std::vector<at::Tensor>& grad_state_n,
                             const RowMajor& w_hh, const at::Tensor& saved, const at::Tensor& output,
                             const at::Tensor& states, const std::vector<RowMajor>& state0,
                             const at::Tensor& lengths, const at::Tensor& dzx, const at::Tensor& dzh,
                             const std::vector<at::Tensor>& grad_state0, const at::Tensor& bias_rows);

// The planner's report for one direction (lltm::_fused_cuda_seq_plan).
template <typename Cell, bool kBackward>
std::string rnn_plan(int64_t steps, int64_t batch, int64_t state, c10::ScalarType dtype, int device);

// The cost model's problem and decision for one direction in this pass's
// precision: the measuring planner's candidates (seq_tune.h).
struct ModelDecision {
  Problem problem;
  Decision decision;
};
template <typename Cell, bool kBackward>
ModelDecision rnn_decision(int64_t steps, int64_t batch, int64_t state, c10::ScalarType dtype, int device);

// lltm::_fused_cuda_seq_plan for a cell outside cells::BuiltIn (a cell of
// lltm.cells.define): its library registers its planner's report when it
// loads (LLTM_REGISTER_CELL_PLAN below).
using CellPlan = std::string (*)(bool backward, int64_t steps, int64_t batch, int64_t state,
                                 c10::ScalarType dtype, int device);
void register_cell_plan(const std::string& cell, CellPlan plan);

template <typename Cell>
std::string cell_plan(bool backward, int64_t steps, int64_t batch, int64_t state, c10::ScalarType dtype,
                      int device) {
  return backward ? rnn_plan<Cell, true>(steps, batch, state, dtype, device)
                  : rnn_plan<Cell, false>(steps, batch, state, dtype, device);
}

// Registers Cell's planner at load time, in the file that registers its operators.
#define LLTM_REGISTER_CELL_PLAN(Cell)                                                            \
  static const bool lltm_cell_plan_registered_ = [] {                                            \
    ::lltm::cuda_detail::register_cell_plan(Cell::kName, &::lltm::cuda_detail::cell_plan<Cell>); \
    return true;                                                                                 \
  }()

}  // namespace cuda_detail
}  // namespace lltm
