// The cell's packed weights, kept between calls (packed_weights.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "kernels.h"

namespace lltm {
namespace cpu {

// W (3S, S + I) packed for the forward step
// (Kernels::pack_gates) on `workers` threads, or the copy packed by an
// earlier call while W is the same tensor, unchanged: same TensorImpl (held
// weakly, so a tensor allocated where a freed one was is never taken for
// it), same version counter, data pointer, sizes, strides and kernels. A
// cell called step by step in a Python loop then packs W once per weight
// update instead of once per step.
//
// The version counter sees every in-place change autograd sees (optimizer
// steps, nn.init, load_state_dict, copy_ under no_grad); a change through
// `.data` or through memory shared outside torch is invisible to it, as it
// is to autograd's own checks of saved tensors. Inference tensors (no
// version counter) and weights with strided rows are packed on every call.
at::Tensor packed_gates(const Kernels& kernels, const at::Tensor& weights, int64_t state, int64_t features,
                        int64_t workers);

// Forgets every packed copy (lltm::_fused_cpu_clear_weight_cache).
void clear_packed_weights();

}  // namespace cpu
}  // namespace lltm
