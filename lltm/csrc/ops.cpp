// The one place where the lltm operator schemas are declared. Backends add
// kernels with TORCH_LIBRARY_IMPL in their own folders; fake (meta) kernels
// live in lltm/_meta.py and the autograd formulas in autograd.cpp.
#include <Python.h>
#include <torch/library.h>

#include "lltm.h"

#ifndef LLTM_WITH_CUDA
namespace lltm {
std::string cuda_arch_list() { return ""; }
}  // namespace lltm
#endif

namespace {

// "cuda=0" or "cuda=1 arch=90"; read by `lltm info`.
std::string build_info() {
#ifdef LLTM_WITH_CUDA
  return "cuda=1 arch=" + lltm::cuda_arch_list();
#else
  return "cuda=0";
#endif
}

}  // namespace

TORCH_LIBRARY(lltm, m) {
  // One schema per (backend, direction), identical across backends. Every
  // backend returns the same shapes and strides on every device, so one fake
  // kernel per schema serves all of them. A backward output whose
  // output_mask entry is false is not computed and comes back as an empty
  // tensor of shape (0,) (its GEMM is skipped: inputs that need no gradient).
  m.def(
      "aten_cell_forward(Tensor input, Tensor weights, Tensor? bias, "
      "Tensor old_h, Tensor old_cell) -> "
      "(Tensor new_h, Tensor new_cell, Tensor gates)");
  m.def(
      "aten_cell_backward(Tensor grad_h, Tensor grad_cell, Tensor new_cell, "
      "Tensor gates, Tensor input, Tensor weights, Tensor old_h, "
      "bool[5] output_mask) -> "
      "(Tensor grad_input, Tensor grad_weights, Tensor grad_bias, "
      "Tensor grad_old_h, Tensor grad_old_cell)");
  m.def(
      "fused_cell_forward(Tensor input, Tensor weights, Tensor? bias, "
      "Tensor old_h, Tensor old_cell) -> "
      "(Tensor new_h, Tensor new_cell, Tensor gates)");
  m.def(
      "fused_cell_backward(Tensor grad_h, Tensor grad_cell, Tensor new_cell, "
      "Tensor gates, Tensor input, Tensor weights, Tensor old_h, "
      "bool[5] output_mask) -> "
      "(Tensor grad_input, Tensor grad_weights, Tensor grad_bias, "
      "Tensor grad_old_h, Tensor grad_old_cell)");
  m.def("_build_info() -> str", &build_info);
}

// `import lltm._C` loads this library (and so runs the registrations above)
// for ahead-of-time builds; the module itself has no Python members.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C",
                                          nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
