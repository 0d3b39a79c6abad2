// Forward of the fused CUDA backend: lltm::fused_cell_forward on CUDA.
//
// Small steps: one kernel (tiled GEMM over [old_h | input] read through two
// pointers, with the cell as its epilogue).
// Larger steps: X = [old_h | input] (one copy kernel), gates = X W^T (one
// cuBLAS GEMM into the gates output), then one pointwise pass that adds the
// bias, applies the activations in place and writes new_cell and new_h. The
// copy moves 2 B (S + I) elements; the alternative, two GEMMs over the two
// column blocks of W accumulating into gates, re-reads and re-writes
// B x 3S and costs a second cuBLAS call (more bytes and more host time).
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "../lltm.h"
#include "../precision.h"
#include "blas.h"
#include "guard.h"
#include "launch_utils.h"
#include "pointwise.cuh"
#include "small_cell.cuh"

namespace lltm {

using namespace cuda_detail;

namespace {

constexpr const char* kOp = "lltm::fused_cell_forward";

template <typename scalar_t, int V>
void launch_forward_pointwise(at::Tensor& gates, const scalar_t* bias, const at::Tensor& old_cell,
                              at::Tensor& new_h, at::Tensor& new_cell, cudaStream_t stream) {
  const int64_t batch = new_h.size(0), state = new_h.size(1);
  const int64_t packs = batch * state / V;
  const int64_t wanted = ceil_div(packs, kForwardPointwiseThreads);
  const int64_t cap = int64_t(sm_count(gates.get_device())) * 16;
  cell_forward_pointwise_kernel<scalar_t, V>
      <<<grid_size(std::min(wanted, cap)), kForwardPointwiseThreads, 0, stream>>>(
          gates.mutable_data_ptr<scalar_t>(), bias, old_cell.const_data_ptr<scalar_t>(), old_cell.stride(0),
          old_cell.stride(1), packs_load_as_vectors(old_cell, V), new_h.mutable_data_ptr<scalar_t>(),
          new_cell.mutable_data_ptr<scalar_t>(), state, packs);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t, int V>
void launch_concat(const RowMajor& h, const RowMajor& x, at::Tensor& X, int64_t state, int64_t features,
                   cudaStream_t stream) {
  const int64_t packs = X.size(0) * (state + features) / V;
  const int64_t wanted = ceil_div(packs, kForwardPointwiseThreads);
  const int64_t cap = int64_t(sm_count(X.get_device())) * 16;
  concat_kernel<scalar_t, V><<<grid_size(std::min(wanted, cap)), kForwardPointwiseThreads, 0, stream>>>(
      h.data<scalar_t>(), h.ld, x.data<scalar_t>(), x.ld, X.mutable_data_ptr<scalar_t>(), state, features,
      packs);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

CellForwardResult fused_cell_forward_cuda(const at::Tensor& input, const at::Tensor& weights,
                                          const std::optional<at::Tensor>& bias, const at::Tensor& old_h,
                                          const at::Tensor& old_cell) {
  check_cell_forward_args(kOp, input, weights, bias, old_h, old_cell);
  const auto device_guard = cuda_guard(kOp, input);

  const int64_t batch = input.size(0);
  const int64_t features = input.size(1);
  const int64_t state = old_h.size(1);
  const auto options = input.options();
  at::Tensor new_h = at::empty({batch, state}, options);
  at::Tensor new_cell = at::empty({batch, state}, options);
  at::Tensor gates = at::empty({batch, 3 * state}, options);
  if (batch == 0 || state == 0) return {new_h, new_cell, gates};

  const RowMajor x = as_row_major(input);
  const RowMajor h = as_row_major(old_h);
  const RowMajor w = as_row_major(weights);
  const bool has_bias = bias.has_value() && bias->defined();
  at::Tensor b;
  if (has_bias) {
    b = bias->contiguous();
    if (!is_aligned(b.const_data_ptr(), 16)) b = b.clone();  // vector loads
  }
  const int64_t K = state + features;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  if (choose_path(batch * 3 * state * K) == Path::kSmall) {
    const int64_t state_tiles = ceil_div(state, kFwdStateCols);
    const int64_t blocks = ceil_div(batch, ForwardTile::BM) * state_tiles;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "lltm_fused_forward", [&] {
      cell_forward_small_kernel<scalar_t><<<grid_size(blocks), small_kernel_threads<scalar_t>(), 0, stream>>>(
          h.data<scalar_t>(), h.ld, x.data<scalar_t>(), x.ld, w.data<scalar_t>(), w.ld,
          has_bias ? b.const_data_ptr<scalar_t>() : nullptr, old_cell.const_data_ptr<scalar_t>(),
          old_cell.stride(0), old_cell.stride(1), new_h.mutable_data_ptr<scalar_t>(),
          new_cell.mutable_data_ptr<scalar_t>(), gates.mutable_data_ptr<scalar_t>(), batch, state, features,
          state_tiles);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    return {new_h, new_cell, gates};
  }

  // X = [old_h | input]; gates = X W^T
  at::Tensor X;
  int64_t ld_X = K;
  if (features == 0) {
    X = h.tensor;
    ld_X = h.ld;
  } else {
    X = at::empty({batch, K}, options);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "lltm_fused_forward", [&] {
      constexpr int kVec = 16 / sizeof(scalar_t);
      const bool vec = state % kVec == 0 && features % kVec == 0 && h.ld % kVec == 0 && x.ld % kVec == 0 &&
                       is_aligned(h.tensor.const_data_ptr(), 16) && is_aligned(x.tensor.const_data_ptr(), 16);
      if (vec) {
        launch_concat<scalar_t, kVec>(h, x, X, state, features, stream);
      } else {
        launch_concat<scalar_t, 1>(h, x, X, state, features, stream);
      }
    });
  }
  const Gemm gemm = {false,
                     true,
                     batch,
                     3 * state,
                     K,
                     X.const_data_ptr(),
                     ld_X,
                     w.tensor.const_data_ptr(),
                     w.ld,
                     false,
                     gates.mutable_data_ptr(),
                     3 * state};
  run_gemms(input.scalar_type(), &gemm, 1, tf32_products(false));

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "lltm_fused_forward", [&] {
    constexpr int kVec = 16 / sizeof(scalar_t);
    const scalar_t* bias_ptr = has_bias ? b.const_data_ptr<scalar_t>() : nullptr;
    // Our own outputs are fresh allocations: aligned whenever S % V == 0.
    if (state % kVec == 0) {
      launch_forward_pointwise<scalar_t, kVec>(gates, bias_ptr, old_cell, new_h, new_cell, stream);
    } else {
      launch_forward_pointwise<scalar_t, 1>(gates, bias_ptr, old_cell, new_h, new_cell, stream);
    }
  });
  return {new_h, new_cell, gates};
}

}  // namespace lltm
