// The schemas of a seam cell's two operators for one backend (rnn.h), used
// by ops.cpp for the built-in cells and by the source lltm.cells.define
// generates for a cell of the user's.
#pragma once

#include <torch/library.h>

#include <string>

namespace lltm {

// lltm::<b>_<cell>_seq_forward and _seq_backward (LLTM keeps its own operators, ops.cpp).
inline void define_rnn_ops(torch::Library& m, const std::string& b, const std::string& cell) {
  const std::string prefix = b + "_" + cell;
  m.def((prefix + "_seq_forward(Tensor input, Tensor weight_ih, Tensor weight_hh, Tensor? bias_ih, "
                  "Tensor? bias_hh, Tensor[] state, Tensor? lengths) -> "
                  "(Tensor output, Tensor[] state_n, Tensor saved)")
            .c_str());
  m.def((prefix + "_seq_backward(Tensor? grad_output, Tensor?[] grad_state_n, Tensor input, "
                  "Tensor weight_ih, Tensor weight_hh, Tensor[] state, Tensor output, Tensor saved, "
                  "Tensor? lengths, bool[6] output_mask) -> "
                  "(Tensor grad_input, Tensor grad_weight_ih, Tensor grad_weight_hh, Tensor grad_bias_ih, "
                  "Tensor grad_bias_hh, Tensor[] grad_state)")
            .c_str());
}

}  // namespace lltm
