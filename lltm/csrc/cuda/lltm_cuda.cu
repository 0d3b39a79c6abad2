// Registration of the fused CUDA backend: the CUDA kernels of
// lltm::fused_cell_forward / lltm::fused_cell_backward (cell_forward.cu,
// cell_backward.cu). Schemas are in ../ops.cpp, autograd in ../autograd.cpp,
// the autocast rule in autocast.cu.
#include <torch/library.h>

#include <sstream>
#include <string>

#include "../lltm.h"

namespace lltm {

std::string cuda_arch_list() {
#ifdef __CUDA_ARCH_LIST__
  // nvcc defines __CUDA_ARCH_LIST__ as e.g. 800,900 (compute capability x 10).
  constexpr int archs[] = {__CUDA_ARCH_LIST__};
  std::ostringstream list;
  for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); ++i) {
    list << (i ? "," : "") << archs[i];
  }
  return list.str();
#else
  return "unknown";
#endif
}

}  // namespace lltm

TORCH_LIBRARY_IMPL(lltm, CUDA, m) {
  m.impl("fused_cell_forward", &lltm::fused_cell_forward_cuda);
  m.impl("fused_cell_backward", &lltm::fused_cell_backward_cuda);
}
