// Row-major GEMMs on cuBLAS for the fused CUDA backend.
//
// Every operand is a row-major matrix given by a pointer and a leading
// dimension (row stride), so column blocks of a matrix (W[:, :S], the left
// half of grad_weights) are used in place. Kept apart from the kernels so
// that only this file needs the cuBLAS headers.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace lltm {
namespace cuda_detail {

// C (m x n) = op(A) (m x k) * op(B) (k x n) + (accumulate ? C : 0).
// trans_a: A is stored as (k x m), else (m x k); trans_b: B is stored as
// (n x k), else (k x n). All row-major with the given leading dimensions.
struct Gemm {
  bool trans_a, trans_b;
  int64_t m, n, k;
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  bool accumulate;
  void* c;
  int64_t ldc;
};

// Runs the GEMMs in order on the current stream of the current device with
// PyTorch's cuBLAS handle (its workspace, and its TF32 setting for float32,
// so results match torch.mm). GEMMs with m, n or k = 0 are skipped; with
// k = 0 and accumulate unset, C must be cleared by the caller.
void run_gemms(c10::ScalarType dtype, const Gemm* gemms, int count);

}  // namespace cuda_detail
}  // namespace lltm
