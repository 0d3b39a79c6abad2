// Registration of the fused CUDA backend: the CUDA kernels of
// lltm::fused_cell_{forward,backward} (cell_forward.cu, cell_backward.cu) and
// lltm::fused_seq_{forward,backward} (rnn_cuda.cu).
// Schemas are in ../ops.cpp, autograd in ../autograd_*.cpp, the autocast
// rules in ../autocast_cuda.cu.
#include <torch/library.h>

#include <string>

#include "../lltm.h"

namespace lltm {

// nvcc defines __CUDA_ARCH_LIST__ as the comma-separated list of the
// architectures it compiles for, e.g. 900 or 800,900 (compute capability x 100).
#define LLTM_STRINGIFY_LIST(...) #__VA_ARGS__
#define LLTM_STRINGIFY(...) LLTM_STRINGIFY_LIST(__VA_ARGS__)

std::string cuda_arch_list() {
#ifdef __CUDA_ARCH_LIST__
  return LLTM_STRINGIFY(__CUDA_ARCH_LIST__);
#else
  return "unknown";
#endif
}

}  // namespace lltm

TORCH_LIBRARY_IMPL(lltm, CUDA, m) {
  m.impl("fused_cell_forward", &lltm::fused_cell_forward_cuda);
  m.impl("fused_cell_backward", &lltm::fused_cell_backward_cuda);
  m.impl("fused_seq_forward", &lltm::fused_seq_forward_cuda);
  m.impl("fused_seq_backward", &lltm::fused_seq_backward_cuda);
}
