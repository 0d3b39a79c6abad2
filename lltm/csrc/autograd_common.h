// Pieces shared by the autograd formulas of the cell and sequence operators.
#pragma once

#include <ATen/core/grad_mode.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/basic_ops.h>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "backends.h"

namespace lltm {

// The backward operators are hand-derived formulas, not differentiable
// themselves. Under create_graph=True (double backward, Hessians) the
// gradients are returned wrapped like torch.autograd.function's
// once_differentiable: using them is fine, differentiating them raises an
// error that says so and names the backend that can (python).
inline torch::autograd::variable_list once_differentiable(
    torch::autograd::variable_list grads, std::size_t backend) {
  if (!at::GradMode::is_enabled()) return grads;
  const std::string msg =
      std::string("lltm: backend '") + kCompiledBackends[backend] +
      "' does not support double backward (differentiating its gradients, "
      "e.g. create_graph=True then backward again, or a Hessian); use "
      "backend='python' for that";
  torch::autograd::variable_list inputs;
  inputs.reserve(grads.size());
  for (const auto& g : grads) {
    // Detached copies that require grad, so the Error node attaches.
    inputs.push_back(g.defined() ? g.detach().requires_grad_(true) : g);
  }
  auto error = std::make_shared<torch::autograd::DelayedError>(
      msg, static_cast<int64_t>(inputs.size()));
  return error->apply(std::move(inputs));
}

// Calls f(std::integral_constant<std::size_t, I>{}) for every backend index.
template <typename F, std::size_t... I>
void for_each_backend_impl(F&& f, std::index_sequence<I...>) {
  (f(std::integral_constant<std::size_t, I>{}), ...);
}
template <typename F>
void for_each_backend(F&& f) {
  for_each_backend_impl(std::forward<F>(f),
                        std::make_index_sequence<kNumCompiledBackends>{});
}

}  // namespace lltm
