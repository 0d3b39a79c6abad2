// Autocast rule of the cell operators on CUDA.
//
// Under torch.autocast("cuda") the cell runs in the autocast dtype (float16
// or bfloat16, whatever the context asks for), like nn.Linear: its cost is a
// GEMM. Floating-point CUDA inputs are cast (weights through autocast's
// cache, so a parameter is cast once per autocast region); float64 inputs
// are left alone, as autocast does for every op. Outputs come back in the
// autocast dtype. Backward ops need no rule: their inputs are the forward's
// outputs and saved tensors, already in that dtype.
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "../lltm.h"

namespace lltm {
namespace {

using ForwardSig = CellForwardResult(const at::Tensor&, const at::Tensor&,
                                     const std::optional<at::Tensor>&,
                                     const at::Tensor&, const at::Tensor&);

template <const char* kName>
CellForwardResult forward_autocast(const at::Tensor& input,
                                   const at::Tensor& weights,
                                   const std::optional<at::Tensor>& bias,
                                   const at::Tensor& old_h,
                                   const at::Tensor& old_cell) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow(kName, "")
                             .typed<ForwardSig>();
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  const at::ScalarType dtype = at::autocast::get_autocast_dtype(at::kCUDA);
  constexpr auto cuda = c10::DeviceType::CUDA;
  return op.call(at::autocast::cached_cast(dtype, input, cuda),
                 at::autocast::cached_cast(dtype, weights, cuda),
                 at::autocast::cached_cast(dtype, bias, cuda),
                 at::autocast::cached_cast(dtype, old_h, cuda),
                 at::autocast::cached_cast(dtype, old_cell, cuda));
}

constexpr char kFused[] = "lltm::fused_cell_forward";
constexpr char kAten[] = "lltm::aten_cell_forward";

}  // namespace
}  // namespace lltm

TORCH_LIBRARY_IMPL(lltm, AutocastCUDA, m) {
  m.impl("fused_cell_forward", &lltm::forward_autocast<lltm::kFused>);
  m.impl("aten_cell_forward", &lltm::forward_autocast<lltm::kAten>);
}
