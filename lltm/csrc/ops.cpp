// The schemas of the lltm operators, declared once, here: the four of every
// backend of backends.h, the two of every seam cell but LLTM (rnn.h), and the queries of how the library was
// built (one more, _fused_cpu_capability, is declared beside the code it reports on, in cpu/pointwise.cpp).
// Backends add kernels with TORCH_LIBRARY_IMPL in their own folders; fake (meta) kernels live in
// lltm/_meta.py and the autograd formulas in autograd_cell.cpp and autograd_seq.cpp.
#include <Python.h>
#include <torch/library.h>

#include <string>
#include <type_traits>
#include <vector>

#include "backends.h"
#include "lltm.h"
#include "precision.h"
#include "rnn.h"
#include "rnn_schema.h"

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

// Schemas of one compiled backend: the same four for every backend.
// Every backend returns the same shapes and strides on every device, so one
// fake kernel per schema serves all of them (lltm/_meta.py). A backward
// output whose output_mask entry is false is not computed and comes back as
// an empty tensor of shape (0,) (its GEMMs are skipped: inputs that need no
// gradient).
void define_backend(torch::Library& m, const std::string& b) {
  m.def((b + "_cell_forward(Tensor input, Tensor weights, Tensor? bias, "
             "Tensor old_h, Tensor old_cell) -> "
             "(Tensor new_h, Tensor new_cell, Tensor gates)")
            .c_str());
  m.def((b + "_cell_backward(Tensor grad_h, Tensor grad_cell, "
             "Tensor new_cell, Tensor gates, Tensor input, Tensor weights, "
             "Tensor old_h, bool[5] output_mask) -> "
             "(Tensor grad_input, Tensor grad_weights, Tensor grad_bias, "
             "Tensor grad_old_h, Tensor grad_old_cell)")
            .c_str());
  // A whole layer over T steps; the output gradients are optional (a loss on
  // the output alone leaves grad_h_n and grad_c_n undefined).
  m.def((b + "_seq_forward(Tensor input, Tensor weights, Tensor? bias, "
             "Tensor h0, Tensor c0, Tensor? lengths) -> "
             "(Tensor output, Tensor h_n, Tensor c_n, Tensor gates)")
            .c_str());
  m.def((b + "_seq_backward(Tensor? grad_output, Tensor? grad_h_n, "
             "Tensor? grad_c_n, Tensor input, Tensor weights, Tensor h0, "
             "Tensor c0, Tensor output, Tensor gates, Tensor? lengths, "
             "bool[5] output_mask) -> "
             "(Tensor grad_input, Tensor grad_weights, Tensor grad_bias, "
             "Tensor grad_h0, Tensor grad_c0)")
            .c_str());
}

// The seam's cells (other than LLTM) and their sizes, for lltm/cells.py to
// check its registry against: "name:gates:states:saved:split".
std::vector<std::string> compiled_cells() {
  std::vector<std::string> out;
  lltm::cells::for_each_cell([&](auto cell) {
    using Cell = decltype(cell);
    out.push_back(std::string(Cell::kName) + ":" + std::to_string(Cell::kGates) + ":" +
                  std::to_string(Cell::kStates) + ":" + std::to_string(Cell::kSaved) + ":" +
                  (Cell::kSplit ? "1" : "0"));
  });
  return out;
}

std::vector<std::string> compiled_backends() {
  std::vector<std::string> names;
  for (std::size_t b = 0; b < lltm::kNumCompiledBackends; ++b) {
    names.push_back(lltm::backend_name(b));
  }
  return names;
}

}  // namespace

TORCH_LIBRARY(lltm, m) {
  for (std::size_t b = 0; b < lltm::kNumCompiledBackends; ++b) {
    define_backend(m, lltm::backend_name(b));
    lltm::cells::for_each_cell([&](auto cell) {
      using Cell = decltype(cell);
      if constexpr (!std::is_same_v<Cell, lltm::cells::LLTM>)
        lltm::define_rnn_ops(m, lltm::backend_name(b), Cell::kName);
    });
  }
  m.def("_build_info() -> str", &build_info);
  m.def("_compiled_backends() -> str[]", &compiled_backends);
  m.def("_compiled_cells() -> str[]", &compiled_cells);
  // lltm's float32 precision mode (precision.h; lltm.set_fp32_precision)
  m.def("_set_fp32_precision(str mode) -> ()", &lltm::set_fp32_precision);
  m.def("_fp32_precision_setting() -> int", &lltm::fp32_precision_setting);
#ifdef LLTM_WITH_CUDA
  m.def(
      "_fused_cuda_seq_plan(bool backward, int steps, int batch, int state, "
      "ScalarType dtype, int device, str cell=\"lltm\") -> str",
      &lltm::fused_cuda_seq_plan);
  m.def("_fused_cuda_seq_graph_stats() -> int[]", &lltm::fused_cuda_seq_graph_stats);
  m.def("_fused_cuda_seq_tune_stats() -> int[]", &lltm::fused_cuda_seq_tune_stats);
#endif
}

// `import lltm._C` loads this library (and so runs the registrations above)
// for ahead-of-time builds; the module itself has no Python members.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
