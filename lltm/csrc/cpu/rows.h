// Pieces shared by the fused CPU operators (cell_cpu.cpp, seq_cpu.cpp).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "pointwise.h"

namespace lltm {
namespace cpu {

// Smallest share of one pointwise pass given to a thread, in state elements.
// The pass costs a few ns per element (four exponentials forward), far more than
// torch's own elementwise ops, so the split starts much earlier than torch's
// grain (32768): at 1024 a task takes some us, above the cost of waking the
// second thread. Measured on the layer T=50 16x32x128 with 2 threads (host
// clock, fwd+bwd): 2745 us unsplit, 2306 us with the tutorial size's 2048
// elements per step split in two.
inline constexpr int64_t kGrainElements = 1024;

// Runs f(begin, end) over the batch rows [0, batch), split across torch's
// intra-op threads when each part gets at least kGrainElements elements.
template <typename F>
void for_rows(int64_t batch, int64_t state, const F& f) {
  const int64_t grain = std::max<int64_t>(1, kGrainElements / std::max<int64_t>(state, 1));
  at::parallel_for(0, batch, grain, f);
}

// The pointwise kernels for `t`'s dtype at the CPU capability torch uses.
inline PointwiseKernels kernels_for(const at::Tensor& t) {
  const PointwiseKernels k = pointwise_kernels(t.scalar_type());
  TORCH_CHECK(k.forward != nullptr && k.backward != nullptr,
              "lltm: the fused CPU kernels have no build for dtype ", t.scalar_type());
  return k;
}

inline bool has(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// A contiguous copy (or the tensor itself when already contiguous) of an
// optional tensor; undefined when absent.
inline at::Tensor contiguous_or_undefined(const std::optional<at::Tensor>& t) {
  return has(t) ? t->contiguous() : at::Tensor();
}

// Step t of a contiguous (T, ...) tensor, as a pointer: cheaper than the
// view tensor[t] (an operator call) in a loop over the steps.
inline void* step_ptr(const at::Tensor& t, int64_t step) {
  return static_cast<char*>(t.data_ptr()) + step * t.stride(0) * static_cast<int64_t>(t.element_size());
}

inline const void* ptr_or_null(const at::Tensor& t) { return t.defined() ? t.const_data_ptr() : nullptr; }

}  // namespace cpu
}  // namespace lltm
