// The fused CUDA backend's sequence operators for any cell (cells/cell.h),
// as templates: rnn_cuda.cu instantiates them for the built-in cells, a cell
// defined with lltm.cells.define for its own (its generated CUDA sources,
// which link against lltm's library for the host code that is not a
// template: cuBLAS GEMMs, graph replay, the planner).
//
// Forward: zx = x W_ih^T for all T steps is one cuBLAS GEMM over T*B rows.
// Then the time loop, as the planner (seq_plan.h) chooses: one launch of a
// persistent kernel (seq_persistent.h), or the step loop: per step one
// GEMM (h_{t-1} W_hh^T, added into zx_t, or into a zh buffer for cells that
// keep it apart) and one pointwise kernel (the cell's forward, biases, the
// length mask), replayed from a CUDA graph where the call repeats
// (seq_graph.h). Either way the host only queues asynchronous launches on
// the current stream: no synchronisation, capturable in a CUDA graph.
//
// Backward: the states other than h are rebuilt from the saved values (one
// kernel), then the reverse-time loop (persistent kernel, or per step one
// pointwise kernel and one GEMM d h_{t-1} += dzh_t W_hh, whose parts of k
// the next step's kernel adds where the planner splits k: loop_dh_splits)
// writes dzx and dzh of every step; after it, over all T*B rows at once:
//   grad_input = dzx W_ih,  grad_W_ih = dzx^T x,  grad_b_ih = column sums of dzx
//   grad_W_hh  = dzh_0^T h0 + dzh_{1:}^T output_{:-1}  (h_{t-1} is the previous
//                output on every row whose dzh is not 0),  grad_b_hh = sums of dzh
// (the persistent kernel adds each batch row's bias sums over the steps as
// it writes dzx and dzh; then only its B rows are summed).
// No atomics: every gradient element is written by one GEMM or reduction.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string_view>
#include <vector>

#include "../precision.h"
#include "../rnn.h"
#include "../rnn_ops.h"
#include "blas.h"
#include "guard.h"
#include "launch_utils.h"
#include "persistent_params.cuh"
#include "rnn_pointwise.cuh"
#include "seq_graph.h"
#include "seq_persistent.h"
#include "seq_tune.h"

namespace lltm {
namespace cuda_detail {

inline const void* ptr_or_null(const at::Tensor& t) { return t.defined() ? t.const_data_ptr() : nullptr; }

// The accurate mode's float32 GEMMs over all T*B rows of the backward run
// strict fp32 unless LLTM_SPLIT_TF32_MACS asks for 3xTF32 from a size on.
// cuBLAS's TF32 GEMMs chain their sums through the tensor cores'
// truncating adder, so three of them (3xTF32) lose accuracy with the
// length of the sum: over T*B rows the weight gradient's error was 40x
// strict fp32's at 512x1024, T = 100 (1.6e-4 against 4.1e-6; the LSTM's
// 1.2e-4 against 2.8e-6) and the LSTM's input gradient 8.8x at 64x512, for
// 12-22% of the f+b time at 512x1024 and nothing below
// (docs/benchmarks-history.md, section 54).
constexpr int64_t kSplitTf32Never = std::numeric_limits<int64_t>::max();

// The environment variable `name` as a count N >= 0, or `unset` where it is
// not set; anything else is an error: "NAME=text must be " + `values`.
inline int64_t env_count(const char* name, int64_t unset, const char* values) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return unset;
  char* end = nullptr;
  const long long n = std::strtoll(text, &end, 10);
  TORCH_CHECK(*end == '\0' && n >= 0, name, "=", text, " must be ", values);
  return n;
}

// LLTM_SPLIT_TF32_MACS=N: the accurate mode's GEMMs over T*B rows as
// 3xTF32 from N multiply-adds on (0: every one, as tests use it), faster
// at the largest sizes and less accurate; unset: never.
inline int64_t split_tf32_macs() {
  return env_count("LLTM_SPLIT_TF32_MACS", kSplitTf32Never,
                   "a number of multiply-adds N >= 0 (the accurate mode's GEMMs over all T*B rows run as "
                   "3xTF32 from N on, strict below), or unset (strict always)");
}

// The GEMMs over all T*B rows (outside any graph of lltm's own): the
// backward's for float32 in the accurate mode strict, or as 3xTF32 from
// LLTM_SPLIT_TF32_MACS on; else as the mode says (precision.h).
inline void run_row_gemms(c10::ScalarType dtype, const Gemm* gemms, int count, bool backward) {
  if (dtype == c10::ScalarType::Float && split_tf32_rows(backward)) {
    const int64_t from = split_tf32_macs();
    std::vector<Gemm> split, strict;
    for (int i = 0; i < count; ++i) {
      const Gemm& g = gemms[i];
      (g.m * g.n * g.k >= from ? split : strict).push_back(g);
    }
    if (!strict.empty()) run_gemms(dtype, strict.data(), static_cast<int>(strict.size()), false);
    if (!split.empty()) run_gemms_split_tf32(split.data(), static_cast<int>(split.size()));
  } else {
    run_gemms(dtype, gemms, count, tf32_products(backward));
  }
}

template <typename Cell>
int64_t cell_key() {
  return static_cast<int64_t>(std::hash<std::string_view>{}(Cell::kName));
}

// From this size of a step's product (multiply-adds) on, strict float32's
// forward steps read W_hh^T (S, G S), copied once per forward: cuBLAS's FFMA
// kernels run h_{t-1} W_hh^T 7-17% faster on it than on W_hh read transposed
// (B = 64 to 512, S = 512 and 1024, H200; the copy costs about one step;
// docs/benchmarks-history.md section 37). TF32 and the half types read W_hh
// as stored: their tensor cores want both operands K-major.
constexpr int64_t kFmaTransposedStepMacs = int64_t(1) << 24;

// W_hh (G S, S) for a step loop's GEMMs: as stored, or where `transposed` a
// copy of W_hh^T (S, G S), made once per call.
struct StepWeights {
  at::Tensor copy;  // the copy, else undefined
  const void* data;
  int64_t ld;
};
inline StepWeights step_weights(c10::ScalarType dtype, const RowMajor& w_hh, int64_t GS, int64_t S,
                                bool transposed, const at::TensorOptions& options) {
  if (!transposed) return {at::Tensor(), w_hh.tensor.const_data_ptr(), w_hh.ld};
  at::Tensor copy = at::empty({S, GS}, options);
  transpose(dtype, GS, S, w_hh.tensor.const_data_ptr(), w_hh.ld, copy.mutable_data_ptr(), GS);
  return {copy, copy.const_data_ptr(), GS};
}

// Whether a pass's step products of `dtype` run on cuBLAS's FFMA kernels:
// float32 where lltm's mode keeps them strict (precision.h).
inline bool strict_float32_products(c10::ScalarType dtype, bool backward) {
  return dtype == c10::ScalarType::Float && !tf32_products(backward);
}

// The forward's loop over cuBLAS: zx holds x W_ih^T on entry.
template <typename Cell>
void forward_loop(const RnnArgs& a, const RowMajor& w_hh, const std::vector<RowMajor>& state0, at::Tensor& zx,
                  at::Tensor& output, std::vector<at::Tensor>& state_n, at::Tensor& saved) {
  constexpr int G = Cell::kGates, NS = Cell::kStates;
  const int64_t T = a.steps(), B = a.batch(), S = a.hidden(), GS = G * S, n = B * S;
  const auto options = a.input.options();
  const c10::ScalarType dtype = a.input.scalar_type();
  const bool masked = a.lengths.defined();
  // With lengths the carried h differs from the output (0 past a row's
  // length): two (B, S) buffers, written in turn; the other states likewise.
  at::Tensor h_buf = masked ? at::empty({2, B, S}, options) : at::Tensor();
  at::Tensor s_buf = NS > 1 ? at::empty({2, NS - 1, B, S}, options) : at::Tensor();
  at::Tensor zh = Cell::kSplit ? at::empty({B, GS}, options) : at::Tensor();
  const char* w_ptr = static_cast<const char*>(w_hh.tensor.const_data_ptr());
  const unsigned int blocks = pointwise_blocks(n, a.input.get_device());
  const bool tf32 = tf32_products(false);  // the forward's cuBLAS math (precision.h)
  const bool w_transposed =
      strict_float32_products(dtype, false) && T > 1 && B * S * GS >= kFmaTransposedStepMacs;
  const StepWeights w = step_weights(dtype, w_hh, GS, S, w_transposed, options);
  // The launches, replayed from a CUDA graph where the same call repeats:
  // the key holds every value they bake in.
  GraphKey key = {0,
                  cell_key<Cell>(),
                  static_cast<int64_t>(dtype),
                  T,
                  B,
                  S,
                  w_hh.ld,
                  state0[0].ld,
                  NS > 1 ? state0[NS - 1].ld : 0,
                  tf32_products(/*backward=*/false)};
  for (const void* p :
       {static_cast<const void*>(zx.const_data_ptr()), static_cast<const void*>(w_ptr), ptr_or_null(w.copy),
        state0[0].tensor.const_data_ptr(), NS > 1 ? state0[NS - 1].tensor.const_data_ptr() : nullptr,
        ptr_or_null(a.b_ih), ptr_or_null(a.b_hh), ptr_or_null(a.lengths), output.const_data_ptr(),
        saved.const_data_ptr(), ptr_or_null(h_buf), ptr_or_null(s_buf), ptr_or_null(zh)}) {
    key_add(key, p);
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "lltm_fused_rnn_forward", [&] {
    run_graphed(std::move(key), [&] {
      const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
      StepForward<scalar_t> p{};
      p.b_ih = a.b_ih.defined() ? a.b_ih.const_data_ptr<scalar_t>() : nullptr;
      p.b_hh = a.b_hh.defined() ? a.b_hh.const_data_ptr<scalar_t>() : nullptr;
      p.h_prev = state0[0].data<scalar_t>();
      p.h_ld = state0[0].ld;
      if constexpr (NS > 1) {
        // one initial state besides h (kMaxStates = 2)
        p.s_prev = state0[1].data<scalar_t>();
        p.s_ld = state0[1].ld;
      }
      p.lengths = masked ? a.lengths.const_data_ptr<int64_t>() : nullptr;
      p.batch = B;
      p.state = S;
      for (int64_t t = 0; t < T; ++t) {
        scalar_t* zx_t = zx.mutable_data_ptr<scalar_t>() + t * B * GS;
        // zx_t += h_{t-1} W_hh^T, or zh = h_{t-1} W_hh^T: (B, G S) = (B, S) (G S, S)^T,
        // or (B, S) (S, G S) from the copy
        const Gemm recurrent = {false,
                                !w_transposed,
                                B,
                                GS,
                                S,
                                p.h_prev,
                                p.h_ld,
                                w.data,
                                w.ld,
                                !Cell::kSplit,
                                Cell::kSplit ? zh.mutable_data_ptr() : zx_t,
                                GS};
        run_gemms(dtype, &recurrent, 1, tf32);
        p.zx = zx_t;
        p.zh = Cell::kSplit ? zh.const_data_ptr<scalar_t>() : nullptr;
        p.saved = saved.mutable_data_ptr<scalar_t>() + t * B * Cell::kSaved * S;
        p.output = output.mutable_data_ptr<scalar_t>() + t * n;
        p.h_next = masked ? h_buf.mutable_data_ptr<scalar_t>() + (t % 2) * n : nullptr;
        p.s_next = NS > 1 ? s_buf.mutable_data_ptr<scalar_t>() + (t % 2) * (NS - 1) * n : nullptr;
        p.t = t;
        rnn_forward_step_kernel<Cell, scalar_t><<<blocks, kSeqPointwiseThreads, 0, stream>>>(p);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        p.h_prev = masked ? p.h_next : p.output;
        p.h_ld = S;
        p.s_prev = p.s_next;
        p.s_ld = S;
        p.s_stride = n;
      }
    });
  });
  // The final states: the last carried h (the last output without lengths)
  // and the other states (carried past each row's length).
  state_n[0].copy_(masked ? h_buf[(T - 1) % 2] : output[T - 1]);
  for (int k = 1; k < NS; ++k) state_n[k].copy_(s_buf[(T - 1) % 2][k - 1]);
}

// The other states after every step (NS - 1, T, B, S), rebuilt from the saved values.
template <typename Cell>
at::Tensor recompute_states(const RnnArgs& a, const std::vector<RowMajor>& state0, const at::Tensor& saved) {
  constexpr int NS = Cell::kStates;
  if constexpr (NS == 1) {
    return at::Tensor();
  } else {
    const int64_t T = a.steps(), B = a.batch(), S = a.hidden();
    at::Tensor states = at::empty({NS - 1, T, B, S}, saved.options());
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, saved.scalar_type(), "lltm_rnn_states", [&] {
      const int64_t* lengths = a.lengths.defined() ? a.lengths.const_data_ptr<int64_t>() : nullptr;
      // Staged through shared memory where enough stages fit and its
      // 16-byte copies stay aligned and in one batch row; else in registers.
      bool staged = false;
      if constexpr (states_stages<Cell, scalar_t>() >= 2) {
        staged = S % (16 / static_cast<int>(sizeof(scalar_t))) == 0 &&
                 reinterpret_cast<uintptr_t>(saved.const_data_ptr()) % 16 == 0;
      }
      auto kernel = staged ? rnn_states_kernel<Cell, scalar_t, states_stages<Cell, scalar_t>() >= 2>
                           : rnn_states_kernel<Cell, scalar_t, false>;
      kernel<<<grid_size(std::max<int64_t>(1, ceil_div(B * S, kStatesThreads))), kStatesThreads, 0,
               c10::cuda::getCurrentCUDAStream()>>>(saved.const_data_ptr<scalar_t>(),
                                                    state0[1].data<scalar_t>(), state0[1].ld, 0, lengths,
                                                    states.mutable_data_ptr<scalar_t>(), T, B, S);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    return states;
  }
}

// From these sizes (multiply-adds) on, TF32's backward GEMMs read K-major
// copies of their operands: a step's d h_{t-1} += dzh_t W_hh (B S G S; W_hh^T
// is copied once per backward, so it pays for almost any step), and the
// weight gradients (G S x (I or S) x T B; their copies move every row, which
// the faster GEMM repays only from about the LLTM's 256x1024 on: at 512x512,
// 4e10, it did not; docs/benchmarks-history.md section 31).
constexpr int64_t kKMajorStepMacs = int64_t(1) << 24;
constexpr int64_t kKMajorWeightMacs = int64_t(1) << 36;

// LLTM_TF32_K_MAJOR: unset, the sizes above decide; 0, never; N > 0, always,
// the weight gradients' copies in chunks of at most N rows (so that tests
// reach every branch at small sizes). Returns -1, 0 or N.
inline int64_t k_major_setting() {
  return env_count("LLTM_TF32_K_MAJOR", -1,
                   "0 (never), a number of rows N (always, the weight gradients in chunks of N rows), or "
                   "unset (by size)");
}

// Whether TF32's backward GEMMs of `macs` multiply-adds read K-major copies
// of their operands: float32 with plain TF32 (not the accurate mode's
// 3xTF32), as LLTM_TF32_K_MAJOR says, or by size from `from_macs` on. A
// wrong setting is an error whatever the dtype.
inline bool k_major_tf32(c10::ScalarType dtype, int64_t macs, int64_t from_macs) {
  const int64_t setting = k_major_setting();
  if (dtype != c10::ScalarType::Float || !tf32_products(/*backward=*/true)) return false;
  return setting > 0 || (setting < 0 && macs >= from_macs);
}
// The backward's reverse-time loop over cuBLAS: dzx (and dzh), and the
// gradients of the initial states where wanted.
template <typename Cell>
void backward_loop(const RnnArgs& a, const RnnBackwardArgs& from, const RowMajor& w_hh,
                   const std::vector<RowMajor>& state0, const at::Tensor& states, const at::Tensor& saved,
                   const at::Tensor& output, at::Tensor& dzx, at::Tensor& dzh,
                   std::vector<at::Tensor>& grad_state0) {
  constexpr int G = Cell::kGates, NS = Cell::kStates, NV = Cell::kSaved;
  const int64_t T = a.steps(), B = a.batch(), S = a.hidden(), GS = G * S, n = B * S;
  const auto options = a.input.options();
  const c10::ScalarType dtype = a.input.scalar_type();
  const bool want_state = !grad_state0.empty();
  const char* w_ptr = static_cast<const char*>(w_hh.tensor.const_data_ptr());
  // Carried gradients: dh in two (B, S) buffers written in turn (the
  // pointwise kernel and the GEMM write one, the next step reads it), the
  // other states' in float for half and bfloat16.
  at::Tensor dh = at::empty({2, B, S}, options);
  if (from.grad_state[0].defined()) {
    dh[T % 2].copy_(from.grad_state[0]);
  } else {
    dh[T % 2].zero_();
  }
  at::Tensor ds = at::zeros({std::max(NS - 1, 1), B, S}, options.dtype(at::toOpMathType(dtype)));
  for (int k = 1; k < NS; ++k) {
    if (from.grad_state[k].defined()) ds[k - 1].copy_(from.grad_state[k]);
  }
  const at::Tensor g_out = from.grad_output;
  const unsigned int blocks = pointwise_blocks(n, a.input.get_device());
  const bool tf32 = tf32_products(true);
  // TF32 tensor cores read both operands along k (float32 has no transposing
  // load): with W_hh^T (S, G S), made once here, every step's GEMM reads
  // K-major operands (23.3 -> 19.8 µs a step at B = 512, S = 1024;
  // docs/benchmarks-history.md section 30). Not for small GEMMs, where the
  // copy would cost more than the steps gain.
  const bool w_transposed = k_major_tf32(dtype, B * S * GS, kKMajorStepMacs);
  const StepWeights w = step_weights(dtype, w_hh, GS, S, w_transposed, options);
  // The step's GEMM d h_{t-1} += dzh_t W_hh in `splits` parts of k, which the
  // next step's kernel adds (seq_plan.h), or one GEMM into dh.
  const int splits = loop_dh_splits(B, S, GS, sm_count(a.input.get_device()), w_transposed,
                                    strict_float32_products(dtype, true));
  at::Tensor dh_parts =
      splits > 1 ? at::empty({splits, B, S}, options.dtype(at::toOpMathType(dtype))) : at::Tensor();
  GraphKey key = {1,
                  cell_key<Cell>(),
                  static_cast<int64_t>(dtype),
                  T,
                  B,
                  S,
                  w_hh.ld,
                  state0[0].ld,
                  want_state,
                  tf32_products(/*backward=*/true),
                  splits};
  for (const void* p :
       {static_cast<const void*>(dh.const_data_ptr()), ptr_or_null(dh_parts), ptr_or_null(g_out),
        ds.const_data_ptr(), saved.const_data_ptr(), output.const_data_ptr(),
        state0[0].tensor.const_data_ptr(), ptr_or_null(states),
        NS > 1 ? state0[NS - 1].tensor.const_data_ptr() : nullptr, ptr_or_null(a.lengths),
        dzx.const_data_ptr(), ptr_or_null(dzh), static_cast<const void*>(w_ptr), ptr_or_null(w.copy)}) {
    key_add(key, p);
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "lltm_fused_rnn_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    run_graphed(std::move(key), [&] {
      const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
      scalar_t* dh_base = dh.mutable_data_ptr<scalar_t>();
      StepBackward<scalar_t> p{};
      p.ds = ds.mutable_data_ptr<acc_t>();
      acc_t* parts = splits > 1 ? dh_parts.mutable_data_ptr<acc_t>() : nullptr;
      p.dh_parts = parts;
      p.lengths = a.lengths.defined() ? a.lengths.const_data_ptr<int64_t>() : nullptr;
      p.batch = B;
      p.state = S;
      for (int64_t t = T - 1; t >= 0; --t) {
        p.dh = dh_base + ((t + 1) % 2) * n;
        p.dh_out = dh_base + (t % 2) * n;
        p.dh_splits = splits > 1 && t < T - 1 ? splits : 0;  // the parts of step t + 1's GEMM
        p.grad_out = g_out.defined() ? g_out.const_data_ptr<scalar_t>() + t * n : nullptr;
        p.saved = saved.const_data_ptr<scalar_t>() + t * B * NV * S;
        p.output_t = output.const_data_ptr<scalar_t>() + t * n;
        p.h_prev = t > 0 ? output.const_data_ptr<scalar_t>() + (t - 1) * n : state0[0].data<scalar_t>();
        p.h_ld = t > 0 ? S : state0[0].ld;
        if constexpr (NS > 1) {
          p.s_new = states.const_data_ptr<scalar_t>() + t * n;
          p.s_old = t > 0 ? states.const_data_ptr<scalar_t>() + (t - 1) * n : state0[1].data<scalar_t>();
          p.s_ld = t > 0 ? S : state0[1].ld;
          p.s_stride = T * n;
        }
        scalar_t* dzx_t = dzx.mutable_data_ptr<scalar_t>() + t * B * GS;
        scalar_t* dzh_t = Cell::kSplit ? dzh.mutable_data_ptr<scalar_t>() + t * B * GS : dzx_t;
        p.dzx = dzx_t;
        p.dzh = Cell::kSplit ? dzh_t : nullptr;
        p.t = t;
        rnn_backward_step_kernel<Cell, scalar_t><<<blocks, kSeqPointwiseThreads, 0, stream>>>(p);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        if (t > 0 || want_state) {
          // d h_{t-1} += dzh_t W_hh: (B, S) = (B, G S) (G S, S)
          // in parts (each into its slice of `parts`; the next step's kernel adds them) or into dh
          void* c = splits > 1 ? static_cast<void*>(parts) : static_cast<void*>(p.dh_out);
          const Gemm recurrent = {false, w_transposed, B, S, GS, dzh_t, GS, w.data, w.ld, splits == 1, c, S};
          if (splits > 1) {
            run_gemm_split_k(dtype, recurrent, splits, tf32);
          } else {
            run_gemms(dtype, &recurrent, 1, tf32);
          }
        }
      }
    });
  });
  if (want_state) {
    // step 0 wrote dh[0], and its GEMM the parts where there are some
    at::Tensor dh0 = dh[0];
    if (splits > 1) dh0 = dh_parts.sum(0).add_(dh0);
    grad_state0[0].copy_(dh0);
    for (int k = 1; k < NS; ++k) grad_state0[k].copy_(ds[k - 1]);
  }
}

// A gradient output as a row-major matrix to write into: itself where it is
// one (LLTM's column blocks of grad_weights), else a buffer copied back by
// `finish`.
struct Destination {
  at::Tensor target, buffer;
  int64_t ld;
  void* data() const { return buffer.mutable_data_ptr(); }
  void finish() {
    if (!buffer.is_same(target)) target.copy_(buffer);
  }
};
inline Destination destination(const at::Tensor& t) {
  const bool row_major = t.stride(1) == 1 && (t.size(0) <= 1 || t.stride(0) >= t.size(1));
  if (row_major) return {t, t, t.size(0) <= 1 ? std::max<int64_t>(t.size(1), 1) : t.stride(0)};
  return {t, at::empty(t.sizes(), t.options()), std::max<int64_t>(t.size(1), 1)};
}

// Rows of the weight gradients' K-major copies at a time: their bytes.
constexpr int64_t kKMajorChunkBytes = int64_t(256) << 20;

// TF32's weight gradients from K-major operands (float32; TF32 tensor cores
// read both operands along k): dW_ih (G S, I) = dzx^T x and dW_hh (G S, S) =
// dzh^T h_prev over the T B rows, h_prev being h0's B rows, then output's
// first (T - 1) B. Each chunk of rows is transposed into (., rows) copies
// (cuBLAS's geam) and its products added (928 against 1,576 µs for the
// LLTM's dW at B = 512, S = 1024; docs/benchmarks-history.md section 30).
// dzh may be dzx (one pre-activation); d_ih or d_hh null: not wanted.
// LLTM_TF32_K_MAJOR=N sets the chunks' rows.
inline void weight_grads_k_major(int64_t rows, int64_t B, int64_t GS, int64_t I, int64_t S, const float* dzx,
                                 const float* dzh, const float* x, const RowMajor& h0, const float* output,
                                 const Destination* d_ih, const Destination* d_hh,
                                 const at::TensorOptions& options) {
  const c10::ScalarType f32 = c10::ScalarType::Float;
  const bool split = dzh != dzx && d_hh != nullptr;  // dzh^T copied apart from dzx^T
  const bool copy_dzx = d_ih != nullptr || !split;
  const int64_t row_elems =
      (copy_dzx ? GS : 0) + (split ? GS : 0) + (d_ih != nullptr ? I : 0) + (d_hh != nullptr ? S : 0);
  int64_t chunk =
      std::min(rows, std::max<int64_t>(1, kKMajorChunkBytes / (row_elems * int64_t(sizeof(float)))));
  if (chunk < rows && chunk >= 32) chunk -= chunk % 32;  // 128-byte rows of the copies
  const int64_t forced_rows = k_major_setting();
  if (forced_rows > 0) chunk = std::min(rows, forced_rows);
  at::Tensor buffer = at::empty({row_elems * chunk}, options.dtype(at::kFloat));
  float* next = buffer.mutable_data_ptr<float>();
  auto take = [&](int64_t n) {
    float* p = next;
    next += n;
    return p;
  };
  float* dzx_t = copy_dzx ? take(GS * chunk) : nullptr;
  float* dzh_t = split ? take(GS * chunk) : dzx_t;
  float* x_t = d_ih != nullptr ? take(I * chunk) : nullptr;
  float* h_t = d_hh != nullptr ? take(S * chunk) : nullptr;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t c = std::min(chunk, rows - r0);
    std::vector<Gemm> gemms;
    if (dzx_t != nullptr) transpose(f32, c, GS, dzx + r0 * GS, GS, dzx_t, c);
    if (split) transpose(f32, c, GS, dzh + r0 * GS, GS, dzh_t, c);
    if (d_ih != nullptr) {
      transpose(f32, c, I, x + r0 * I, I, x_t, c);
      gemms.push_back({false, true, GS, I, c, dzx_t, c, x_t, c, r0 > 0, d_ih->data(), d_ih->ld});
    }
    if (d_hh != nullptr) {
      // h_prev's rows r0 .. r0 + c: h0's first, then output's (row r - B)
      const int64_t from_h0 = std::max<int64_t>(0, std::min(r0 + c, B) - r0);
      if (from_h0 > 0) transpose(f32, from_h0, S, h0.data<float>() + r0 * h0.ld, h0.ld, h_t, c);
      if (c > from_h0) {
        transpose(f32, c - from_h0, S, output + (r0 + from_h0 - B) * S, S, h_t + from_h0, c);
      }
      gemms.push_back({false, true, GS, S, c, dzh_t, c, h_t, c, r0 > 0, d_hh->data(), d_hh->ld});
    }
    run_gemms(f32, gemms.data(), static_cast<int>(gemms.size()), true);
  }
}

// The bias gradients (G S,) from the persistent backward's per-row sums
// rows (1 or 2, B, G S) in acc_t: b_ih from set 0; b_hh from set 1 with
// kSplit, else from set 0 too (both biases add to one pre-activation).
inline void bias_grads_from_rows(const at::Tensor& rows, bool split, const at::Tensor& b_ih,
                                 const at::Tensor& b_hh) {
  const int64_t sets = rows.size(0), B = rows.size(1), cols = rows.size(2);
  for (const at::Tensor* t : {&b_ih, &b_hh}) {
    TORCH_INTERNAL_ASSERT(!t->defined() || (t->is_contiguous() && t->numel() == cols),
                          "lltm::fused (CUDA): a bias gradient of ", cols, " contiguous elements");
  }
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kBiasColumns)), static_cast<unsigned>(sets));
  const dim3 block(kBiasColumns, kBiasRowGroups);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, (b_ih.defined() ? b_ih : b_hh).scalar_type(), "lltm_bias_grads", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        BiasSumOuts<scalar_t> outs{};
        outs.to[0][0] = b_ih.defined() ? b_ih.mutable_data_ptr<scalar_t>() : nullptr;
        outs.to[split ? 1 : 0][1] = b_hh.defined() ? b_hh.mutable_data_ptr<scalar_t>() : nullptr;
        bias_sums_kernel<scalar_t, acc_t><<<grid, block, 0, c10::cuda::getCurrentCUDAStream()>>>(
            rows.const_data_ptr<acc_t>(), B, cols, outs);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

template <typename Cell>
void fused_rnn_forward_cuda(const RnnArgs& a, at::Tensor& output, std::vector<at::Tensor>& state_n,
                            at::Tensor& saved) {
  constexpr int G = Cell::kGates, NS = Cell::kStates;
  static_assert(NS <= kMaxStates, "the fused CUDA kernels carry at most kMaxStates states");
  const int64_t T = a.steps(), B = a.batch(), I = a.features(), S = a.hidden();
  if (T == 0 || B == 0) {
    for (int k = 0; k < NS; ++k) state_n[k].copy_(a.state[k]);
    return;
  }
  const at::Tensor x = a.input.contiguous();  // (T, B, I): T*B rows of I
  const RowMajor w_ih = as_row_major(a.w_ih), w_hh = as_row_major(a.w_hh);
  std::vector<RowMajor> state0;
  for (const at::Tensor& s : a.state) state0.push_back(as_row_major(s));
  const at::Tensor b_ih = a.b_ih.defined() ? a.b_ih.contiguous() : at::Tensor();
  const at::Tensor b_hh = a.b_hh.defined() ? a.b_hh.contiguous() : at::Tensor();
  const at::Tensor lengths = a.lengths.defined() ? a.lengths.contiguous() : at::Tensor();
  // zx = x W_ih^T for every t: (T*B, G S) = (T*B, I) (G S, I)^T; the saved
  // values overwrite it in place where the cell saves as many as it has gates.
  at::Tensor zx = Cell::kSaved == G ? saved.view({T, B, G * S}) : at::empty({T, B, G * S}, x.options());
  if (I == 0) {
    zx.zero_();
  } else {
    const Gemm projection = {false,
                             true,
                             T * B,
                             G * S,
                             I,
                             x.const_data_ptr(),
                             I,
                             w_ih.tensor.const_data_ptr(),
                             w_ih.ld,
                             false,
                             zx.mutable_data_ptr(),
                             G * S};
    run_row_gemms(x.scalar_type(), &projection, 1, false);
  }
  RnnArgs args = a;
  args.b_ih = b_ih;
  args.b_hh = b_hh;
  args.lengths = lengths;
  // The time loop over these tensors: the persistent kernel, or the step loop.
  const auto time_loop = [&](const RnnArgs& r, at::Tensor& zx_, at::Tensor& saved_, at::Tensor& output_,
                             std::vector<at::Tensor>& state_n_) {
    if (!rnn_forward_persistent<Cell>(zx_, saved_, w_hh, r.b_ih, r.b_hh, state0, r.lengths, output_,
                                      state_n_)) {
      forward_loop<Cell>(r, w_hh, state0, zx_, output_, state_n_, saved_);
    }
  };
  // The measuring planner's trial: the first steps' projections, outputs of its own (seq_tune.h).
  const TrialFactory make_trial = [&](int64_t steps) -> std::function<void()> {
    RnnArgs r = args;
    r.input = a.input.narrow(0, 0, steps);
    r.lengths = at::Tensor();
    at::Tensor zx_t = zx.narrow(0, 0, steps).clone();
    at::Tensor saved_t = Cell::kSaved == G ? zx_t : at::empty({steps, B, Cell::kSaved * S}, zx.options());
    at::Tensor output_t = at::empty({steps, B, S}, output.options());
    std::vector<at::Tensor> state_n_t;
    for (int k = 0; k < NS; ++k) state_n_t.push_back(at::empty_like(state_n[k]));
    return [=]() mutable { time_loop(r, zx_t, saved_t, output_t, state_n_t); };
  };
  const ModelDecision model = rnn_decision<Cell, false>(T, B, S, x.scalar_type(), x.get_device());
  const PlanOverride use(measured_plan(model.problem, model.decision, x.get_device(), make_trial));
  time_loop(args, zx, saved, output, state_n);
}

template <typename Cell>
void fused_rnn_backward_cuda(const RnnArgs& a, const RnnBackwardArgs& from, RnnGradients& grads) {
  constexpr int G = Cell::kGates, NS = Cell::kStates;
  const int64_t T = a.steps(), B = a.batch(), I = a.features(), S = a.hidden(), GS = G * S;
  const auto options = a.input.options();
  if (T == 0 || B == 0) {
    gradients_of_no_step(from, grads);
    return;
  }
  const c10::ScalarType dtype = a.input.scalar_type();
  const RowMajor w_ih = as_row_major(a.w_ih), w_hh = as_row_major(a.w_hh);
  std::vector<RowMajor> state0;
  for (const at::Tensor& s : a.state) state0.push_back(as_row_major(s));
  RnnArgs args = a;
  args.lengths = a.lengths.defined() ? a.lengths.contiguous() : at::Tensor();
  const at::Tensor saved = from.saved.contiguous();
  const at::Tensor output = from.output.contiguous();
  RnnBackwardArgs b = from;
  b.saved = saved;
  b.output = output;
  b.grad_output = from.grad_output.defined() ? from.grad_output.contiguous() : at::Tensor();
  for (at::Tensor& g : b.grad_state) {
    if (g.defined()) g = g.contiguous();
  }
  const at::Tensor states = recompute_states<Cell>(args, state0, saved);
  at::Tensor dzx = at::empty({T, B, GS}, options);
  at::Tensor dzh = Cell::kSplit ? at::empty({T, B, GS}, options) : at::Tensor();
  std::vector<at::Tensor> grad_state0(NS);
  for (size_t k = 0; k < grads.state.size(); ++k) grad_state0[k] = grads.state[k];
  // The bias gradients' sums over the steps per batch row, where the persistent kernel runs (it adds them as
  // it goes).
  const bool want_bias = grads.b_ih.defined() || grads.b_hh.defined();
  at::Tensor bias_rows =
      want_bias ? at::empty({Cell::kSplit ? 2 : 1, B, GS}, options.dtype(at::toOpMathType(dtype)))
                : at::Tensor();
  bool bias_summed = false;
  // The reverse-time loop over these tensors: the persistent kernel, or the
  // step loop. True where the persistent kernel ran (and wrote bias_rows_).
  const auto time_loop = [&](const RnnArgs& r, const RnnBackwardArgs& from_, const at::Tensor& states_,
                             at::Tensor& dzx_, at::Tensor& dzh_, std::vector<at::Tensor>& grad_state0_,
                             const at::Tensor& bias_rows_) -> bool {
    if (rnn_backward_persistent<Cell>(from_.grad_output, from_.grad_state, w_hh, from_.saved, from_.output,
                                      states_, state0, r.lengths, dzx_, dzh_, grad_state0_, bias_rows_)) {
      return true;
    }
    // the step loop takes the state gradients all or none (grad_state0_'s entries are all defined or all not)
    std::vector<at::Tensor> wanted;
    if (grad_state0_[0].defined()) wanted = grad_state0_;
    backward_loop<Cell>(r, from_, w_hh, state0, states_, from_.saved, from_.output, dzx_, dzh_, wanted);
    return false;
  };
  // The measuring planner's trial: the last steps' values, gradients of its own (seq_tune.h).
  const TrialFactory make_trial = [&](int64_t steps) -> std::function<void()> {
    const int64_t first = T - steps;
    RnnArgs r = args;
    r.input = a.input.narrow(0, first, steps);
    r.lengths = at::Tensor();
    RnnBackwardArgs f = b;
    f.saved = saved.narrow(0, first, steps).contiguous();
    f.output = output.narrow(0, first, steps).contiguous();
    if (f.grad_output.defined()) f.grad_output = f.grad_output.narrow(0, first, steps).contiguous();
    at::Tensor states_t = states.defined() ? states.narrow(1, first, steps).contiguous() : at::Tensor();
    at::Tensor dzx_t = at::empty({steps, B, GS}, options);
    at::Tensor dzh_t = Cell::kSplit ? at::empty({steps, B, GS}, options) : at::Tensor();
    std::vector<at::Tensor> grad_state0_t;
    for (const at::Tensor& g : grad_state0) grad_state0_t.push_back(g.defined() ? at::empty_like(g) : g);
    return [=]() mutable { time_loop(r, f, states_t, dzx_t, dzh_t, grad_state0_t, at::Tensor()); };
  };
  {
    const ModelDecision model = rnn_decision<Cell, true>(T, B, S, dtype, output.get_device());
    const PlanOverride use(measured_plan(model.problem, model.decision, output.get_device(), make_trial));
    bias_summed = time_loop(args, b, states, dzx, dzh, grad_state0, bias_rows);
  }

  const at::Tensor& dz_h = Cell::kSplit ? dzh : dzx;
  const void* dx_all = dzx.const_data_ptr();
  const int64_t elem = a.input.element_size();
  Gemm gemms[4];
  int count = 0;
  std::vector<Destination> outs;
  outs.reserve(3);  // input, W_ih, W_hh at most: pointers into it (the K-major destinations) stay valid
  if (grads.input.defined() && I > 0) {  // (T*B, I) = (T*B, G S) W_ih
    outs.push_back(destination(grads.input.view({T * B, I})));
    gemms[count++] = {false,
                      false,
                      T * B,
                      I,
                      GS,
                      dx_all,
                      GS,
                      w_ih.tensor.const_data_ptr(),
                      w_ih.ld,
                      false,
                      outs.back().data(),
                      outs.back().ld};
  }
  at::Tensor x;
  const bool want_w_ih = grads.w_ih.defined() && I > 0;
  if (want_w_ih) x = a.input.contiguous();
  // Large TF32 weight gradients from K-major copies (their destinations
  // finished with the others below).
  const bool k_major = k_major_tf32(dtype, GS * std::max(I, S) * T * B, kKMajorWeightMacs);
  if (k_major && (want_w_ih || grads.w_hh.defined())) {
    const Destination* d_ih = want_w_ih ? &outs.emplace_back(destination(grads.w_ih)) : nullptr;
    const Destination* d_hh = grads.w_hh.defined() ? &outs.emplace_back(destination(grads.w_hh)) : nullptr;
    weight_grads_k_major(T * B, B, GS, I, S, dzx.const_data_ptr<float>(), dz_h.const_data_ptr<float>(),
                         want_w_ih ? x.const_data_ptr<float>() : nullptr, state0[0],
                         output.const_data_ptr<float>(), d_ih, d_hh, options);
  }
  if (want_w_ih && !k_major) {  // (G S, I) = dzx^T (G S, T*B) x (T*B, I)
    outs.push_back(destination(grads.w_ih));
    gemms[count++] = {
        true,          false, GS, I, T * B, dx_all, GS, x.const_data_ptr(), I, false, outs.back().data(),
        outs.back().ld};
  }
  if (grads.w_hh.defined() && !k_major) {
    // (G S, S) = dzh_0^T h0 + dzh_{1:}^T output_{:-1}
    outs.push_back(destination(grads.w_hh));
    Destination& d = outs.back();
    gemms[count++] = {
        true,         false, GS,       S,   B, dz_h.const_data_ptr(), GS, state0[0].tensor.const_data_ptr(),
        state0[0].ld, false, d.data(), d.ld};
    if (T > 1) {
      gemms[count++] = {true,        false,
                        GS,          S,
                        (T - 1) * B, static_cast<const char*>(dz_h.const_data_ptr()) + B * GS * elem,
                        GS,          output.const_data_ptr(),
                        S,           true,
                        d.data(),    d.ld};
    }
  }
  run_row_gemms(dtype, gemms, count, true);
  for (Destination& d : outs) d.finish();
  // Column sums in float for half and bfloat16: of the persistent kernel's
  // B rows of sums over the steps (one launch for both biases), else of
  // dzx / dzh's T*B rows (ATen's reduction). No bias gradient asked: no
  // rows were summed (bias_rows is undefined) and nothing is written.
  if (!want_bias) return;
  if (bias_summed) {
    bias_grads_from_rows(bias_rows, Cell::kSplit, grads.b_ih, grads.b_hh);
  } else {
    if (grads.b_ih.defined()) at::sum_out(grads.b_ih, dzx.view({T * B, GS}), {0});
    if (grads.b_hh.defined()) {
      // Without kSplit both biases add to one pre-activation: their gradients are the same sums.
      if (!Cell::kSplit && grads.b_ih.defined()) {
        grads.b_hh.copy_(grads.b_ih);
      } else {
        at::sum_out(grads.b_hh, dz_h.view({T * B, GS}), {0});
      }
    }
  }
}

}  // namespace cuda_detail

// The fused CUDA backend as rnn_ops.h takes it: the input's device selected while the layer runs.
struct FusedCuda {
  static constexpr const char* kName = "fused";
  static c10::cuda::CUDAGuard guard(const char* op, const at::Tensor& input) {
    return cuda_detail::cuda_guard(op, input);
  }
  template <typename Cell>
  static void forward(const RnnArgs& a, at::Tensor& output, std::vector<at::Tensor>& state_n,
                      at::Tensor& saved) {
    cuda_detail::fused_rnn_forward_cuda<Cell>(a, output, state_n, saved);
  }
  template <typename Cell>
  static void backward(const RnnArgs& a, const RnnBackwardArgs& from, RnnGradients& grads) {
    cuda_detail::fused_rnn_backward_cuda<Cell>(a, from, grads);
  }
};

}  // namespace lltm
