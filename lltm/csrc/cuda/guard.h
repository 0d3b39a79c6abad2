// The prologue of every fused CUDA operator, after its argument checks.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

namespace lltm {
namespace cuda_detail {

// Checks that the operator's tensors are CUDA tensors (the argument checks
// before made sure they share one device) and returns the guard that makes
// that device current for the launches and allocations that follow.
inline c10::cuda::CUDAGuard cuda_guard(const char* op, const at::Tensor& input) {
  TORCH_CHECK(input.is_cuda(), op, ": expected CUDA tensors, but got input on ", input.device());
  return c10::cuda::CUDAGuard(input.device());
}

}  // namespace cuda_detail
}  // namespace lltm
