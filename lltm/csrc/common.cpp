// Argument checks shared by every compiled backend. Wrong shapes raise
// ValueError, wrong dtypes TypeError and device mixes RuntimeError in Python;
// lltm/_checks.py raises the same for the pure-PyTorch backend.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "lltm.h"

namespace lltm {
namespace {

bool is_supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf ||
         t == at::kBFloat16;
}

void check_rank(const char* op, const at::Tensor& t, const char* name,
                int64_t rank, const char* layout) {
  TORCH_CHECK_VALUE(t.defined(), op, ": ", name, " is undefined; expected a tensor ",
              layout);
  TORCH_CHECK_TYPE(t.layout() == at::kStrided, op, ": expected ", name,
                   " to be a dense (strided) tensor, but got layout ",
                   t.layout(), " (call .to_dense())");
  TORCH_CHECK_VALUE(t.dim() == rank, op, ": expected ", name, " to be a ", rank,
              "-D tensor ", layout, ", but got a ", t.dim(),
              "-D tensor of shape ", t.sizes());
}

void check_shape(const char* op, const at::Tensor& t, const char* name,
                 at::IntArrayRef expected, const char* layout) {
  TORCH_CHECK_VALUE(t.sizes() == expected, op, ": expected ", name, " of shape ",
              layout, " = ", expected, ", but got ", t.sizes());
}

// All tensors share the dtype and device of `ref` (the first argument).
void check_like(const char* op, const at::Tensor& t, const char* name,
                const at::Tensor& ref, const char* ref_name) {
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), op, ": expected ", name,
              " to have dtype ", ref.scalar_type(), " like ", ref_name,
              ", but got ", t.scalar_type(),
              " (cast all arguments to one dtype)");
  TORCH_CHECK(t.device() == ref.device(), op, ": expected ", name,
              " on device ", ref.device(), " like ", ref_name, ", but got ",
              t.device(), " (move all arguments to one device)");
}

// Weights (3S, S + I) fix the input width I: a wrong one names the input and
// the feature count the weights expect (the weights are blamed by the shape
// check that follows only when no input width could fit them).
void check_input_width(const char* op, const at::Tensor& input,
                       const at::Tensor& weights) {
  const int64_t state = weights.size(0) / 3;
  const int64_t expected = weights.size(1) - state;
  TORCH_CHECK_VALUE(expected < 0 || input.size(1) == expected, op,
                    ": expected input of shape (batch, input_features) = [",
                    input.size(0), ", ", expected, "] (weights ", weights.sizes(),
                    " are for state_size ", state, " and ", expected,
                    " input features), but got ", input.sizes());
}

}  // namespace

void check_cell_forward_args(const char* op, const at::Tensor& input,
                             const at::Tensor& weights,
                             const std::optional<at::Tensor>& bias,
                             const at::Tensor& old_h,
                             const at::Tensor& old_cell) {
  check_rank(op, input, "input", 2, "(batch, input_features)");
  TORCH_CHECK_TYPE(is_supported_dtype(input.scalar_type()), op,
              ": expected input of a floating dtype (float32, float64, "
              "float16 or bfloat16), but got ",
              input.scalar_type());
  check_rank(op, weights, "weights", 2,
             "(3 * state_size, state_size + input_features)");
  TORCH_CHECK_VALUE(weights.size(0) % 3 == 0, op,
              ": expected weights.size(0) to be 3 * state_size, but got ",
              weights.size(0), " (not a multiple of 3)");
  const int64_t batch = input.size(0);
  const int64_t features = input.size(1);
  const int64_t state = weights.size(0) / 3;
  check_input_width(op, input, weights);
  check_shape(op, weights, "weights", {3 * state, state + features},
              "(3 * state_size, state_size + input_features)");
  check_like(op, weights, "weights", input, "input");
  if (bias.has_value() && bias->defined()) {
    check_rank(op, *bias, "bias", 1, "(3 * state_size,)");
    check_shape(op, *bias, "bias", {3 * state}, "(3 * state_size,)");
    check_like(op, *bias, "bias", input, "input");
  }
  check_rank(op, old_h, "old_h", 2, "(batch, state_size)");
  check_shape(op, old_h, "old_h", {batch, state}, "(batch, state_size)");
  check_like(op, old_h, "old_h", input, "input");
  check_rank(op, old_cell, "old_cell", 2, "(batch, state_size)");
  check_shape(op, old_cell, "old_cell", {batch, state}, "(batch, state_size)");
  check_like(op, old_cell, "old_cell", input, "input");
}

void check_cell_backward_args(const char* op, const at::Tensor& grad_h,
                              const at::Tensor& grad_cell,
                              const at::Tensor& new_cell,
                              const at::Tensor& gates, const at::Tensor& input,
                              const at::Tensor& weights,
                              const at::Tensor& old_h) {
  check_rank(op, input, "input", 2, "(batch, input_features)");
  TORCH_CHECK_TYPE(is_supported_dtype(input.scalar_type()), op,
              ": expected input of a floating dtype (float32, float64, "
              "float16 or bfloat16), but got ",
              input.scalar_type());
  check_rank(op, weights, "weights", 2,
             "(3 * state_size, state_size + input_features)");
  const int64_t batch = input.size(0);
  const int64_t features = input.size(1);
  const int64_t state = weights.size(0) / 3;
  check_input_width(op, input, weights);
  check_shape(op, weights, "weights", {3 * state, state + features},
              "(3 * state_size, state_size + input_features)");
  check_like(op, weights, "weights", input, "input");
  const std::pair<const at::Tensor*, const char*> state_args[] = {
      {&grad_h, "grad_h"}, {&grad_cell, "grad_cell"},
      {&new_cell, "new_cell"}, {&old_h, "old_h"}};
  for (const auto& [t, name] : state_args) {
    check_rank(op, *t, name, 2, "(batch, state_size)");
    check_shape(op, *t, name, {batch, state}, "(batch, state_size)");
    check_like(op, *t, name, input, "input");
  }
  check_rank(op, gates, "gates", 2, "(batch, 3 * state_size)");
  check_shape(op, gates, "gates", {batch, 3 * state},
              "(batch, 3 * state_size)");
  check_like(op, gates, "gates", input, "input");
}

}  // namespace lltm
