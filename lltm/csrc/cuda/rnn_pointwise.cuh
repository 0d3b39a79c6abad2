// Pointwise kernels of one time step of the step loop (rnn_cuda.cu: one
// cuBLAS GEMM and one of these per step), and the recompute of the states,
// for every cell (its traits, cells/cell.h, are a template parameter). They
// add the variable-length rule to the cell's math: a row whose step t is past
// its length keeps its states, writes output 0 and zero saved values, and in
// backward passes its carried gradients on unchanged.
#pragma once

#include <ATen/OpMathType.h>

#include <algorithm>
#include <cstdint>

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

// A step's pointers into the loop's buffers, (B, n S) rows unless a leading
// dimension says otherwise.
template <typename scalar_t>
struct StepForward {
  const scalar_t* zx;      // (B, G S): x_t W_ih^T, plus h_{t-1} W_hh^T for cells without kSplit
  const scalar_t* zh;      // (B, G S): h_{t-1} W_hh^T (kSplit), or null
  const scalar_t* b_ih;    // (G S,) or null
  const scalar_t* b_hh;    // (G S,) or null
  const scalar_t* h_prev;  // (B, S) at b * h_ld + j
  int64_t h_ld;
  const scalar_t* s_prev;  // (NS - 1, B, S) at k B S + b * s_ld + j: the other states, or null
  int64_t s_ld, s_stride;  // s_stride: elements between states k and k + 1
  scalar_t* saved;         // (B, NV S): may be zx itself (NV == G)
  scalar_t* output;        // (B, S): h_t, 0 past a row's length
  scalar_t* h_next;        // (B, S): the carried h (h_prev past a row's length), or null: the output
  scalar_t* s_next;        // (NS - 1, B, S) contiguous, or null
  const int64_t* lengths;  // (B,) or null
  int64_t t, batch, state;
};

template <typename Cell, typename scalar_t>
__global__ void __launch_bounds__(kSeqPointwiseThreads)
    rnn_forward_step_kernel(const StepForward<scalar_t> p) {
  using acc_t = at::opmath_type<scalar_t>;
  using M = Activations<false>;
  constexpr int G = Cell::kGates, NS = Cell::kStates, NV = Cell::kSaved;
  const int64_t S = p.state, n = p.batch * S;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t b = e / S;
    const int64_t j = e - b * S;
    acc_t old[NS];
    old[0] = static_cast<acc_t>(p.h_prev[b * p.h_ld + j]);
#pragma unroll
    for (int k = 1; k < NS; ++k) old[k] = static_cast<acc_t>(p.s_prev[(k - 1) * p.s_stride + b * p.s_ld + j]);
    scalar_t* sv_out = p.saved + b * NV * S + j;
    if (!row_active(p.lengths, b, p.t)) {
#pragma unroll
      for (int k = 0; k < NV; ++k) sv_out[k * S] = scalar_t(0);
#pragma unroll
      for (int k = 1; k < NS; ++k) p.s_next[(k - 1) * n + e] = static_cast<scalar_t>(old[k]);
      p.output[e] = scalar_t(0);
      if (p.h_next != nullptr) p.h_next[e] = p.h_prev[b * p.h_ld + j];
      continue;
    }
    acc_t zx[G], zh[G], next[NS], sv[NV];
    const scalar_t* zxp = p.zx + b * G * S + j;
#pragma unroll
    for (int g = 0; g < G; ++g) {
      zx[g] = static_cast<acc_t>(zxp[g * S]) +
              (p.b_ih != nullptr ? static_cast<acc_t>(p.b_ih[g * S + j]) : acc_t(0));
      zh[g] = p.zh != nullptr ? static_cast<acc_t>(p.zh[b * G * S + g * S + j]) : acc_t(0);
      if (p.b_hh != nullptr) zh[g] += static_cast<acc_t>(p.b_hh[g * S + j]);
    }
    Cell::template forward<M>(zx, zh, old, next, sv);
#pragma unroll
    for (int k = 0; k < NV; ++k) sv_out[k * S] = static_cast<scalar_t>(sv[k]);
#pragma unroll
    for (int k = 1; k < NS; ++k) p.s_next[(k - 1) * n + e] = static_cast<scalar_t>(next[k]);
    const scalar_t h = static_cast<scalar_t>(next[0]);
    p.output[e] = h;
    if (p.h_next != nullptr) p.h_next[e] = h;
  }
}

template <typename scalar_t>
struct StepBackward {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* dh;        // (B, S): the carried gradient of h_t (without the output's)
  const acc_t* dh_parts;     // (dh_splits, B, S): the parts of dh_t's product with W_hh
  int dh_splits;             //   still to add (loop_dh_splits), or 0
  const scalar_t* grad_out;  // (B, S) or null
  acc_t* ds;                 // (NS - 1, B, S), in/out: the other states' carried gradients
                             //   (float for half types: carried over all T steps)
  const scalar_t* saved;     // (B, NV S)
  const scalar_t* output_t;  // (B, S): h_t
  const scalar_t* h_prev;    // (B, S) at b * h_ld + j: h_{t-1}
  int64_t h_ld;
  const scalar_t* s_new;  // (NS - 1, B, S) at k B S + e: the other states after step t, or null
  const scalar_t* s_old;  // (NS - 1, B, S) at k s_stride + b * s_ld + j: before it, or null
  int64_t s_ld, s_stride;
  scalar_t* dzx;           // (B, G S)
  scalar_t* dzh;           // (B, G S) for cells with kSplit, else null
  scalar_t* dh_out;        // (B, S): the cell's direct d h_{t-1} (the GEMM adds dzh W_hh, or
                           //   writes its parts to dh_parts),
                           //   or the carried dh past a row's length
  const int64_t* lengths;  // (B,) or null
  int64_t t, batch, state;
};

template <typename Cell, typename scalar_t>
__global__ void __launch_bounds__(kSeqPointwiseThreads)
    rnn_backward_step_kernel(const StepBackward<scalar_t> p) {
  using acc_t = at::opmath_type<scalar_t>;
  using M = Activations<false>;
  constexpr int G = Cell::kGates, NS = Cell::kStates, NV = Cell::kSaved;
  const int64_t S = p.state, n = p.batch * S;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t b = e / S;
    const int64_t j = e - b * S;
    scalar_t* dx = p.dzx + b * G * S + j;
    scalar_t* dq = Cell::kSplit ? p.dzh + b * G * S + j : nullptr;
    acc_t dh = static_cast<acc_t>(p.dh[e]);
    for (int s = 0; s < p.dh_splits; ++s) dh += p.dh_parts[s * n + e];
    if (!row_active(p.lengths, b, p.t)) {
      // The output is a constant 0 here: its gradient does not count.
#pragma unroll
      for (int g = 0; g < G; ++g) {
        dx[g * S] = scalar_t(0);
        if constexpr (Cell::kSplit) dq[g * S] = scalar_t(0);
      }
      p.dh_out[e] = static_cast<scalar_t>(dh);
      continue;
    }
    acc_t dnext[NS], old[NS], next[NS], sv[NV], dzx[G], dzh[G], ds[NS];
    dnext[0] = dh + (p.grad_out != nullptr ? static_cast<acc_t>(p.grad_out[e]) : acc_t(0));
    old[0] = Cell::kOldRead & 1u ? static_cast<acc_t>(p.h_prev[b * p.h_ld + j]) : acc_t(0);
    next[0] = Cell::kNewRead & 1u ? static_cast<acc_t>(p.output_t[e]) : acc_t(0);
#pragma unroll
    for (int k = 1; k < NS; ++k) {
      dnext[k] = p.ds[(k - 1) * n + e];
      old[k] = Cell::kOldRead >> k & 1u ? static_cast<acc_t>(p.s_old[(k - 1) * p.s_stride + b * p.s_ld + j])
                                        : acc_t(0);
      next[k] = Cell::kNewRead >> k & 1u ? static_cast<acc_t>(p.s_new[(k - 1) * n + e]) : acc_t(0);
    }
    const scalar_t* svp = p.saved + b * NV * S + j;
#pragma unroll
    for (int k = 0; k < NV; ++k) sv[k] = static_cast<acc_t>(svp[k * S]);
    Cell::template backward<M>(dnext, old, next, sv, dzx, dzh, ds);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      dx[g * S] = static_cast<scalar_t>(dzx[g]);
      if constexpr (Cell::kSplit) dq[g * S] = static_cast<scalar_t>(dzh[g]);
    }
#pragma unroll
    for (int k = 1; k < NS; ++k) p.ds[(k - 1) * n + e] = ds[k];
    p.dh_out[e] = static_cast<scalar_t>(ds[0]);
  }
}

// The states other than h after every step, (NS - 1, T, B, S), from the
// initial ones and the saved values (backward's input; forward does not keep
// them), in the forward's order and rounding (the cell's recompute, in
// acc_t, one thread per (row, unit) = element b S + j walking t; rows past
// their length keep their states). Latency-bound: few threads (B S), each
// waiting on memory for its next steps. Two ways to wait less:
//   kStaged = false: each thread issues the loads of kUnroll steps before
//     their math, kUnroll as large as the registers allow without
//     spilling: 16 steps of up to 4 saved values of up to 4 bytes (215
//     registers for the LSTM in half types); 8 steps otherwise (float64's
//     16 x 4 loads alone fill 128).
//   kStaged = true: the block's 64 elements read each step's NV x 64 values
//     as 16-byte cp.async copies (sm_80+) of kStagedSteps steps a stage,
//     states_stages() stages in flight (48 steps ahead in half types), and
//     walk them from shared memory: copies, not registers, hide the
//     latency. Needs S a multiple of a copy's elements (a copy never
//     straddles two batch rows) and a 16-byte aligned `saved`; the
//     launcher checks both.
constexpr int kStatesThreads = 64;  // small blocks spread the B S threads over the SMs
constexpr int kStagedSteps = 16;
constexpr int kStagedSmemBytes = 48 * 1024;  // static shared memory: no opt-in needed

template <typename Cell, typename scalar_t>
constexpr int states_unroll() {
  return Cell::kSaved <= 4 && sizeof(scalar_t) <= 4 ? 16 : 8;
}
template <typename Cell, typename scalar_t>
constexpr int states_stage_bytes() {
  return kStagedSteps * Cell::kSaved * kStatesThreads * static_cast<int>(sizeof(scalar_t));
}
// Stages in flight (at most 4); fewer than 2 means no pipeline (kStaged = false).
template <typename Cell, typename scalar_t>
constexpr int states_stages() {
  return std::min(4, kStagedSmemBytes / states_stage_bytes<Cell, scalar_t>());
}

// One step of an element: the next states from the step's saved values
// (kept past the row's length), written to out, out + plane, ...
template <typename Cell, typename M, typename scalar_t, typename acc_t>
__device__ __forceinline__ void states_step(acc_t (&s)[Cell::kStates], const acc_t (&saved)[Cell::kSaved],
                                            bool alive, scalar_t* out, int64_t plane) {
  acc_t next[Cell::kStates];
  Cell::template recompute<M>(s, saved, next);
#pragma unroll
  for (int k = 1; k < Cell::kStates; ++k) {
    s[k] = alive ? next[k] : s[k];
    out[(k - 1) * plane] = static_cast<scalar_t>(s[k]);
  }
}

// The bias gradients from the persistent backward's sums over the steps of
// each batch row, rows (sets, B, cols) in acc_t: set q's column sums go to
// to[q][0] and to[q][1] where not null (a cell without kSplit has one set
// and gives it to both biases). One launch for every bias, in place of a
// reduction and a copy each: at small sizes the host's time is the layer's.
// Each column's B rows are added in a fixed order (kBiasRowGroups strided
// partial sums, then those in order): the same bits every run.
constexpr int kBiasColumns = 32, kBiasRowGroups = 8, kBiasThreads = kBiasColumns * kBiasRowGroups;
template <typename scalar_t>
struct BiasSumOuts {
  scalar_t* to[2][2];
};
template <typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(kBiasThreads)
    bias_sums_kernel(const acc_t* __restrict__ rows, int64_t batch, int64_t cols,
                     const BiasSumOuts<scalar_t> outs) {
  __shared__ acc_t part[kBiasRowGroups][kBiasColumns];
  const int q = blockIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kBiasColumns + threadIdx.x;
  const acc_t* r = rows + q * batch * cols + c;
  acc_t sum = 0;
  if (c < cols) {
    for (int64_t b = threadIdx.y; b < batch; b += kBiasRowGroups) sum += r[b * cols];
  }
  part[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  acc_t total = part[0][threadIdx.x];
#pragma unroll
  for (int g = 1; g < kBiasRowGroups; ++g) total += part[g][threadIdx.x];
  const scalar_t v = static_cast<scalar_t>(total);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (outs.to[q][k] != nullptr) outs.to[q][k][c] = v;
  }
}

// One thread per element: blocks of kStatesThreads, ceil(B S / threads) of them.
template <typename Cell, typename scalar_t, bool kStaged>
__global__ void __launch_bounds__(kStatesThreads)
    rnn_states_kernel(const scalar_t* __restrict__ saved,  // (T, B, NV S)
                      const scalar_t* __restrict__ s0,     // (NS - 1, B, S) at k s0_stride + b * s0_ld + j
                      int64_t s0_ld, int64_t s0_stride,
                      const int64_t* __restrict__ lengths,  // (B,) or null
                      scalar_t* __restrict__ states,        // (NS - 1, T, B, S)
                      int64_t steps, int64_t batch, int64_t state) {
  using acc_t = at::opmath_type<scalar_t>;
  using M = Activations<false>;
  constexpr int NS = Cell::kStates, NV = Cell::kSaved;
  const int64_t n = batch * state;
  const int64_t saved_step = NV * n;  // elements between steps t and t + 1
  const int64_t e0 = static_cast<int64_t>(blockIdx.x) * kStatesThreads, e = e0 + threadIdx.x;
  const bool mine = e < n;
  const int64_t b = mine ? e / state : 0;
  const int64_t j = mine ? e - b * state : 0;
  const int64_t length = !mine ? 0 : (lengths == nullptr ? steps : lengths[b]);
  acc_t s[NS] = {};  // s[0], h, is not rebuilt
#pragma unroll
  for (int k = 1; k < NS; ++k) {
    if (mine) s[k] = static_cast<acc_t>(s0[(k - 1) * s0_stride + b * s0_ld + j]);
  }
  scalar_t* out = states + e;  // step t's states, out + t n

  if constexpr (!kStaged) {
    constexpr int kUnroll = states_unroll<Cell, scalar_t>();
    if (!mine) return;
    // Addresses advance by pointer steps: kUnroll NV loads in flight, each
    // a 64-bit add from the last, not a product of its own.
    const scalar_t* gt = saved + b * NV * state + j;  // step t0's saved values
    for (int64_t t0 = 0; t0 < steps; t0 += kUnroll, gt += kUnroll * saved_step) {
      const int64_t count = steps - t0;
      scalar_t sv[kUnroll][NV];
      const scalar_t* q = gt;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u, q += saved_step) {
#pragma unroll
        for (int k = 0; k < NV; ++k) sv[u][k] = u < count ? q[k * state] : scalar_t(0);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u, out += n) {
        if (u >= count) break;
        acc_t saved_u[NV];
#pragma unroll
        for (int k = 0; k < NV; ++k) saved_u[k] = static_cast<acc_t>(sv[u][k]);
        states_step<Cell, M>(s, saved_u, t0 + u < length, out, steps * n);
      }
    }
  } else {
    constexpr int P = states_stages<Cell, scalar_t>();
    static_assert(P >= 2, "the launcher takes the register walk where stages do not fit");
    constexpr int V = 16 / static_cast<int>(sizeof(scalar_t));  // elements a copy
    constexpr int kChunks = kStatesThreads / V;                 // copies a (step, value) row of the block
    constexpr int kCopies = kStagedSteps * NV * kChunks;        // copies a stage
    static_assert(kCopies % kStatesThreads == 0, "every thread issues the same number of copies");
    constexpr int kMine = kCopies / kStatesThreads;
    __shared__ __align__(16) scalar_t stage[P][kStagedSteps][NV][kStatesThreads];
    // This thread's copies of a stage, the same slots in every stage: copy q =
    // threadIdx.x + i * threads is chunk q % kChunks of value (q / kChunks) %
    // NV at step q / (kChunks NV) of the stage; its source offset past the
    // stage's first step, -1 for chunks past the last element.
    int64_t src[kMine];
    int dst[kMine];
#pragma unroll
    for (int i = 0; i < kMine; ++i) {
      const int q = threadIdx.x + i * kStatesThreads;
      const int c = q % kChunks, k = (q / kChunks) % NV, u = q / (kChunks * NV);
      const int64_t ec = e0 + c * V;
      const int64_t bc = ec / state, jc = ec - bc * state;
      src[i] = ec < n ? u * saved_step + bc * NV * state + k * state + jc : -1;
      dst[i] = (u * NV + k) * kStatesThreads + c * V;
    }
    const int64_t stages = (steps + kStagedSteps - 1) / kStagedSteps;
    auto issue =
        [&](int64_t g) {  // stage g's copies into buffer g % P, then one commit group (empty past the end)
          if (g < stages) {
            const int64_t t0 = g * kStagedSteps;
            scalar_t* buf = &stage[g % P][0][0][0];
#pragma unroll
            for (int i = 0; i < kMine; ++i) {
              const int u = (threadIdx.x + i * kStatesThreads) / (kChunks * NV);
              if (src[i] < 0 || t0 + u >= steps) continue;
              const scalar_t* from = saved + t0 * saved_step + src[i];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
              asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                               static_cast<uint32_t>(__cvta_generic_to_shared(buf + dst[i]))),
                           "l"(from)
                           : "memory");
#else
              *reinterpret_cast<int4*>(buf + dst[i]) = *reinterpret_cast<const int4*>(from);
#endif
            }
          }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
          asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
        };

#pragma unroll
    for (int g = 0; g < P - 1; ++g) issue(g);
    for (int64_t g = 0; g < stages; ++g) {
      issue(g + P - 1);  // into the buffer stage g - 1 used: the barrier below ended its reads
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
      asm volatile("cp.async.wait_group %0;\n" ::"n"(P - 1) : "memory");  // this thread's copies of stage g
#endif
      __syncthreads();  // everyone's
      const int64_t t0 = g * kStagedSteps;
      const int count = static_cast<int>(std::min<int64_t>(kStagedSteps, steps - t0));
      if (mine) {
        const scalar_t* buf = &stage[g % P][0][0][threadIdx.x];
#pragma unroll
        for (int u = 0; u < kStagedSteps; ++u, out += n) {
          if (u >= count) break;
          acc_t saved_u[NV];
#pragma unroll
          for (int k = 0; k < NV; ++k) saved_u[k] = static_cast<acc_t>(buf[(u * NV + k) * kStatesThreads]);
          states_step<Cell, M>(s, saved_u, t0 + u < length, out, steps * n);
        }
      }
      __syncthreads();  // stage g's buffer is free for stage g + P
    }
  }
}

}  // namespace cuda_detail
}  // namespace lltm
