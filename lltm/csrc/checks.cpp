// Argument checks shared by every compiled backend. Wrong shapes raise
// ValueError, wrong dtypes TypeError and device mixes RuntimeError in Python;
// lltm/_checks.py raises the same for the pure-PyTorch backend.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "lltm.h"

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
