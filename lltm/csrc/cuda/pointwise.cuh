// Memory-bound kernels of the large-size path: the gate activations after the
// forward GEMMs, and the gate gradients before the backward GEMMs. Each is
// one pass over the gates; V consecutive state columns per thread, moved with
// 16-byte loads and stores when the host has checked alignment.
#pragma once

#include "cell_math.cuh"

namespace lltm {
namespace cuda_detail {

constexpr int kForwardPointwiseThreads = 256;

// gates holds X W^T (no bias) on entry and the activated gates on exit.
template <typename scalar_t, int V>
__global__ void __launch_bounds__(kForwardPointwiseThreads)
    cell_forward_pointwise_kernel(scalar_t* __restrict__ gates,           // (B, 3S) contiguous, in/out
                                  const scalar_t* __restrict__ bias,      // (3S,) contiguous, or null
                                  const scalar_t* __restrict__ old_cell,  // (B, S) at b * c_rs + j * c_cs
                                  int64_t c_rs, int64_t c_cs, bool c_vec,
                                  scalar_t* __restrict__ new_h,     // (B, S) contiguous
                                  scalar_t* __restrict__ new_cell,  // (B, S) contiguous
                                  int64_t state,                    // S (a multiple of V)
                                  int64_t num_packs) {              // B * S / V
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t packs_per_row = state / V;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < num_packs; p += stride) {
    const int64_t b = p / packs_per_row;
    const int64_t j = (p - b * packs_per_row) * V;
    scalar_t* g = gates + b * 3 * state + j;
    acc_t z_i[V], z_o[V], z_c[V], c[V];
    load_pack<acc_t, scalar_t, V>(g, z_i);
    load_pack<acc_t, scalar_t, V>(g + state, z_o);
    load_pack<acc_t, scalar_t, V>(g + 2 * state, z_c);
    load_pack_strided<acc_t, scalar_t, V>(old_cell + b * c_rs + j * c_cs, c_cs, c_vec, c);
    if (bias != nullptr) {
      acc_t b_i[V], b_o[V], b_c[V];
      load_pack<acc_t, scalar_t, V>(bias + j, b_i);
      load_pack<acc_t, scalar_t, V>(bias + state + j, b_o);
      load_pack<acc_t, scalar_t, V>(bias + 2 * state + j, b_c);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        z_i[v] += b_i[v];
        z_o[v] += b_o[v];
        z_c[v] += b_c[v];
      }
    }
    acc_t h_out[V], c_out[V];
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const CellForward<acc_t> cell(z_i[v], z_o[v], z_c[v], c[v]);
      z_i[v] = cell.input_gate;
      z_o[v] = cell.output_gate;
      z_c[v] = cell.candidate;
      h_out[v] = cell.new_h;
      c_out[v] = cell.new_cell;
    }
    store_pack<acc_t, scalar_t, V>(g, z_i);
    store_pack<acc_t, scalar_t, V>(g + state, z_o);
    store_pack<acc_t, scalar_t, V>(g + 2 * state, z_c);
    store_pack<acc_t, scalar_t, V>(new_h + b * state + j, h_out);
    store_pack<acc_t, scalar_t, V>(new_cell + b * state + j, c_out);
  }
}

// Backward blocks: kBackwardCols threads along the state (V columns each) by
// kBackwardRows along the batch. blockIdx.y picks a column chunk, blockIdx.x
// a chunk of rows (so the batch is never limited by gridDim.y).
constexpr int kBackwardCols = 32;
constexpr int kBackwardRows = 8;

// d_pre = d loss / d gate pre-activations and grad_old_cell, plus the column
// sums of d_pre (grad_bias): reduced in registers and shared memory over the
// block's rows, then written straight to grad_bias when there is one row
// chunk, or to one row of bias_partial per chunk (summed by
// column_sum_kernel). Any of the outputs may be null when not needed.
template <typename scalar_t, int V>
__global__ void __launch_bounds__(kBackwardCols* kBackwardRows)
    cell_backward_pointwise_kernel(const scalar_t* __restrict__ grad_h,  // (B, S) at b * gh_rs + j * gh_cs
                                   int64_t gh_rs, int64_t gh_cs, bool gh_vec,
                                   const scalar_t* __restrict__ grad_cell,  // (B, S) likewise
                                   int64_t gc_rs, int64_t gc_cs, bool gc_vec,
                                   const scalar_t* __restrict__ new_cell,  // (B, S) contiguous
                                   const scalar_t* __restrict__ gates,     // (B, 3S) contiguous
                                   scalar_t* __restrict__ d_pre,           // (B, 3S) contiguous, or null
                                   scalar_t* __restrict__ grad_old_cell,   // (B, S) contiguous, or null
                                   at::opmath_type<scalar_t>* __restrict__ bias_partial,  // (chunks, 3S)
                                   scalar_t* __restrict__ grad_bias,  // (3S,), or null: no bias sums
                                   int64_t batch, int64_t state,      // B, S (S a multiple of V)
                                   int64_t rows_per_chunk) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t partial[kBackwardRows][3 * V][kBackwardCols];

  const int64_t j = (static_cast<int64_t>(blockIdx.y) * kBackwardCols + threadIdx.x) * V;
  const bool active = j < state;
  const int64_t row_begin = static_cast<int64_t>(blockIdx.x) * rows_per_chunk;
  const int64_t row_end = row_begin + rows_per_chunk < batch ? row_begin + rows_per_chunk : batch;

  acc_t sum[3][V];
#pragma unroll
  for (int v = 0; v < V; ++v) sum[0][v] = sum[1][v] = sum[2][v] = acc_t(0);

  if (active) {
    for (int64_t b = row_begin + threadIdx.y; b < row_end; b += kBackwardRows) {
      const scalar_t* g = gates + b * 3 * state + j;
      acc_t gh[V], gc[V], c[V], ig[V], og[V], cand[V];
      load_pack_strided<acc_t, scalar_t, V>(grad_h + b * gh_rs + j * gh_cs, gh_cs, gh_vec, gh);
      load_pack_strided<acc_t, scalar_t, V>(grad_cell + b * gc_rs + j * gc_cs, gc_cs, gc_vec, gc);
      load_pack<acc_t, scalar_t, V>(new_cell + b * state + j, c);
      load_pack<acc_t, scalar_t, V>(g, ig);
      load_pack<acc_t, scalar_t, V>(g + state, og);
      load_pack<acc_t, scalar_t, V>(g + 2 * state, cand);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const CellBackward<acc_t> d(gh[v], gc[v], c[v], ig[v], og[v], cand[v]);
        ig[v] = d.d_input;  // reuse the registers for the outputs
        og[v] = d.d_output;
        cand[v] = d.d_candidate;
        c[v] = d.d_cell;
        sum[0][v] += d.d_input;
        sum[1][v] += d.d_output;
        sum[2][v] += d.d_candidate;
      }
      if (d_pre != nullptr) {
        scalar_t* dp = d_pre + b * 3 * state + j;
        store_pack<acc_t, scalar_t, V>(dp, ig);
        store_pack<acc_t, scalar_t, V>(dp + state, og);
        store_pack<acc_t, scalar_t, V>(dp + 2 * state, cand);
      }
      if (grad_old_cell != nullptr) {
        store_pack<acc_t, scalar_t, V>(grad_old_cell + b * state + j, c);
      }
    }
  }
  if (grad_bias == nullptr) return;  // uniform over the grid

#pragma unroll
  for (int g = 0; g < 3; ++g) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      partial[threadIdx.y][g * V + v][threadIdx.x] = sum[g][v];
    }
  }
  __syncthreads();
  if (!active) return;
  // The 3V sums of each column pack are spread over the block's rows.
  for (int e = threadIdx.y; e < 3 * V; e += kBackwardRows) {
    acc_t s = acc_t(0);
#pragma unroll
    for (int y = 0; y < kBackwardRows; ++y) s += partial[y][e][threadIdx.x];
    const int64_t col = (e / V) * state + j + (e % V);
    if (gridDim.x == 1) {
      grad_bias[col] = static_cast<scalar_t>(s);
    } else {
      bias_partial[static_cast<int64_t>(blockIdx.x) * 3 * state + col] = s;
    }
  }
}

// out[c] = sum over p of partial[p, c]: the last step of grad_bias when the
// batch was split into several row chunks. kSumCols columns per block, the
// chunks spread over kSumRows thread rows with four independent running sums
// each (the loads are latency-bound, not bandwidth-bound), then one pass
// through shared memory. Fixed order: deterministic.
constexpr int kSumCols = 32;
constexpr int kSumRows = 8;

template <typename scalar_t>
__global__ void __launch_bounds__(kSumCols* kSumRows)
    column_sum_kernel(const at::opmath_type<scalar_t>* __restrict__ partial,  // (chunks, n)
                      int64_t chunks, int64_t n,
                      scalar_t* __restrict__ out) {  // (n,)
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t rows[kSumRows][kSumCols + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kSumCols + threadIdx.x;
  acc_t s0 = acc_t(0), s1 = acc_t(0), s2 = acc_t(0), s3 = acc_t(0);
  if (c < n) {
    int64_t p = threadIdx.y;
    for (; p + 3 * kSumRows < chunks; p += 4 * kSumRows) {
      s0 += partial[p * n + c];
      s1 += partial[(p + kSumRows) * n + c];
      s2 += partial[(p + 2 * kSumRows) * n + c];
      s3 += partial[(p + 3 * kSumRows) * n + c];
    }
    for (; p < chunks; p += kSumRows) s0 += partial[p * n + c];
  }
  rows[threadIdx.y][threadIdx.x] = (s0 + s1) + (s2 + s3);
  __syncthreads();
  if (threadIdx.y == 0 && c < n) {
    acc_t s = acc_t(0);
#pragma unroll
    for (int y = 0; y < kSumRows; ++y) s += rows[y][threadIdx.x];
    out[c] = static_cast<scalar_t>(s);
  }
}

// X = [old_h | input] (B, S + I), contiguous: the operand of the forward's
// single GEMM on the large path. V elements per thread (the host checks
// that S, I, both row strides and both pointers allow V-wide accesses).
template <typename scalar_t, int V>
__global__ void __launch_bounds__(kForwardPointwiseThreads)
    concat_kernel(const scalar_t* __restrict__ old_h, int64_t ld_h,  // (B, S)
                  const scalar_t* __restrict__ input, int64_t ld_x,  // (B, I)
                  scalar_t* __restrict__ X,                          // (B, S + I) contiguous
                  int64_t state, int64_t features, int64_t num_packs) {
  const int64_t K = state + features;
  const int64_t packs_per_row = K / V;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < num_packs; p += stride) {
    const int64_t b = p / packs_per_row;
    const int64_t k = (p - b * packs_per_row) * V;
    const scalar_t* src = k < state ? old_h + b * ld_h + k : input + b * ld_x + (k - state);
    *reinterpret_cast<Pack<scalar_t, V>*>(X + b * K + k) = *reinterpret_cast<const Pack<scalar_t, V>*>(src);
  }
}

}  // namespace cuda_detail
}  // namespace lltm
