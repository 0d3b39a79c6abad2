// Pieces shared by the autograd formulas of the cell and sequence operators.
#pragma once

#include <ATen/core/grad_mode.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/basic_ops.h>

#include <cstddef>
#include <memory>
#include <string>
#include <tuple>

#include "backends.h"
#include "lltm.h"

namespace lltm {

// The backward operators are hand-derived formulas, not differentiable
// themselves. Under create_graph=True (double backward, Hessians) the
// gradients are returned wrapped like torch.autograd.function's
// once_differentiable: using them is fine, differentiating them raises an
// error that says so and names the backend that can (python).
inline torch::autograd::variable_list once_differentiable(torch::autograd::variable_list grads,
                                                          const std::string& backend) {
  if (!at::GradMode::is_enabled()) return grads;
  const std::string msg = "lltm: backend '" + backend +
                          "' does not support double backward (differentiating its gradients, "
                          "e.g. create_graph=True then backward again, or a Hessian); use "
                          "backend='python' for that";
  torch::autograd::variable_list inputs;
  inputs.reserve(grads.size());
  for (const auto& g : grads) {
    // Detached copies that require grad, so the Error node attaches.
    inputs.push_back(g.defined() ? g.detach().requires_grad_(true) : g);
  }
  auto error = std::make_shared<torch::autograd::DelayedError>(msg, static_cast<int64_t>(inputs.size()));
  return error->apply(std::move(inputs));
}

inline torch::autograd::variable_list once_differentiable(torch::autograd::variable_list grads,
                                                          std::size_t backend) {
  return once_differentiable(std::move(grads), backend_name(backend));
}

// Which of the five gradients (input, weights, bias, state h, state c) the
// engine needs, for an op whose tensor arguments are (input, weights,
// bias?, h, c, ...). Edges exist only for tensor arguments: without a bias
// (forward saved "has_bias" = false), h and c are edges 2 and 3.
inline OutputMask needed_gradients(torch::autograd::AutogradContext* ctx) {
  const bool has_bias = ctx->saved_data["has_bias"].toBool();
  const size_t state_edge = has_bias ? 3 : 2;
  return {ctx->needs_input_grad(0), ctx->needs_input_grad(1), has_bias && ctx->needs_input_grad(2),
          ctx->needs_input_grad(state_edge), ctx->needs_input_grad(state_edge + 1)};
}

// The five gradients as autograd wants them: undefined where not asked for
// (the op returned an empty placeholder there).
inline torch::autograd::variable_list asked_only(
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>&& grads, const OutputMask& mask) {
  auto& [g0, g1, g2, g3, g4] = grads;
  torch::autograd::variable_list out = {g0, g1, g2, g3, g4};
  for (size_t i = 0; i < out.size(); ++i) {
    if (!mask[i]) out[i] = at::Tensor();
  }
  return out;
}

}  // namespace lltm
