// Host-side helpers of the fused CUDA backend: operand layouts, the choice
// between the small-size and the GEMM-library path, launch geometry.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace lltm {
namespace cuda_detail {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A 2-D tensor seen as a row-major matrix: unit column stride, row stride
// `ld` >= the number of columns (what cuBLAS and the tiled kernels read).
// Views that already have that layout (row slices, column blocks of a wider
// matrix) are used in place; anything else is copied once.
struct RowMajor {
  at::Tensor tensor;
  int64_t ld;

  template <typename T>
  const T* data() const {
    return tensor.const_data_ptr<T>();
  }
};

inline RowMajor as_row_major(const at::Tensor& t) {
  const int64_t rows = t.size(0), cols = t.size(1);
  const int64_t min_ld = std::max<int64_t>(cols, 1);
  const bool unit_cols = cols <= 1 || t.stride(1) == 1;
  const bool rows_apart = rows <= 1 || t.stride(0) >= min_ld;
  if (unit_cols && rows_apart) {
    return {t, rows <= 1 ? min_ld : t.stride(0)};
  }
  return {t.contiguous(), min_ld};
}

inline bool is_aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % static_cast<std::uintptr_t>(bytes) == 0;
}

// Whether V consecutive columns of a (B, S) tensor, starting at any multiple
// of V, can be moved with one aligned vector access.
inline bool packs_load_as_vectors(const at::Tensor& t, int V) {
  if (V == 1) return true;
  const int64_t bytes = V * static_cast<int64_t>(t.element_size());
  return t.stride(1) == 1 && (t.size(0) <= 1 || t.stride(0) % V == 0) &&
         is_aligned(t.const_data_ptr(), bytes);
}

// Which implementation runs a cell step.
//   kSmall: one tiled kernel per direction (plus the pointwise gradient
//           kernel in backward): fewest launches and no cuBLAS call, so the
//           least host time, for steps whose GEMMs cannot fill the GPU.
//   kBlas:  cuBLAS GEMMs plus one pointwise pass: the least GPU time for
//           everything else.
// The switch point depends on what the step pays for. Eagerly, every launch
// and every cuBLAS call costs host time (about 5 and 12 us on the H100 test
// machine) that the GPU waits on at these sizes, so the small path wins
// until its GPU time exceeds the large path's wall time. Under CUDA graph
// capture (torch.cuda.graph, torch.compile mode="reduce-overhead") launches
// are free at replay and only GPU time counts. Measured on H100, see
// docs/benchmarks.md. LLTM_CUDA_PATH=small|blas forces one
// (benchmarks, tests).
enum class Path { kSmall, kBlas };

// Multiply-adds of one GEMM of the step, B x 3S x (S + I), up to which the
// small path runs: eagerly, and while a CUDA graph is being captured.
constexpr int64_t kSmallPathMaxMacsEager = int64_t(1) << 29;
constexpr int64_t kSmallPathMaxMacsGraph = int64_t(1) << 24;

inline Path choose_path(int64_t macs) {
  if (const char* forced = std::getenv("LLTM_CUDA_PATH")) {
    if (std::strcmp(forced, "small") == 0) return Path::kSmall;
    if (std::strcmp(forced, "blas") == 0) return Path::kBlas;
  }
  const bool capturing = c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
  return macs <= (capturing ? kSmallPathMaxMacsGraph : kSmallPathMaxMacsEager) ? Path::kSmall : Path::kBlas;
}

// Multiprocessors of a device, read once per device (the first 64 devices
// are cached; any other is asked each time).
inline int sm_count(c10::DeviceIndex device) {
  static int cache[64] = {};
  const int index = device;
  TORCH_CHECK(index >= 0, "lltm::fused (CUDA): invalid device index ", index);
  const auto query = [index] {
    int count = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, index));
    return count;
  };
  if (index >= 64) return query();
  if (cache[index] == 0) cache[index] = query();
  return cache[index];
}

inline unsigned int grid_size(int64_t blocks) {
  TORCH_CHECK(blocks >= 0 && blocks <= 0x7fffffff, "lltm::fused (CUDA): launch of ", blocks,
              " blocks exceeds the grid limit");
  return static_cast<unsigned int>(blocks);
}

}  // namespace cuda_detail
}  // namespace lltm
