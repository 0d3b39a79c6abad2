// The fused CUDA sequence operators of the built-in cells (cells/registry.h):
// lltm::fused_<cell>_seq_forward / _backward (rnn.h) and LLTM's own
// lltm::fused_seq_forward / _backward (lltm.h), which pass views of the
// LLTM's (3S, S + I) weights as W_hh and W_ih. The layer code, a template
// over the cell, and how it runs are in rnn_cuda.cuh.
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <type_traits>

#include "../lltm.h"
#include "../rnn_ops.h"
#include "rnn_cuda.cuh"

namespace lltm {

using namespace cuda_detail;

SeqForwardResult fused_seq_forward_cuda(const at::Tensor& input, const at::Tensor& weights,
                                        const std::optional<at::Tensor>& bias, const at::Tensor& h0,
                                        const at::Tensor& c0, const std::optional<at::Tensor>& lengths) {
  return lltm_seq_forward_op<FusedCuda>(input, weights, bias, h0, c0, lengths);
}

SeqBackwardResult fused_seq_backward_cuda(const std::optional<at::Tensor>& grad_output,
                                          const std::optional<at::Tensor>& grad_h_n,
                                          const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input,
                                          const at::Tensor& weights, const at::Tensor& h0,
                                          const at::Tensor& c0, const at::Tensor& output,
                                          const at::Tensor& gates, const std::optional<at::Tensor>& lengths,
                                          OutputMask output_mask) {
  return lltm_seq_backward_op<FusedCuda>(grad_output, grad_h_n, grad_c_n, input, weights, h0, c0, output,
                                         gates, lengths, output_mask);
}

at::Tensor seq_cells_cuda(const at::Tensor& c0, const at::Tensor& gates) {
  const c10::cuda::CUDAGuard device_guard(gates.device());
  const int64_t T = gates.size(0), B = gates.size(1), S = gates.size(2) / 3;
  if (T * B * S == 0) return at::empty({T, B, S}, gates.options());
  RnnArgs a;
  a.input = at::empty({T, B, 0}, gates.options());
  a.w_hh = at::empty({3 * S, S}, gates.options());
  const std::vector<RowMajor> state0 = {as_row_major(c0), as_row_major(c0)};
  return recompute_states<cells::LLTM>(a, state0, gates.contiguous())[0];
}

}  // namespace lltm

TORCH_LIBRARY_IMPL(lltm, CUDA, m) {
  lltm::cells::for_each_cell([&](auto cell) {
    using Cell = decltype(cell);
    if constexpr (!std::is_same_v<Cell, lltm::cells::LLTM>) {
      lltm::register_rnn_ops<lltm::FusedCuda, Cell>(m);
    }
  });
}
