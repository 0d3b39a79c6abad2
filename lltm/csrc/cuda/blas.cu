// cuBLAS calls of the fused CUDA backend (see blas.h).
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/util/Exception.h>

#include <cublas_v2.h>

#include <limits>

#include "blas.h"

namespace lltm {
namespace cuda_detail {
namespace {

const char* cublas_status_name(cublasStatus_t status) {
  return cublasGetStatusString(status);
}

int as_int(int64_t v, const char* what) {
  TORCH_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(),
              "lltm::fused (CUDA): GEMM ", what, " = ", v,
              " does not fit cuBLAS's 32-bit arguments");
  return static_cast<int>(v);
}

}  // namespace

void run_gemms(c10::ScalarType dtype, const Gemm* gemms, int count) {
  cudaDataType_t type;
  cublasComputeType_t compute;
  switch (dtype) {
    case c10::ScalarType::Float:
      type = CUDA_R_32F;
      compute = CUBLAS_COMPUTE_32F;  // TF32 only if torch enables it
      break;
    case c10::ScalarType::Double:
      type = CUDA_R_64F;
      compute = CUBLAS_COMPUTE_64F;
      break;
    case c10::ScalarType::Half:
      type = CUDA_R_16F;
      compute = CUBLAS_COMPUTE_32F;
      break;
    case c10::ScalarType::BFloat16:
      type = CUDA_R_16BF;
      compute = CUBLAS_COMPUTE_32F;
      break;
    default:
      TORCH_CHECK(false, "lltm::fused (CUDA): no GEMM for dtype ", dtype);
  }
  // Sets the current stream, the workspace and the math mode on the handle.
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  const double one_d = 1.0, zero_d = 0.0;
  const float one_f = 1.0f, zero_f = 0.0f;
  const bool is_double = dtype == c10::ScalarType::Double;
  for (int i = 0; i < count; ++i) {
    const Gemm& g = gemms[i];
    if (g.m == 0 || g.n == 0 || g.k == 0) continue;
    // Row-major C = A B is column-major C^T = B^T A^T: cuBLAS gets (n x m)
    // C^T from B's storage as its first operand and A's as its second.
    const void* alpha = is_double ? static_cast<const void*>(&one_d)
                                  : static_cast<const void*>(&one_f);
    const void* beta =
        g.accumulate ? alpha
                     : (is_double ? static_cast<const void*>(&zero_d)
                                  : static_cast<const void*>(&zero_f));
    const cublasStatus_t status = cublasGemmEx(
        handle, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
        g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(g.n, "n"),
        as_int(g.m, "m"), as_int(g.k, "k"), alpha, g.b, type,
        as_int(g.ldb, "ldb"), g.a, type, as_int(g.lda, "lda"), beta, g.c, type,
        as_int(g.ldc, "ldc"), compute, CUBLAS_GEMM_DEFAULT);
    TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS,
                "lltm::fused (CUDA): cublasGemmEx failed: ",
                cublas_status_name(status), " (m=", g.m, ", n=", g.n,
                ", k=", g.k, ")");
  }
}

}  // namespace cuda_detail
}  // namespace lltm
