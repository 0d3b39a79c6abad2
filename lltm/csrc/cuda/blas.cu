// cuBLAS calls of the fused CUDA backend (see blas.h).
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cublas_v2.h>

#include <limits>
#include <mutex>

#include "blas.h"

namespace lltm {
namespace cuda_detail {
namespace {

const char* cublas_status_name(cublasStatus_t status) { return cublasGetStatusString(status); }

void check(cublasStatus_t status, const char* what) {
  TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS, "lltm::fused (CUDA): ", what,
              " failed: ", cublas_status_name(status));
}

thread_local int own_handle_users = 0;

constexpr int kMaxDevices = 64;
// The workspace lltm's handles use (cuBLAS's split-K GEMMs need one): one
// per device, allocated once from PyTorch's allocator and kept for the
// process's life. Every use is ordered device-wide by seq_graph.cpp.
constexpr size_t kOwnWorkspaceBytes = size_t(32) << 20;
// GEMMs smaller than this (m n k) get no workspace: with one, cuBLAS picks
// for some of them (fp32 16 x 384 x 128 on an H100) an algorithm that runs
// ~30 us instead of ~3 (docs/benchmarks.md); the workspace pays from a few
// million multiply-adds up (split-K over the SMs).
constexpr int64_t kOwnWorkspaceMinMacs = int64_t(1) << 21;

void* own_workspace(int device) {
  static std::mutex mutex;
  static void* workspaces[kMaxDevices] = {};
  const std::lock_guard<std::mutex> lock(mutex);
  if (workspaces[device] == nullptr) {
    workspaces[device] = c10::cuda::CUDACachingAllocator::raw_alloc(kOwnWorkspaceBytes);
  }
  return workspaces[device];
}

// lltm's handle of the current device for this thread, bound to the current
// stream, with lltm's workspace (see OwnBlasHandle). Created on first use
// (never during a capture: OwnBlasHandle's constructor makes it) and kept
// for the thread's life, like PyTorch's.
cublasHandle_t own_handle() {
  thread_local cublasHandle_t handles[kMaxDevices] = {};
  const int device = c10::cuda::current_device();
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "lltm::fused (CUDA): device ", device, " is past the ",
              kMaxDevices, " devices lltm's own cuBLAS handles cover");
  cublasHandle_t& handle = handles[device];
  if (handle == nullptr) check(cublasCreate(&handle), "cublasCreate");
  check(cublasSetStream(handle, c10::cuda::getCurrentCUDAStream()), "cublasSetStream");
  return handle;
}

int as_int(int64_t v, const char* what) {
  TORCH_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), "lltm::fused (CUDA): GEMM ", what, " = ", v,
              " does not fit cuBLAS's 32-bit arguments");
  return static_cast<int>(v);
}

}  // namespace

void run_gemms(c10::ScalarType dtype, const Gemm* gemms, int count, bool tf32) {
  cudaDataType_t type;
  cublasComputeType_t compute;
  switch (dtype) {
    case c10::ScalarType::Float:
      type = CUDA_R_32F;
      compute = CUBLAS_COMPUTE_32F;  // TF32 only through the math mode below
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
  // PyTorch's handle: sets the current stream and the workspace on it.
  cublasHandle_t handle = own_handle_users > 0 ? own_handle() : at::cuda::getCurrentCUDABlasHandle();
  // The math mode for these GEMMs (TF32 is a float32 matter), and the
  // handle's own put back after them.
  cublasMath_t math_before;
  check(cublasGetMathMode(handle, &math_before), "cublasGetMathMode");
  check(cublasSetMathMode(handle, tf32 && dtype == c10::ScalarType::Float ? CUBLAS_TF32_TENSOR_OP_MATH
                                                                          : CUBLAS_DEFAULT_MATH),
        "cublasSetMathMode");
  struct RestoreMath {
    cublasHandle_t handle;
    cublasMath_t math;
    ~RestoreMath() { (void)cublasSetMathMode(handle, math); }
  } restore{handle, math_before};
  const double one_d = 1.0, zero_d = 0.0;
  const float one_f = 1.0f, zero_f = 0.0f;
  const bool is_double = dtype == c10::ScalarType::Double;
  for (int i = 0; i < count; ++i) {
    const Gemm& g = gemms[i];
    if (g.m == 0 || g.n == 0 || g.k == 0) continue;
    // Row-major C = A B is column-major C^T = B^T A^T: cuBLAS gets (n x m)
    // C^T from B's storage as its first operand and A's as its second.
    const void* alpha = is_double ? static_cast<const void*>(&one_d) : static_cast<const void*>(&one_f);
    const void* beta =
        g.accumulate ? alpha
                     : (is_double ? static_cast<const void*>(&zero_d) : static_cast<const void*>(&zero_f));
    if (own_handle_users > 0) {
      const bool large = g.m * g.n * g.k >= kOwnWorkspaceMinMacs;
      check(cublasSetWorkspace(handle, large ? own_workspace(c10::cuda::current_device()) : nullptr,
                               large ? kOwnWorkspaceBytes : 0),
            "cublasSetWorkspace");
    }
    const cublasStatus_t status = cublasGemmEx(
        handle, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
        as_int(g.n, "n"), as_int(g.m, "m"), as_int(g.k, "k"), alpha, g.b, type, as_int(g.ldb, "ldb"), g.a,
        type, as_int(g.lda, "lda"), beta, g.c, type, as_int(g.ldc, "ldc"), compute, CUBLAS_GEMM_DEFAULT);
    TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS,
                "lltm::fused (CUDA): cublasGemmEx failed: ", cublas_status_name(status), " (m=", g.m,
                ", n=", g.n, ", k=", g.k, ")");
  }
}

OwnBlasHandle::OwnBlasHandle() {
  (void)own_handle();  // created here, outside any capture
  (void)own_workspace(c10::cuda::current_device());
  ++own_handle_users;
}
OwnBlasHandle::~OwnBlasHandle() { --own_handle_users; }

}  // namespace cuda_detail
}  // namespace lltm
