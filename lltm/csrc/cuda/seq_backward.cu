// Backward of the fused CUDA sequence operator: lltm::fused_seq_backward.
//
// Reverse-time loop, as the planner (seq_plan.h) chooses: one launch of a
// persistent kernel (seq_persistent.cu), or per step one pointwise kernel
// (d_pre_t from the carried dh and dc, dc updated in place) and one cuBLAS
// GEMM d h_{t-1} = d_pre_t W_h, replayed from a CUDA graph where the call
// repeats (seq_graph.h).
// After the loop, over all T*B rows at once:
//   grad_input           = d_pre W_x                    (one GEMM)
//   grad_weights[:, S:]  = d_pre^T x                    (one GEMM)
//   grad_weights[:, :S]  = d_pre_0^T h0 + d_pre_{1:}^T output_{:-1}
//                                                       (two GEMMs, h_{t-1}
//                          is the previous output on every row whose d_pre
//                          is not 0)
//   grad_bias            = column sums of d_pre          (one reduction)
// No atomics: every gradient element is written by one GEMM or reduction.
#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "../lltm.h"
#include "blas.h"
#include "guard.h"
#include "launch_utils.h"
#include "seq_graph.h"
#include "seq_persistent.h"
#include "seq_pointwise.cuh"

namespace lltm {

using namespace cuda_detail;

namespace {

constexpr const char* kOp = "lltm::fused_seq_backward";

bool has(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// The reverse-time loop over cuBLAS: d_pre, and grad_h0 / grad_c0 where
// wanted.
void step_loop(const std::optional<at::Tensor>& grad_h_n, const std::optional<at::Tensor>& grad_c_n,
               const at::Tensor& g_out, const at::Tensor& cell_states, const at::Tensor& act,
               const at::Tensor& lens, const RowMajor& w, at::Tensor& d_pre, at::Tensor& grad_h0,
               at::Tensor& grad_c0, bool want_h0, bool want_c0) {
  const int64_t steps = d_pre.size(0), batch = d_pre.size(1), S3 = d_pre.size(2), state = S3 / 3;
  const auto options = d_pre.options();
  const c10::ScalarType dtype = d_pre.scalar_type();
  const bool masked = lens.defined();
  const char* w_ptr = static_cast<const char*>(w.tensor.const_data_ptr());
  // Carried gradients: dh in two (B, S) buffers written in turn (the GEMM
  // reads one and writes the other), dc in float for half and bfloat16.
  at::Tensor dh = at::empty({2, batch, state}, options);
  if (has(grad_h_n)) {
    dh[steps % 2].copy_(*grad_h_n);
  } else {
    dh[steps % 2].zero_();
  }
  at::Tensor dc = has(grad_c_n)
                      ? grad_c_n->to(options.dtype(at::toOpMathType(dtype)),
                                     /*non_blocking=*/false, /*copy=*/true, at::MemoryFormat::Contiguous)
                      : at::zeros({batch, state}, options.dtype(at::toOpMathType(dtype)));
  const int64_t n = batch * state;
  const unsigned int blocks = pointwise_blocks(n, d_pre.get_device());

  // Buffer roles: step t reads dh[(t + 1) % 2] (the gradient of h_t carried
  // from step t + 1) and writes d h_{t-1} into dh[t % 2]; so step T - 1
  // reads dh[T % 2], where grad_h_n was put above. The launches are
  // replayed from a CUDA graph where the same call repeats (seq_graph.h).
  GraphKey key = {1,       static_cast<int64_t>(dtype),          steps, batch, state, w.ld,
                  want_h0, at::globalContext().allowTF32CuBLAS()};
  for (const void* p :
       {static_cast<const void*>(dh.const_data_ptr()), g_out.defined() ? g_out.const_data_ptr() : nullptr,
        dc.const_data_ptr(), cell_states.const_data_ptr(), act.const_data_ptr(),
        masked ? lens.const_data_ptr() : nullptr, d_pre.const_data_ptr(), static_cast<const void*>(w_ptr)}) {
    key_add(key, p);
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "lltm_fused_seq_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    run_graphed(std::move(key), [&] {
      const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
      scalar_t* dh_base = dh.mutable_data_ptr<scalar_t>();
      for (int64_t t = steps - 1; t >= 0; --t) {
        const scalar_t* dh_in = dh_base + ((t + 1) % 2) * n;
        scalar_t* dh_out = dh_base + (t % 2) * n;
        scalar_t* dp = d_pre.mutable_data_ptr<scalar_t>() + t * batch * S3;
        seq_backward_step_kernel<scalar_t><<<blocks, kSeqPointwiseThreads, 0, stream>>>(
            dh_in, g_out.defined() ? g_out.const_data_ptr<scalar_t>() + t * n : nullptr,
            dc.mutable_data_ptr<acc_t>(), cell_states.const_data_ptr<scalar_t>() + t * n,
            act.const_data_ptr<scalar_t>() + t * batch * S3,
            masked ? lens.const_data_ptr<int64_t>() : nullptr, t, dp, masked ? dh_out : nullptr, batch,
            state);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        if (t > 0 || want_h0) {
          // d h_{t-1} (+)= d_pre_t W_h: (B, S) = (B, 3S) (3S, S); with
          // lengths it adds to the carried gh of rows past their length.
          const Gemm recurrent = {false, false, batch, state, S3, dp, S3, w_ptr, w.ld, masked, dh_out, state};
          run_gemms(dtype, &recurrent, 1);
        }
      }
    });
  });
  if (want_h0) grad_h0.copy_(dh[0]);  // step 0 wrote dh[0]
  if (want_c0) grad_c0.copy_(dc);
}

}  // namespace

at::Tensor seq_cells_cuda(const at::Tensor& c0, const at::Tensor& gates) {
  const c10::cuda::CUDAGuard device_guard(gates.device());
  const int64_t steps = gates.size(0), batch = gates.size(1), state = gates.size(2) / 3;
  at::Tensor cells = at::empty({steps, batch, state}, gates.options());
  if (cells.numel() == 0) return cells;
  const at::Tensor g = gates.contiguous();
  const RowMajor c_init = as_row_major(c0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "lltm_seq_cells", [&] {
    seq_cells_kernel<scalar_t><<<pointwise_blocks(batch * state, g.get_device()), kSeqPointwiseThreads, 0,
                                 c10::cuda::getCurrentCUDAStream()>>>(
        g.const_data_ptr<scalar_t>(), c_init.data<scalar_t>(), c_init.ld, cells.mutable_data_ptr<scalar_t>(),
        steps, batch, state);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return cells;
}

SeqBackwardResult fused_seq_backward_cuda(const std::optional<at::Tensor>& grad_output,
                                          const std::optional<at::Tensor>& grad_h_n,
                                          const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input,
                                          const at::Tensor& weights, const at::Tensor& h0,
                                          const at::Tensor& c0, const at::Tensor& output,
                                          const at::Tensor& gates, const std::optional<at::Tensor>& lengths,
                                          OutputMask output_mask) {
  check_seq_backward_args(kOp, grad_output, grad_h_n, grad_c_n, input, weights, h0, c0, output, gates,
                          lengths);
  const auto device_guard = cuda_guard(kOp, input);

  const int64_t steps = input.size(0), batch = input.size(1), features = input.size(2),
                state = weights.size(0) / 3;
  const int64_t K = state + features, S3 = 3 * state;
  const auto options = input.options();
  const AskedGradients asked(output_mask, options);
  const bool want_input = asked.input, want_weights = asked.weights, want_bias = asked.bias,
             want_h0 = asked.h, want_c0 = asked.c;
  at::Tensor grad_input = asked.allocate(want_input, {steps, batch, features});
  at::Tensor grad_weights = asked.allocate(want_weights, {S3, K});
  at::Tensor grad_bias = asked.allocate(want_bias, {S3});
  at::Tensor grad_h0 = asked.allocate(want_h0, {batch, state});
  at::Tensor grad_c0 = asked.allocate(want_c0, {batch, state});
  auto result = [&]() -> SeqBackwardResult {
    return {grad_input, grad_weights, grad_bias, grad_h0, grad_c0};
  };
  if (!asked.any()) return result();
  if (steps == 0 || batch == 0 || state == 0) {
    // No step ran: the state's gradients pass through, the rest are sums
    // over nothing.
    for (at::Tensor* t : {&grad_input, &grad_weights, &grad_bias}) {
      if (t->numel() > 0) t->zero_();
    }
    if (want_h0) {
      if (has(grad_h_n))
        grad_h0.copy_(*grad_h_n);
      else
        grad_h0.zero_();
    }
    if (want_c0) {
      if (has(grad_c_n))
        grad_c0.copy_(*grad_c_n);
      else
        grad_c0.zero_();
    }
    return result();
  }

  const c10::ScalarType dtype = input.scalar_type();
  const at::Tensor act = gates.contiguous();
  // The cell states, recomputed from c0 and the gates (not saved by forward).
  const at::Tensor cell_states = seq_cells(c0, act);
  const at::Tensor out = output.contiguous();
  const at::Tensor g_out = has(grad_output) ? grad_output->contiguous() : at::Tensor();
  const at::Tensor lens = has(lengths) ? lengths->contiguous() : at::Tensor();
  const RowMajor w = as_row_major(weights);
  const int64_t elem = input.element_size();
  const char* w_ptr = static_cast<const char*>(w.tensor.const_data_ptr());

  at::Tensor d_pre = at::empty({steps, batch, S3}, options);
  const bool persistent = seq_backward_persistent(
      g_out, has(grad_h_n) ? grad_h_n->contiguous() : at::Tensor(),
      has(grad_c_n) ? grad_c_n->contiguous() : at::Tensor(), w, cell_states, act, lens, d_pre,
      want_h0 ? grad_h0 : at::Tensor(), want_c0 ? grad_c0 : at::Tensor());
  if (!persistent) {
    step_loop(grad_h_n, grad_c_n, g_out, cell_states, act, lens, w, d_pre, grad_h0, grad_c0, want_h0,
              want_c0);
  }

  const void* d_all = d_pre.const_data_ptr();
  const at::Tensor x = want_weights ? input.contiguous() : at::Tensor();
  const RowMajor h_first = as_row_major(h0);
  char* gw = want_weights ? static_cast<char*>(grad_weights.mutable_data_ptr()) : nullptr;
  Gemm gemms[4];
  int count = 0;
  if (want_input && features > 0) {  // (T*B, I) = (T*B, 3S) W[:, S:]
    gemms[count++] = {false,
                      false,
                      steps * batch,
                      features,
                      S3,
                      d_all,
                      S3,
                      w_ptr + state * elem,
                      w.ld,
                      false,
                      grad_input.mutable_data_ptr(),
                      features};
  }
  if (want_weights && features > 0) {
    // [:, S:] (3S, I) = d_pre^T (3S, T*B) x (T*B, I)
    gemms[count++] = {true,
                      false,
                      S3,
                      features,
                      steps * batch,
                      d_all,
                      S3,
                      x.const_data_ptr(),
                      features,
                      false,
                      gw + state * elem,
                      K};
  }
  if (want_weights) {
    // [:, :S] (3S, S) = d_pre_0^T h0 + d_pre_{1:}^T output_{:-1}
    gemms[count++] = {true,       false, S3, state, batch, d_all, S3, h_first.tensor.const_data_ptr(),
                      h_first.ld, false, gw, K};
    if (steps > 1) {
      gemms[count++] = {true,
                        false,
                        S3,
                        state,
                        (steps - 1) * batch,
                        static_cast<const char*>(d_all) + batch * S3 * elem,
                        S3,
                        out.const_data_ptr(),
                        state,
                        true,
                        gw,
                        K};
    }
  }
  run_gemms(dtype, gemms, count);
  if (want_bias) {
    // Column sums in float for half and bfloat16 (ATen's reduction).
    at::sum_out(grad_bias, d_pre.view({steps * batch, S3}), {0});
  }
  return result();
}

}  // namespace lltm
