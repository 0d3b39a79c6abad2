// Forward of the fused CUDA sequence operator: lltm::fused_seq_forward.
//
// The input projection of all T steps is one cuBLAS GEMM over T*B rows,
// written into the gates buffer. Then the time loop, as the planner
// (seq_plan.h) chooses: one launch of a persistent kernel
// (seq_persistent.cu), or the step loop: per step one GEMM that adds
// h_{t-1} W_h^T into gates[t] and one pointwise kernel (bias, activations,
// cell update, tanh, the length mask) that writes gates[t], c_t and
// output[t], replayed from a CUDA graph where the call repeats
// (seq_graph.h). Either way the host only queues asynchronous launches on
// the current stream: no synchronisation, capturable in a CUDA graph.
#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
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

constexpr const char* kOp = "lltm::fused_seq_forward";

}  // namespace

SeqForwardResult fused_seq_forward_cuda(const at::Tensor& input, const at::Tensor& weights,
                                        const std::optional<at::Tensor>& bias, const at::Tensor& h0,
                                        const at::Tensor& c0, const std::optional<at::Tensor>& lengths) {
  check_seq_forward_args(kOp, input, weights, bias, h0, c0, lengths);
  const auto device_guard = cuda_guard(kOp, input);

  const int64_t steps = input.size(0), batch = input.size(1), features = input.size(2),
                state = weights.size(0) / 3;
  const auto options = input.options();
  at::Tensor output = at::empty({steps, batch, state}, options);
  at::Tensor gates = at::empty({steps, batch, 3 * state}, options);
  at::Tensor h_n = at::empty({batch, state}, options);
  at::Tensor c_n = at::empty({batch, state}, options);
  if (steps == 0 || batch == 0 || state == 0) {
    h_n.copy_(h0);
    c_n.copy_(c0);
    return {output, h_n, c_n, gates};
  }

  const at::Tensor x = input.contiguous();  // (T, B, I): T*B rows of I
  const RowMajor w = as_row_major(weights);
  const RowMajor h_init = as_row_major(h0);
  const RowMajor c_init = as_row_major(c0);
  const bool has_bias = bias.has_value() && bias->defined();
  const at::Tensor b = has_bias ? bias->contiguous() : at::Tensor();
  const bool masked = lengths.has_value() && lengths->defined();
  const at::Tensor lens = masked ? lengths->contiguous() : at::Tensor();
  // With lengths the carried h differs from the output (0 past a row's
  // length): two (B, S) buffers, written in turn.
  at::Tensor h_buf;
  if (masked) h_buf = at::empty({2, batch, state}, options);

  const int64_t elem = input.element_size();
  const char* w_ptr = static_cast<const char*>(w.tensor.const_data_ptr());
  const int64_t S3 = 3 * state;
  const c10::ScalarType dtype = input.scalar_type();
  const unsigned int blocks = pointwise_blocks(batch * state, input.get_device());

  // gates[t] = x_t W_x^T for every t: (T*B, 3S) = (T*B, I) (3S, I)^T
  if (features == 0) {
    gates.zero_();
  } else {
    const Gemm projection = {false,
                             true,
                             steps * batch,
                             S3,
                             features,
                             x.const_data_ptr(),
                             features,
                             w_ptr + state * elem,
                             w.ld,
                             false,
                             gates.mutable_data_ptr(),
                             S3};
    run_gemms(dtype, &projection, 1);
  }
  if (seq_forward_persistent(gates, w, b, h_init, c_init, lens, output, h_n, c_n)) {
    return {output, h_n, c_n, gates};
  }
  // c_t in two (B, S) buffers written in turn (backward recomputes the cell
  // states, so they are not kept).
  at::Tensor c_buf = at::empty({2, batch, state}, options);

  // The step loop's launches, replayed from a CUDA graph where the same
  // call repeats (seq_graph.h): the key holds every value they bake in.
  GraphKey key = {0,         static_cast<int64_t>(dtype),          steps, batch, state, w.ld, h_init.ld,
                  c_init.ld, at::globalContext().allowTF32CuBLAS()};
  for (const void* p :
       {static_cast<const void*>(gates.const_data_ptr()), static_cast<const void*>(w_ptr),
        h_init.tensor.const_data_ptr(), c_init.tensor.const_data_ptr(),
        has_bias ? b.const_data_ptr() : nullptr, masked ? lens.const_data_ptr() : nullptr,
        output.const_data_ptr(), c_buf.const_data_ptr(), masked ? h_buf.const_data_ptr() : nullptr}) {
    key_add(key, p);
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "lltm_fused_seq_forward", [&] {
    run_graphed(std::move(key), [&] {
      const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
      const scalar_t* h_prev = h_init.data<scalar_t>();
      int64_t h_ld = h_init.ld;
      const scalar_t* c_prev = c_init.data<scalar_t>();
      int64_t c_ld = c_init.ld;
      for (int64_t t = 0; t < steps; ++t) {
        scalar_t* g = gates.mutable_data_ptr<scalar_t>() + t * batch * S3;
        // gates[t] += h_{t-1} W_h^T: (B, 3S) = (B, S) (3S, S)^T
        const Gemm recurrent = {false, true, batch, S3, state, h_prev, h_ld, w_ptr, w.ld, true, g, S3};
        run_gemms(dtype, &recurrent, 1);
        scalar_t* out_t = output.mutable_data_ptr<scalar_t>() + t * batch * state;
        scalar_t* c_t = c_buf.mutable_data_ptr<scalar_t>() + (t % 2) * batch * state;
        scalar_t* h_next = masked ? h_buf.mutable_data_ptr<scalar_t>() + (t % 2) * batch * state : nullptr;
        seq_forward_step_kernel<scalar_t><<<blocks, kSeqPointwiseThreads, 0, stream>>>(
            g, has_bias ? b.const_data_ptr<scalar_t>() : nullptr, c_prev, c_ld, h_prev, h_ld,
            masked ? lens.const_data_ptr<int64_t>() : nullptr, t, out_t, c_t, h_next, batch, state);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        h_prev = masked ? h_next : out_t;
        h_ld = state;
        c_prev = c_t;
        c_ld = state;
      }
    });
  });
  // The final state: the last carried h (the last output without lengths)
  // and the last c (carried past each row's length).
  h_n.copy_(masked ? h_buf[(steps - 1) % 2] : output[steps - 1]);
  c_n.copy_(c_buf[(steps - 1) % 2]);
  return {output, h_n, c_n, gates};
}

}  // namespace lltm
