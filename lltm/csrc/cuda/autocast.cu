// Autocast rules of the forward operators on CUDA, for every backend.
//
// Under torch.autocast("cuda") the cell and the layer run in the autocast
// dtype (float16 or bfloat16, whatever the context asks for), like
// nn.Linear and nn.LSTM: their cost is GEMMs. Floating-point CUDA inputs are
// cast (weights through autocast's cache, so a parameter is cast once per
// autocast region); float64 inputs and the integer lengths are left alone,
// as autocast does for every op. Outputs come back in the autocast dtype.
// Backward ops need no rule: their inputs are the forward's outputs and
// saved tensors, already in that dtype.
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "../autograd_common.h"
#include "../lltm.h"

namespace lltm {
namespace {

using OptTensor = std::optional<at::Tensor>;
using CellSig = CellForwardResult(const at::Tensor&, const at::Tensor&,
                                  const OptTensor&, const at::Tensor&,
                                  const at::Tensor&);
using SeqSig = SeqForwardResult(const at::Tensor&, const at::Tensor&,
                                const OptTensor&, const at::Tensor&,
                                const at::Tensor&, const OptTensor&);

constexpr auto kCuda = c10::DeviceType::CUDA;

template <typename T>
T cast(const T& t) {
  return at::autocast::cached_cast(at::autocast::get_autocast_dtype(at::kCUDA),
                                   t, kCuda);
}

template <std::size_t kBackend>
CellForwardResult cell_autocast(const at::Tensor& input,
                                const at::Tensor& weights,
                                const OptTensor& bias, const at::Tensor& old_h,
                                const at::Tensor& old_cell) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow(op_name(kBackend, "cell_forward").c_str(), "")
          .typed<CellSig>();
  c10::impl::ExcludeDispatchKeyGuard no_autocast(
      c10::DispatchKey::AutocastCUDA);
  return op.call(cast(input), cast(weights), cast(bias), cast(old_h),
                 cast(old_cell));
}

template <std::size_t kBackend>
SeqForwardResult seq_autocast(const at::Tensor& input,
                              const at::Tensor& weights, const OptTensor& bias,
                              const at::Tensor& h0, const at::Tensor& c0,
                              const OptTensor& lengths) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow(op_name(kBackend, "seq_forward").c_str(), "")
          .typed<SeqSig>();
  c10::impl::ExcludeDispatchKeyGuard no_autocast(
      c10::DispatchKey::AutocastCUDA);
  return op.call(cast(input), cast(weights), cast(bias), cast(h0), cast(c0),
                 lengths);
}

}  // namespace
}  // namespace lltm

TORCH_LIBRARY_IMPL(lltm, AutocastCUDA, m) {
  lltm::for_each_backend([&](auto backend) {
    constexpr std::size_t b = decltype(backend)::value;
    const std::string name = lltm::kCompiledBackends[b];
    m.impl((name + "_cell_forward").c_str(), &lltm::cell_autocast<b>);
    m.impl((name + "_seq_forward").c_str(), &lltm::seq_autocast<b>);
  });
}
