// Registration of the fused CPU kernels.
#pragma once

#include <torch/library.h>

// Registers the kernels that `register_fn(torch::Library&)` adds for the CPU
// dispatch key and for the sparse CPU keys: a sparse argument sends the call
// to a sparse key, where the same kernels reject it in their argument checks
// with a message that names it.
#define LLTM_REGISTER_CPU_KERNELS(register_fn)               \
  TORCH_LIBRARY_IMPL(lltm, CPU, m) { register_fn(m); }       \
  TORCH_LIBRARY_IMPL(lltm, SparseCPU, m) { register_fn(m); } \
  TORCH_LIBRARY_IMPL(lltm, SparseCsrCPU, m) { register_fn(m); }
