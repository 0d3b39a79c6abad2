// Backward of the fused CUDA backend: lltm::fused_cell_backward on CUDA.
//
// 1. One pointwise pass over the gates: d_pre (B, 3S), grad_old_cell, and
//    grad_bias as column sums reduced inside the same kernel (plus a tiny
//    column_sum_kernel when the batch is split over several row chunks).
// 2. The GEMMs, only those whose gradient is asked for (output_mask):
//      grad_old_h  = d_pre W[:, :S]      grad_weights[:, :S] = d_pre^T old_h
//      grad_input  = d_pre W[:, S:]      grad_weights[:, S:] = d_pre^T input
//    as one tiled kernel for small steps, or cuBLAS writing straight into the
//    outputs (column blocks through the leading dimension, no split copies).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
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

constexpr const char* kOp = "lltm::fused_cell_backward";

// Batches of up to this many rows are reduced by one block row, so
// grad_bias is written by the pointwise kernel itself (one launch).
constexpr int64_t kSingleChunkRows = 128;

struct BackwardOutputs {
  at::Tensor grad_input, grad_weights, grad_bias, grad_old_h, grad_old_cell;
};

template <typename scalar_t, int V>
void launch_backward_pointwise(const at::Tensor& grad_h, const at::Tensor& grad_cell,
                               const at::Tensor& new_cell, const at::Tensor& gates, at::Tensor* d_pre,
                               BackwardOutputs& out, bool want_bias, bool want_old_cell,
                               cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t batch = new_cell.size(0), state = new_cell.size(1);
  const int64_t col_chunks = ceil_div(state / V, kBackwardCols);
  TORCH_CHECK(col_chunks <= 65535, kOp, ": state_size ", state,
              " is too large for the gradient kernel's grid");
  int64_t chunks = 1, rows_per_chunk = batch;
  if (batch > kSingleChunkRows) {
    // About 8 blocks of 256 threads per multiprocessor in flight.
    const int64_t target = std::max<int64_t>(1, 8 * int64_t(sm_count(gates.get_device())) / col_chunks);
    chunks = std::min(target, ceil_div(batch, kBackwardRows));
    rows_per_chunk = ceil_div(ceil_div(batch, chunks), kBackwardRows) * kBackwardRows;
    chunks = ceil_div(batch, rows_per_chunk);
  }
  at::Tensor partial;
  if (want_bias && chunks > 1) {
    partial = at::empty({chunks, 3 * state}, gates.options().dtype(at::toOpMathType(gates.scalar_type())));
  }
  const dim3 grid(grid_size(chunks), static_cast<unsigned int>(col_chunks));
  const dim3 block(kBackwardCols, kBackwardRows);
  cell_backward_pointwise_kernel<scalar_t, V><<<grid, block, 0, stream>>>(
      grad_h.const_data_ptr<scalar_t>(), grad_h.stride(0), grad_h.stride(1), packs_load_as_vectors(grad_h, V),
      grad_cell.const_data_ptr<scalar_t>(), grad_cell.stride(0), grad_cell.stride(1),
      packs_load_as_vectors(grad_cell, V), new_cell.const_data_ptr<scalar_t>(),
      gates.const_data_ptr<scalar_t>(), d_pre != nullptr ? d_pre->mutable_data_ptr<scalar_t>() : nullptr,
      want_old_cell ? out.grad_old_cell.mutable_data_ptr<scalar_t>() : nullptr,
      partial.defined() ? partial.mutable_data_ptr<acc_t>() : nullptr,
      want_bias ? out.grad_bias.mutable_data_ptr<scalar_t>() : nullptr, batch, state, rows_per_chunk);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (partial.defined()) {
    const int64_t n = 3 * state;
    column_sum_kernel<scalar_t><<<grid_size(ceil_div(n, kSumCols)), dim3(kSumCols, kSumRows), 0, stream>>>(
        partial.const_data_ptr<acc_t>(), chunks, n, out.grad_bias.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

}  // namespace

CellBackwardResult fused_cell_backward_cuda(const at::Tensor& grad_h, const at::Tensor& grad_cell,
                                            const at::Tensor& new_cell, const at::Tensor& gates,
                                            const at::Tensor& input, const at::Tensor& weights,
                                            const at::Tensor& old_h, OutputMask output_mask) {
  check_cell_backward_args(kOp, grad_h, grad_cell, new_cell, gates, input, weights, old_h);
  const auto device_guard = cuda_guard(kOp, input);

  const int64_t batch = input.size(0);
  const int64_t features = input.size(1);
  const int64_t state = old_h.size(1);
  const int64_t K = state + features;
  const auto options = input.options();
  const AskedGradients asked(output_mask, options);
  const bool want_input = asked.input, want_weights = asked.weights, want_bias = asked.bias,
             want_old_h = asked.h, want_old_cell = asked.c;
  BackwardOutputs out{asked.allocate(want_input, {batch, features}),
                      asked.allocate(want_weights, {3 * state, K}), asked.allocate(want_bias, {3 * state}),
                      asked.allocate(want_old_h, {batch, state}),
                      asked.allocate(want_old_cell, {batch, state})};
  auto result = [&]() -> CellBackwardResult {
    return {out.grad_input, out.grad_weights, out.grad_bias, out.grad_old_h, out.grad_old_cell};
  };
  const bool need_d_pre = want_input || want_weights || want_old_h;
  if (!(need_d_pre || want_bias || want_old_cell)) return result();
  if (batch == 0 || state == 0) {
    // Sums over no rows or no gate columns: every non-empty gradient is 0.
    for (at::Tensor* t :
         {&out.grad_input, &out.grad_weights, &out.grad_bias, &out.grad_old_h, &out.grad_old_cell}) {
      if (t->numel() > 0) t->zero_();
    }
    return result();
  }

  const at::Tensor cell = new_cell.contiguous();
  const at::Tensor act = gates.contiguous();
  at::Tensor d_pre;
  if (need_d_pre) d_pre = at::empty({batch, 3 * state}, options);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "lltm_fused_backward", [&] {
    constexpr int kVec = 16 / sizeof(scalar_t);
    const int64_t bytes = kVec * sizeof(scalar_t);
    at::Tensor* dp = need_d_pre ? &d_pre : nullptr;
    if (state % kVec == 0 && is_aligned(cell.const_data_ptr(), bytes) &&
        is_aligned(act.const_data_ptr(), bytes)) {
      launch_backward_pointwise<scalar_t, kVec>(grad_h, grad_cell, cell, act, dp, out, want_bias,
                                                want_old_cell, stream);
    } else {
      launch_backward_pointwise<scalar_t, 1>(grad_h, grad_cell, cell, act, dp, out, want_bias, want_old_cell,
                                             stream);
    }
  });
  if (!need_d_pre) return result();

  const RowMajor x = as_row_major(input);
  const RowMajor h = as_row_major(old_h);
  const RowMajor w = as_row_major(weights);
  const int64_t S3 = 3 * state;

  if (choose_path(batch * S3 * K) == Path::kSmall) {
    // dX columns [x_begin, x_end): [0, S) -> grad_old_h, [S, K) -> grad_input
    const int64_t x_begin = want_old_h ? 0 : state;
    const int64_t x_end = want_input ? K : state;
    const int64_t x_col_tiles = x_end > x_begin ? ceil_div(x_end - x_begin, BackwardXTile::BN) : 0;
    const int64_t x_tiles = ceil_div(batch, BackwardXTile::BM) * x_col_tiles;
    const int64_t w_col_tiles = ceil_div(K, BackwardWTile::BN);
    const int64_t w_tiles = want_weights ? ceil_div(S3, BackwardWTile::BM) * w_col_tiles : 0;
    if (x_tiles + w_tiles == 0) return result();
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kHalf, at::kBFloat16, input.scalar_type(), "lltm_fused_backward", [&] {
          cell_backward_small_kernel<scalar_t>
              <<<grid_size(x_tiles + w_tiles), small_kernel_threads<scalar_t>(), 0, stream>>>(
                  d_pre.const_data_ptr<scalar_t>(), w.data<scalar_t>(), w.ld, h.data<scalar_t>(), h.ld,
                  x.data<scalar_t>(), x.ld,
                  want_old_h ? out.grad_old_h.mutable_data_ptr<scalar_t>() : nullptr,
                  want_input ? out.grad_input.mutable_data_ptr<scalar_t>() : nullptr,
                  want_weights ? out.grad_weights.mutable_data_ptr<scalar_t>() : nullptr, batch, state,
                  features, x_begin, x_end, x_tiles, x_col_tiles, w_col_tiles);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        });
    return result();
  }

  const int64_t elem = input.element_size();
  const char* w_ptr = static_cast<const char*>(w.tensor.const_data_ptr());
  const void* dp = d_pre.const_data_ptr();
  Gemm gemms[4];
  int count = 0;
  if (want_old_h) {  // grad_old_h (B, S) = d_pre (B, 3S) W[:, :S] (3S, S)
    gemms[count++] = {
        false, false, batch, state, S3, dp, S3, w_ptr, w.ld, false, out.grad_old_h.mutable_data_ptr(), state};
  }
  if (want_input) {  // grad_input (B, I) = d_pre (B, 3S) W[:, S:] (3S, I)
    gemms[count++] = {false,
                      false,
                      batch,
                      features,
                      S3,
                      dp,
                      S3,
                      w_ptr + state * elem,
                      w.ld,
                      false,
                      out.grad_input.mutable_data_ptr(),
                      features};
  }
  if (want_weights) {  // grad_weights (3S, K) = d_pre^T [old_h | input]
    char* gw = static_cast<char*>(out.grad_weights.mutable_data_ptr());
    gemms[count++] = {true, false, S3, state, batch, dp, S3, h.tensor.const_data_ptr(), h.ld, false, gw, K};
    gemms[count++] = {
        true, false, S3, features, batch, dp, S3, x.tensor.const_data_ptr(), x.ld, false, gw + state * elem,
        K};
  }
  run_gemms(input.scalar_type(), gemms, count, tf32_products(true));
  return result();
}

}  // namespace lltm
