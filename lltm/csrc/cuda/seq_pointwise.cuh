// Pointwise kernels of one time step of the sequence operators on CUDA (the
// step loop over cuBLAS GEMMs in seq_forward.cu / seq_backward.cu). They
// reuse the cell's math (cell_math.cuh) and add the variable-length rule:
// a row whose step t is past its length gets zero gates, keeps its c and h,
// writes output 0, and in backward passes dh and dc through unchanged.
#pragma once

#include "cell_math.cuh"
#include "launch_utils.h"

namespace lltm {
namespace cuda_detail {

constexpr int kSeqPointwiseThreads = 256;

// Blocks of a grid-stride launch over `elements` (B * S) on `device`: one
// element per thread, at most 8 blocks per multiprocessor.
inline unsigned int pointwise_blocks(int64_t elements, c10::DeviceIndex device) {
  const int64_t wanted = ceil_div(elements, kSeqPointwiseThreads);
  return grid_size(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t(sm_count(device)) * 8)));
}

__device__ __forceinline__ bool row_active(const int64_t* lengths, int64_t b, int64_t t) {
  return lengths == nullptr || t < lengths[b];
}

// Step t of the forward. gates_t holds x_t W_x^T + h_{t-1} W_h^T (no bias)
// on entry and the activated gates on exit.
template <typename scalar_t>
__global__ void __launch_bounds__(kSeqPointwiseThreads)
    seq_forward_step_kernel(scalar_t* __restrict__ gates_t,       // (B, 3S) contiguous, in/out
                            const scalar_t* __restrict__ bias,    // (3S,) contiguous, or null
                            const scalar_t* __restrict__ c_prev,  // (B, S) at b * c_ld + j
                            int64_t c_ld,
                            const scalar_t* __restrict__ h_prev,  // (B, S) at b * h_ld + j; read
                            int64_t h_ld,                         //   only with lengths
                            const int64_t* __restrict__ lengths,  // (B,), or null: all active
                            int64_t t,
                            scalar_t* __restrict__ output_t,  // (B, S) contiguous: h_t or 0
                            scalar_t* __restrict__ cells_t,   // (B, S) contiguous: c_t out
                            scalar_t* __restrict__ h_next,    // (B, S) contiguous carried h,
                                                              //   or null (then h_t = output_t)
                            int64_t batch, int64_t state) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t n = batch * state;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t b = e / state;
    const int64_t j = e - b * state;
    scalar_t* g = gates_t + b * 3 * state + j;
    const acc_t c = static_cast<acc_t>(c_prev[b * c_ld + j]);
    if (!row_active(lengths, b, t)) {
      g[0] = g[state] = g[2 * state] = scalar_t(0);
      cells_t[e] = static_cast<scalar_t>(c);
      output_t[e] = scalar_t(0);
      if (h_next != nullptr) h_next[e] = h_prev[b * h_ld + j];
      continue;
    }
    acc_t z_i = static_cast<acc_t>(g[0]);
    acc_t z_o = static_cast<acc_t>(g[state]);
    acc_t z_c = static_cast<acc_t>(g[2 * state]);
    if (bias != nullptr) {
      z_i += static_cast<acc_t>(bias[j]);
      z_o += static_cast<acc_t>(bias[state + j]);
      z_c += static_cast<acc_t>(bias[2 * state + j]);
    }
    const CellForward<acc_t> cell(z_i, z_o, z_c, c);
    g[0] = static_cast<scalar_t>(cell.input_gate);
    g[state] = static_cast<scalar_t>(cell.output_gate);
    g[2 * state] = static_cast<scalar_t>(cell.candidate);
    const scalar_t h = static_cast<scalar_t>(cell.new_h);
    cells_t[e] = static_cast<scalar_t>(cell.new_cell);
    output_t[e] = h;
    if (h_next != nullptr) h_next[e] = h;
  }
}

// Step t of the backward, before the GEMM d h_{t-1} = d_pre_t W_h:
//   gh = dh + grad_output_t          (total gradient of h_t)
//   d_pre_t, and dc <- d c_{t-1}     (in place: d c_t / d c_{t-1} = 1)
// Rows past their length get d_pre = 0, keep dc, and (with lengths) write
// gh into dh_carry, which the GEMM then accumulates into.
template <typename scalar_t>
__global__ void __launch_bounds__(kSeqPointwiseThreads)
    seq_backward_step_kernel(const scalar_t* __restrict__ dh,             // (B, S) contiguous
                             const scalar_t* __restrict__ grad_out_t,     // (B, S) contiguous, or null
                             at::opmath_type<scalar_t>* __restrict__ dc,  // (B, S) contiguous, in/out
                                                                          //   (float for half and bfloat16:
                                                                          //   carried over all T steps)
                             const scalar_t* __restrict__ cells_t,        // (B, S) contiguous
                             const scalar_t* __restrict__ gates_t,        // (B, 3S) contiguous, activated
                             const int64_t* __restrict__ lengths,         // (B,), or null
                             int64_t t,
                             scalar_t* __restrict__ d_pre_t,   // (B, 3S) contiguous
                             scalar_t* __restrict__ dh_carry,  // (B, S) contiguous, or null
                             int64_t batch, int64_t state) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t n = batch * state;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t b = e / state;
    const int64_t j = e - b * state;
    scalar_t* dp = d_pre_t + b * 3 * state + j;
    const bool active = row_active(lengths, b, t);
    acc_t gh = static_cast<acc_t>(dh[e]);
    if (!active) {
      // The output is a constant 0 here: its gradient does not count.
      dp[0] = dp[state] = dp[2 * state] = scalar_t(0);
      if (dh_carry != nullptr) dh_carry[e] = static_cast<scalar_t>(gh);
      continue;
    }
    if (grad_out_t != nullptr) gh += static_cast<acc_t>(grad_out_t[e]);
    const scalar_t* g = gates_t + b * 3 * state + j;
    const CellBackward<acc_t> d(gh, dc[e], static_cast<acc_t>(cells_t[e]), static_cast<acc_t>(g[0]),
                                static_cast<acc_t>(g[state]), static_cast<acc_t>(g[2 * state]));
    dp[0] = static_cast<scalar_t>(d.d_input);
    dp[state] = static_cast<scalar_t>(d.d_output);
    dp[2 * state] = static_cast<scalar_t>(d.d_candidate);
    dc[e] = d.d_cell;
    if (dh_carry != nullptr) dh_carry[e] = scalar_t(0);
  }
}

// The cell states c_t of every step from c0 and the saved activated gates
// (backward's input; forward does not keep them): c_t = c_{t-1} +
// candidate_t * input_gate_t, in the forward's order and precision, one
// thread per (row, unit) walking t. Gates past a row's length are 0, so c
// carries over there. The loads of kUnroll steps are issued before their
// sums, so a thread waits for memory once per kUnroll steps, not per step.
template <typename scalar_t>
__global__ void __launch_bounds__(kSeqPointwiseThreads)
    seq_cells_kernel(const scalar_t* __restrict__ gates,  // (T, B, 3S) contiguous, activated
                     const scalar_t* __restrict__ c0,     // (B, S) at b * c0_ld + j
                     int64_t c0_ld,
                     scalar_t* __restrict__ cells,  // (T, B, S) contiguous
                     int64_t steps, int64_t batch, int64_t state) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kUnroll = 8;
  const int64_t n = batch * state;
  const int64_t gate_step = 3 * n;  // elements between steps t and t + 1
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t b = e / state;
    const int64_t j = e - b * state;
    const scalar_t* g = gates + b * 3 * state + j;
    acc_t c = static_cast<acc_t>(c0[b * c0_ld + j]);
    for (int64_t t0 = 0; t0 < steps; t0 += kUnroll) {
      acc_t i[kUnroll], cand[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const bool in = t0 + u < steps;
        i[u] = in ? static_cast<acc_t>(g[(t0 + u) * gate_step]) : acc_t(0);
        cand[u] = in ? static_cast<acc_t>(g[(t0 + u) * gate_step + 2 * state]) : acc_t(0);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (t0 + u >= steps) break;
        c = c + cand[u] * i[u];  // as CellForward: old_cell + candidate * input_gate
        cells[(t0 + u) * n + e] = static_cast<scalar_t>(c);
      }
    }
  }
}

}  // namespace cuda_detail
}  // namespace lltm
