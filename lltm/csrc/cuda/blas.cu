// cuBLAS calls of the fused CUDA backend (see blas.h).
#include <ATen/cuda/CUDAContextLight.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

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

// x rounded to TF32 (10 explicit mantissa bits, to nearest, ties away from
// zero: cvt.rna.tf32.f32's rounding); infinities and NaNs pass unchanged.
__device__ __forceinline__ float round_tf32(float x) {
  const uint32_t bits = __float_as_uint(x);
  if ((bits & 0x7f800000u) == 0x7f800000u) return x;
  return __uint_as_float((bits + 0x1000u) & 0xffffe000u);
}

// The operands of one run_gemms_split_tf32: job j is a (rows, cols)
// row-major block of float32 at src, ld apart, split into big = tf32(x)
// (rows, cols) at dst and small = tf32(x - big) right after it; start is the
// prefix sum of the jobs' rows * cols. All of them in one launch.
constexpr int kMaxSplitJobs = 8;  // two operands of at most four GEMMs
struct SplitJobs {
  const float* src[kMaxSplitJobs];
  float* dst[kMaxSplitJobs];
  int64_t rows[kMaxSplitJobs], cols[kMaxSplitJobs], ld[kMaxSplitJobs];
  int64_t start[kMaxSplitJobs + 1];
  int count;
};

__global__ void split_tf32_kernel(const SplitJobs jobs) {
  const int64_t total = jobs.start[jobs.count];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    int j = 0;
    while (i >= jobs.start[j + 1]) ++j;
    const int64_t e = i - jobs.start[j], r = e / jobs.cols[j], c = e - r * jobs.cols[j];
    const float x = jobs.src[j][r * jobs.ld[j] + c];
    const float b = round_tf32(x);
    jobs.dst[j][e] = b;
    jobs.dst[j][jobs.rows[j] * jobs.cols[j] + e] = round_tf32(x - b);
  }
}

int as_int(int64_t v, const char* what) {
  TORCH_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), "lltm::fused (CUDA): GEMM ", what, " = ", v,
              " does not fit cuBLAS's 32-bit arguments");
  return static_cast<int>(v);
}

// cuBLAS's types of a dtype's GEMMs: the elements', the accumulation's
// (and its alpha and beta: 1 and 0 in that type) and the compute type.
constexpr float kOneF = 1.0f, kZeroF = 0.0f;
constexpr double kOneD = 1.0, kZeroD = 0.0;
struct GemmTypes {
  cudaDataType_t type, acc;
  cublasComputeType_t compute;
  const void* one;
  const void* zero;
};
GemmTypes gemm_types(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float:  // TF32 only through the math mode (MathScope)
      return {CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, &kOneF, &kZeroF};
    case c10::ScalarType::Double:
      return {CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F, &kOneD, &kZeroD};
    case c10::ScalarType::Half:
      return {CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F, &kOneF, &kZeroF};
    case c10::ScalarType::BFloat16:
      return {CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F, &kOneF, &kZeroF};
    default:
      TORCH_CHECK(false, "lltm::fused (CUDA): no GEMM for dtype ", dtype);
  }
}

// The handle for this call (PyTorch's, on the current stream with its
// workspace, or lltm's own: OwnBlasHandle) with the math mode of these
// GEMMs (TF32 is a float32 matter); the handle's own mode is put back when
// the scope ends.
class MathScope {
 public:
  MathScope(c10::ScalarType dtype, bool tf32)
      : handle_(own_handle_users > 0 ? own_handle() : at::cuda::getCurrentCUDABlasHandle()) {
    check(cublasGetMathMode(handle_, &before_), "cublasGetMathMode");
    check(cublasSetMathMode(handle_, tf32 && dtype == c10::ScalarType::Float ? CUBLAS_TF32_TENSOR_OP_MATH
                                                                             : CUBLAS_DEFAULT_MATH),
          "cublasSetMathMode");
  }
  ~MathScope() { (void)cublasSetMathMode(handle_, before_); }
  MathScope(const MathScope&) = delete;
  MathScope& operator=(const MathScope&) = delete;
  cublasHandle_t handle() const { return handle_; }

 private:
  cublasHandle_t handle_;
  cublasMath_t before_;
};

void check_gemm(cublasStatus_t status, const char* call, const Gemm& g) {
  TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS, "lltm::fused (CUDA): ", call,
              " failed: ", cublas_status_name(status), " (m=", g.m, ", n=", g.n, ", k=", g.k, ")");
}

}  // namespace

void run_gemms(c10::ScalarType dtype, const Gemm* gemms, int count, bool tf32) {
  const GemmTypes types = gemm_types(dtype);
  const MathScope scope(dtype, tf32);
  cublasHandle_t handle = scope.handle();
  for (int i = 0; i < count; ++i) {
    const Gemm& g = gemms[i];
    if (g.m == 0 || g.n == 0 || g.k == 0) continue;
    // Row-major C = A B is column-major C^T = B^T A^T: cuBLAS gets (n x m)
    // C^T from B's storage as its first operand and A's as its second.
    if (own_handle_users > 0) {
      const bool large = g.m * g.n * g.k >= kOwnWorkspaceMinMacs;
      check(cublasSetWorkspace(handle, large ? own_workspace(c10::cuda::current_device()) : nullptr,
                               large ? kOwnWorkspaceBytes : 0),
            "cublasSetWorkspace");
    }
    check_gemm(cublasGemmEx(handle, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                            g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(g.n, "n"), as_int(g.m, "m"),
                            as_int(g.k, "k"), types.one, g.b, types.type, as_int(g.ldb, "ldb"), g.a,
                            types.type, as_int(g.lda, "lda"), g.accumulate ? types.one : types.zero, g.c,
                            types.type, as_int(g.ldc, "ldc"), types.compute, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx", g);
  }
}

void run_gemm_split_k(c10::ScalarType dtype, const Gemm& g, int splits, bool tf32) {
  TORCH_CHECK(!g.accumulate && splits > 0 && g.k % splits == 0,
              "lltm::fused (CUDA): run_gemm_split_k takes no accumulation and k (", g.k,
              ") divisible by splits (", splits, ")");
  if (g.m == 0 || g.n == 0 || g.k == 0) return;
  const GemmTypes types = gemm_types(dtype);
  const MathScope scope(dtype, tf32);
  const int64_t kc = g.k / splits;
  // Part s: op(A)'s columns [s kc, (s + 1) kc) and op(B)'s rows of the same
  // range: in A's storage columns (rows where transposed), in B's rows
  // (columns where transposed); column-major as in run_gemms (B's storage first).
  const int64_t stride_a = g.trans_a ? kc * g.lda : kc, stride_b = g.trans_b ? kc : kc * g.ldb;
  check_gemm(cublasGemmStridedBatchedEx(scope.handle(), g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(g.n, "n"),
                                        as_int(g.m, "m"), as_int(kc, "k"), types.one, g.b, types.type,
                                        as_int(g.ldb, "ldb"), stride_b, g.a, types.type, as_int(g.lda, "lda"),
                                        stride_a, types.zero, g.c, types.acc, as_int(g.ldc, "ldc"),
                                        g.m * g.ldc, splits, types.compute, CUBLAS_GEMM_DEFAULT),
             "cublasGemmStridedBatchedEx", g);
}

void transpose(c10::ScalarType dtype, int64_t rows, int64_t cols, const void* a, int64_t lda, void* c,
               int64_t ldc) {
  if (rows == 0 || cols == 0) return;
  const MathScope scope(dtype, false);
  // Row-major A (rows x cols) is column-major (cols x rows), and row-major C
  // (cols x rows) column-major (rows x cols): C = op(A) with op = T. B is
  // not read (beta = 0); C stands in for it, as geam allows in place.
  const int m = as_int(rows, "rows"), n = as_int(cols, "cols"), la = as_int(lda, "lda"),
            lc = as_int(ldc, "ldc");
  cublasStatus_t status;
  if (dtype == c10::ScalarType::Float) {
    status = cublasSgeam(scope.handle(), CUBLAS_OP_T, CUBLAS_OP_N, m, n, &kOneF, static_cast<const float*>(a),
                         la, &kZeroF, static_cast<float*>(c), lc, static_cast<float*>(c), lc);
  } else {
    TORCH_CHECK(dtype == c10::ScalarType::Double, "lltm::fused (CUDA): no transpose for dtype ", dtype);
    status =
        cublasDgeam(scope.handle(), CUBLAS_OP_T, CUBLAS_OP_N, m, n, &kOneD, static_cast<const double*>(a), la,
                    &kZeroD, static_cast<double*>(c), lc, static_cast<double*>(c), lc);
  }
  TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS,
              "lltm::fused (CUDA): cublas geam (transpose) failed: ", cublas_status_name(status),
              " (rows=", rows, ", cols=", cols, ")");
}

void run_gemms_split_tf32(const Gemm* gemms, int count) {
  // The operands' splits: a block that lies within one split already (the
  // same columns and ld, whole rows: the backward's W_hh GEMMs read row
  // blocks of the dz the others read whole) is read from it; the rest are
  // split in one launch into one allocation.
  SplitJobs jobs{};
  struct Split {
    int job;
    int64_t row0;  // the block's first row in the job's
  };
  auto find_or_add = [&](const void* data, int64_t rows, int64_t cols, int64_t ld) -> Split {
    // Addresses of unrelated blocks compared as integers.
    const float* p = static_cast<const float*>(data);
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    for (int j = 0; j < jobs.count; ++j) {
      const auto from = reinterpret_cast<std::uintptr_t>(jobs.src[j]);
      if (jobs.cols[j] != cols || jobs.ld[j] != ld || at < from || (at - from) % sizeof(float) != 0) continue;
      const auto offset = static_cast<int64_t>((at - from) / sizeof(float));
      if (offset % ld == 0 && offset / ld + rows <= jobs.rows[j]) return {j, offset / ld};
    }
    TORCH_CHECK(jobs.count < kMaxSplitJobs, "lltm::fused (CUDA): internal error: more than ", kMaxSplitJobs,
                " operands for the 3xTF32 GEMMs");
    const int j = jobs.count++;
    jobs.src[j] = p;
    jobs.rows[j] = rows;
    jobs.cols[j] = cols;
    jobs.ld[j] = ld;
    jobs.start[j + 1] = jobs.start[j] + rows * cols;
    return {j, 0};
  };
  std::vector<std::pair<Split, Split>> operands(count);
  for (int i = 0; i < count; ++i) {
    const Gemm& g = gemms[i];
    if (g.m == 0 || g.n == 0 || g.k == 0) continue;
    // A is stored (k x m) when transposed, else (m x k); B (n x k), else (k x n).
    operands[i] = {find_or_add(g.a, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda),
                   find_or_add(g.b, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb)};
  }
  at::Tensor buffer;
  if (jobs.count > 0) {
    const int64_t total = jobs.start[jobs.count];
    buffer = at::empty({2 * total},
                       at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, c10::cuda::current_device()));
    float* base = buffer.mutable_data_ptr<float>();
    for (int j = 0; j < jobs.count; ++j) jobs.dst[j] = base + 2 * jobs.start[j];
    const int threads = 256;  // every job has elements: GEMMs with an empty dimension are skipped above
    const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, int64_t(1) << 16);
    split_tf32_kernel<<<static_cast<unsigned>(blocks), threads, 0, c10::cuda::getCurrentCUDAStream()>>>(jobs);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  // A split block's big part and its small part (both the job's columns apart).
  auto big = [&](const Split& s) { return jobs.dst[s.job] + s.row0 * jobs.cols[s.job]; };
  auto small = [&](const Split& s) { return big(s) + jobs.rows[s.job] * jobs.cols[s.job]; };
  std::vector<Gemm> parts;
  parts.reserve(3 * count);
  for (int i = 0; i < count; ++i) {
    const Gemm& g = gemms[i];
    if (g.m == 0 || g.n == 0 || g.k == 0) {
      parts.push_back(g);  // run_gemms skips it
      continue;
    }
    const auto& [a, b] = operands[i];
    Gemm part = g;
    part.lda = jobs.cols[a.job];
    part.ldb = jobs.cols[b.job];
    part.a = big(a);  // A_big B_small (+ C)
    part.b = small(b);
    parts.push_back(part);
    part.accumulate = true;
    part.a = small(a);  // + A_small B_big
    part.b = big(b);
    parts.push_back(part);
    part.a = big(a);  // + A_big B_big
    parts.push_back(part);
  }
  run_gemms(c10::ScalarType::Float, parts.data(), static_cast<int>(parts.size()), true);
}

OwnBlasHandle::OwnBlasHandle() {
  (void)own_handle();  // created here, outside any capture
  (void)own_workspace(c10::cuda::current_device());
  ++own_handle_users;
}
OwnBlasHandle::~OwnBlasHandle() { --own_handle_users; }

}  // namespace cuda_detail
}  // namespace lltm
