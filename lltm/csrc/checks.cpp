// Argument checks shared by every compiled backend. Wrong shapes raise
// ValueError, wrong dtypes TypeError and device mixes RuntimeError in Python;
// lltm/_checks.py raises the same for the pure-PyTorch backend.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "lltm.h"
#include "rnn.h"

namespace lltm {
namespace {

bool is_supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

void check_rank(const char* op, const at::Tensor& t, const char* name, int64_t rank, const char* layout) {
  TORCH_CHECK_VALUE(t.defined(), op, ": ", name, " is undefined; expected a tensor ", layout);
  TORCH_CHECK_TYPE(t.layout() == at::kStrided, op, ": expected ", name,
                   " to be a dense (strided) tensor, but got layout ", t.layout(), " (call .to_dense())");
  TORCH_CHECK_VALUE(t.dim() == rank, op, ": expected ", name, " to be a ", rank, "-D tensor ", layout,
                    ", but got a ", t.dim(), "-D tensor of shape ", t.sizes());
}

void check_shape(const char* op, const at::Tensor& t, const char* name, at::IntArrayRef expected,
                 const char* layout) {
  TORCH_CHECK_VALUE(t.sizes() == expected, op, ": expected ", name, " of shape ", layout, " = ", expected,
                    ", but got ", t.sizes());
}

// All tensors share the dtype and device of `ref` (the first argument).
void check_like(const char* op, const at::Tensor& t, const char* name, const at::Tensor& ref,
                const char* ref_name) {
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), op, ": expected ", name, " to have dtype ",
                   ref.scalar_type(), " like ", ref_name, ", but got ", t.scalar_type(),
                   " (cast all arguments to one dtype)");
  TORCH_CHECK(t.device() == ref.device(), op, ": expected ", name, " on device ", ref.device(), " like ",
              ref_name, ", but got ", t.device(), " (move all arguments to one device)");
}

void check_dtype(const char* op, const at::Tensor& input) {
  TORCH_CHECK_TYPE(is_supported_dtype(input.scalar_type()), op,
                   ": expected input of a floating dtype (float32, float64, "
                   "float16 or bfloat16), but got ",
                   input.scalar_type());
}

// weights (3S, S + I) against an input whose last dimension is I. A width
// mismatch is reported against the input (its feature count is the one
// that is usually wrong), naming the count the weights expect.
void check_weights(const char* op, const at::Tensor& weights, const at::Tensor& input,
                   const char* input_name) {
  check_rank(op, weights, "weights", 2, "(3 * state_size, state_size + input_features)");
  TORCH_CHECK_VALUE(weights.size(0) % 3 == 0, op, ": expected weights.size(0) to be 3 * state_size, but got ",
                    weights.size(0), " (not a multiple of 3)");
  const int64_t state = weights.size(0) / 3;
  const int64_t features = input.size(-1);
  TORCH_CHECK_VALUE(weights.size(1) >= state, op, ": expected weights of shape ",
                    "(3 * state_size, state_size + input_features) with ", "state_size = ", state,
                    ", but got ", weights.sizes());
  TORCH_CHECK_VALUE(weights.size(1) == state + features, op, ": expected ", input_name, " with ",
                    weights.size(1) - state,
                    " input features (weights.size(1) - state_size = ", weights.size(1), " - ", state,
                    "), but got ", input_name, " of shape ", input.sizes());
  check_like(op, weights, "weights", input, input_name);
}

void check_bias(const char* op, const std::optional<at::Tensor>& bias, int64_t state,
                const at::Tensor& input) {
  if (bias.has_value() && bias->defined()) {
    check_rank(op, *bias, "bias", 1, "(3 * state_size,)");
    check_shape(op, *bias, "bias", {3 * state}, "(3 * state_size,)");
    check_like(op, *bias, "bias", input, "input");
  }
}

void check_state(const char* op, const at::Tensor& t, const char* name, int64_t batch, int64_t state,
                 const at::Tensor& input) {
  check_rank(op, t, name, 2, "(batch, state_size)");
  check_shape(op, t, name, {batch, state}, "(batch, state_size)");
  check_like(op, t, name, input, "input");
}

// lengths (B,) int64 on the input's device, each in [0, seq_len]. The
// values are read only where that is free, on the CPU: on a CUDA device it
// would cost a synchronisation per call and cannot run under CUDA graph
// capture; lltm.functional.lltm checks them there before calling the op
// (outside torch.compile tracing and graph capture).
void check_lengths(const char* op, const std::optional<at::Tensor>& lengths, int64_t steps, int64_t batch,
                   const at::Tensor& input) {
  if (!lengths.has_value() || !lengths->defined()) return;
  check_rank(op, *lengths, "lengths", 1, "(batch,)");
  check_shape(op, *lengths, "lengths", {batch}, "(batch,)");
  TORCH_CHECK_TYPE(lengths->scalar_type() == at::kLong, op,
                   ": expected lengths of dtype Long (int64), but got ", lengths->scalar_type(),
                   " (convert it with lengths.to(torch.int64))");
  TORCH_CHECK(lengths->device() == input.device(), op, ": expected lengths on device ", input.device(),
              " like input, but got ", lengths->device(), " (move all arguments to one device)");
  if (lengths->is_cpu()) {
    const auto len = lengths->accessor<int64_t, 1>();
    for (int64_t b = 0; b < batch; ++b) {
      TORCH_CHECK_VALUE(len[b] >= 0 && len[b] <= steps, op, ": expected 0 <= lengths[b] <= seq_len = ", steps,
                        " for every row b, but got lengths[", b, "] = ", len[b]);
    }
  }
}

}  // namespace

void check_cell_forward_args(const char* op, const at::Tensor& input, const at::Tensor& weights,
                             const std::optional<at::Tensor>& bias, const at::Tensor& old_h,
                             const at::Tensor& old_cell) {
  check_rank(op, input, "input", 2, "(batch, input_features)");
  check_dtype(op, input);
  check_weights(op, weights, input, "input");
  const int64_t batch = input.size(0);
  const int64_t state = weights.size(0) / 3;
  check_bias(op, bias, state, input);
  check_state(op, old_h, "old_h", batch, state, input);
  check_state(op, old_cell, "old_cell", batch, state, input);
}

void check_cell_backward_args(const char* op, const at::Tensor& grad_h, const at::Tensor& grad_cell,
                              const at::Tensor& new_cell, const at::Tensor& gates, const at::Tensor& input,
                              const at::Tensor& weights, const at::Tensor& old_h) {
  check_rank(op, input, "input", 2, "(batch, input_features)");
  check_dtype(op, input);
  check_weights(op, weights, input, "input");
  const int64_t batch = input.size(0);
  const int64_t state = weights.size(0) / 3;
  const std::pair<const at::Tensor*, const char*> state_args[] = {
      {&grad_h, "grad_h"}, {&grad_cell, "grad_cell"}, {&new_cell, "new_cell"}, {&old_h, "old_h"}};
  for (const auto& [t, name] : state_args) {
    check_state(op, *t, name, batch, state, input);
  }
  check_rank(op, gates, "gates", 2, "(batch, 3 * state_size)");
  check_shape(op, gates, "gates", {batch, 3 * state}, "(batch, 3 * state_size)");
  check_like(op, gates, "gates", input, "input");
}

void check_seq_forward_args(const char* op, const at::Tensor& input, const at::Tensor& weights,
                            const std::optional<at::Tensor>& bias, const at::Tensor& h0, const at::Tensor& c0,
                            const std::optional<at::Tensor>& lengths) {
  check_rank(op, input, "input", 3, "(seq_len, batch, input_features)");
  check_dtype(op, input);
  check_weights(op, weights, input, "input");
  const int64_t batch = input.size(1);
  const int64_t state = weights.size(0) / 3;
  check_bias(op, bias, state, input);
  check_state(op, h0, "h0", batch, state, input);
  check_state(op, c0, "c0", batch, state, input);
  check_lengths(op, lengths, input.size(0), batch, input);
}

void check_seq_backward_args(const char* op, const std::optional<at::Tensor>& grad_output,
                             const std::optional<at::Tensor>& grad_h_n,
                             const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input,
                             const at::Tensor& weights, const at::Tensor& h0, const at::Tensor& c0,
                             const at::Tensor& output, const at::Tensor& gates,
                             const std::optional<at::Tensor>& lengths) {
  check_rank(op, input, "input", 3, "(seq_len, batch, input_features)");
  check_dtype(op, input);
  check_weights(op, weights, input, "input");
  const int64_t steps = input.size(0);
  const int64_t batch = input.size(1);
  const int64_t state = weights.size(0) / 3;
  check_state(op, h0, "h0", batch, state, input);
  check_state(op, c0, "c0", batch, state, input);
  for (const auto& [t, name] :
       {std::pair<const std::optional<at::Tensor>*, const char*>{&grad_h_n, "grad_h_n"},
        {&grad_c_n, "grad_c_n"}}) {
    if (t->has_value() && (*t)->defined()) {
      check_state(op, **t, name, batch, state, input);
    }
  }
  const char* layout = "(seq_len, batch, state_size)";
  check_rank(op, output, "output", 3, layout);
  check_shape(op, output, "output", {steps, batch, state}, layout);
  check_like(op, output, "output", input, "input");
  if (grad_output.has_value() && grad_output->defined()) {
    check_rank(op, *grad_output, "grad_output", 3, layout);
    check_shape(op, *grad_output, "grad_output", {steps, batch, state}, layout);
    check_like(op, *grad_output, "grad_output", input, "input");
  }
  check_rank(op, gates, "gates", 3, "(seq_len, batch, 3 * state_size)");
  check_shape(op, gates, "gates", {steps, batch, 3 * state}, "(seq_len, batch, 3 * state_size)");
  check_like(op, gates, "gates", input, "input");
  check_lengths(op, lengths, steps, batch, input);
}

}  // namespace lltm

// ---------------------------------------------------------------- the seam's cells

namespace lltm {
namespace {

// "(G * hidden_size, input_size)" with G spelled out, for messages.
std::string gate_rows(const CellShape& cell) { return std::to_string(cell.gates) + " * hidden_size"; }

void check_rnn_weights(const char* op, const CellShape& cell, const at::Tensor& input, const at::Tensor& w_ih,
                       const at::Tensor& w_hh) {
  const std::string rows = gate_rows(cell);
  const std::string ih = "(" + rows + ", input_size)", hh = "(" + rows + ", hidden_size)";
  check_rank(op, w_hh, "weight_hh", 2, hh.c_str());
  TORCH_CHECK_VALUE(w_hh.size(0) == cell.gates * w_hh.size(1), op, ": expected weight_hh of shape ", hh, " (",
                    cell.name, " has ", cell.gates, " gates), but got ", w_hh.sizes());
  check_like(op, w_hh, "weight_hh", input, "input");
  check_rank(op, w_ih, "weight_ih", 2, ih.c_str());
  TORCH_CHECK_VALUE(w_ih.size(0) == w_hh.size(0), op, ": expected weight_ih of shape ", ih, " with ",
                    w_hh.size(0), " rows like weight_hh, but got ", w_ih.sizes());
  TORCH_CHECK_VALUE(w_ih.size(1) == input.size(-1), op, ": expected input with ", w_ih.size(1),
                    " input features (weight_ih.size(1)), but got input of shape ", input.sizes());
  check_like(op, w_ih, "weight_ih", input, "input");
}

void check_rnn_bias(const char* op, const CellShape& cell, const OptTensor& bias, const char* name,
                    int64_t hidden, const at::Tensor& input) {
  if (!bias.has_value() || !bias->defined()) return;
  const std::string layout = "(" + gate_rows(cell) + ",)";
  check_rank(op, *bias, name, 1, layout.c_str());
  check_shape(op, *bias, name, {cell.gates * hidden}, layout.c_str());
  check_like(op, *bias, name, input, "input");
}

void check_rnn_state(const char* op, const CellShape& cell, at::TensorList state, const char* name,
                     int64_t batch, int64_t hidden, const at::Tensor& input) {
  TORCH_CHECK_VALUE(static_cast<int>(state.size()) == cell.states, op, ": expected ", name, " to hold ",
                    cell.states, " tensor(s) (", cell.name, "'s states), but got ", state.size());
  for (size_t s = 0; s < state.size(); ++s) {
    const std::string entry = std::string(name) + "[" + std::to_string(s) + "]";
    check_rank(op, state[s], entry.c_str(), 2, "(batch, hidden_size)");
    check_shape(op, state[s], entry.c_str(), {batch, hidden}, "(batch, hidden_size)");
    check_like(op, state[s], entry.c_str(), input, "input");
  }
}

}  // namespace

void check_rnn_forward_args(const char* op, const CellShape& cell, const at::Tensor& input,
                            const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                            const OptTensor& bias_ih, const OptTensor& bias_hh, at::TensorList state,
                            const OptTensor& lengths) {
  check_rank(op, input, "input", 3, "(seq_len, batch, input_size)");
  check_dtype(op, input);
  check_rnn_weights(op, cell, input, weight_ih, weight_hh);
  const int64_t batch = input.size(1), hidden = weight_hh.size(1);
  check_rnn_bias(op, cell, bias_ih, "bias_ih", hidden, input);
  check_rnn_bias(op, cell, bias_hh, "bias_hh", hidden, input);
  check_rnn_state(op, cell, state, "state", batch, hidden, input);
  check_lengths(op, lengths, input.size(0), batch, input);
}

void check_rnn_backward_args(const char* op, const CellShape& cell, const OptTensor& grad_output,
                             const OptTensorList& grad_state_n, const at::Tensor& input,
                             const at::Tensor& weight_ih, const at::Tensor& weight_hh, at::TensorList state,
                             const at::Tensor& output, const at::Tensor& saved, const OptTensor& lengths) {
  check_rank(op, input, "input", 3, "(seq_len, batch, input_size)");
  check_dtype(op, input);
  check_rnn_weights(op, cell, input, weight_ih, weight_hh);
  const int64_t steps = input.size(0), batch = input.size(1), hidden = weight_hh.size(1);
  check_rnn_state(op, cell, state, "state", batch, hidden, input);
  TORCH_CHECK_VALUE(static_cast<int>(grad_state_n.size()) == cell.states, op,
                    ": expected grad_state_n to hold ", cell.states, " entries (tensor or None), but got ",
                    grad_state_n.size());
  for (size_t s = 0; s < grad_state_n.size(); ++s) {
    const std::optional<at::Tensor> g = grad_state_n.get(s);
    if (!g.has_value() || !g->defined()) continue;
    const std::string entry = "grad_state_n[" + std::to_string(s) + "]";
    check_rank(op, *g, entry.c_str(), 2, "(batch, hidden_size)");
    check_shape(op, *g, entry.c_str(), {batch, hidden}, "(batch, hidden_size)");
    check_like(op, *g, entry.c_str(), input, "input");
  }
  const char* layout = "(seq_len, batch, hidden_size)";
  check_rank(op, output, "output", 3, layout);
  check_shape(op, output, "output", {steps, batch, hidden}, layout);
  check_like(op, output, "output", input, "input");
  if (grad_output.has_value() && grad_output->defined()) {
    check_rank(op, *grad_output, "grad_output", 3, layout);
    check_shape(op, *grad_output, "grad_output", {steps, batch, hidden}, layout);
    check_like(op, *grad_output, "grad_output", input, "input");
  }
  const std::string saved_layout = "(seq_len, batch, " + std::to_string(cell.saved) + " * hidden_size)";
  check_rank(op, saved, "saved", 3, saved_layout.c_str());
  check_shape(op, saved, "saved", {steps, batch, cell.saved * hidden}, saved_layout.c_str());
  check_like(op, saved, "saved", input, "input");
  check_lengths(op, lengths, steps, batch, input);
}

}  // namespace lltm
