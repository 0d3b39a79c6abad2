// The persistent recurrent kernels of the fused CUDA sequence operators:
// the whole time loop of one direction in one launch, over thread-block
// clusters (sm_90+) or over a cooperative grid (sm_80+). Each entry point
// asks the planner (seq_plan.h) for the time loop of its problem and either
// launches the chosen persistent kernel and returns true, or launches
// nothing and returns false when the plan is the step loop over cuBLAS
// (seq_forward.cu / seq_backward.cu), which gives the same results.
#pragma once

#include <ATen/core/Tensor.h>

#include "launch_utils.h"

namespace lltm {
namespace cuda_detail {

// Forward over all T steps. gates (T, B, 3S), contiguous, holds x W_x^T on
// entry and the activated gates on exit; output (T, B, S) and h_n, c_n
// (B, S) are contiguous and fully written. w: the weights (3S, S + I),
// whose first S columns are W_h. bias (3S,) contiguous and lengths (B,)
// int64 contiguous may be undefined.
bool seq_forward_persistent(const at::Tensor& gates, const RowMajor& w, const at::Tensor& bias,
                            const RowMajor& h0, const RowMajor& c0, const at::Tensor& lengths,
                            const at::Tensor& output, const at::Tensor& h_n, const at::Tensor& c_n);

// Reverse-time loop of the backward: writes d_pre (T, B, 3S) contiguous (the
// gradient of the gate pre-activations of every step) and, where defined,
// grad_h0 and grad_c0 (B, S) contiguous. grad_output (T, B, S), grad_h_n and
// grad_c_n (B, S) are contiguous or undefined (zero); cells (T, B, S), the
// recomputed c_t, and gates (T, B, 3S), the forward's, are contiguous.
bool seq_backward_persistent(const at::Tensor& grad_output, const at::Tensor& grad_h_n,
                             const at::Tensor& grad_c_n, const RowMajor& w, const at::Tensor& cells,
                             const at::Tensor& gates, const at::Tensor& lengths, const at::Tensor& d_pre,
                             const at::Tensor& grad_h0, const at::Tensor& grad_c0);

}  // namespace cuda_detail
}  // namespace lltm
