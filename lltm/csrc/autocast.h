// Autocast rules of the forward operators, for every backend and a given
// autocast device (registered for CPU in autocast_cpu.cpp, for CUDA in
// autocast_cuda.cu).
//
// Under torch.autocast the cell and the layer run in the autocast dtype
// (bfloat16 or float16, whatever the context asks for), like nn.Linear and
// nn.LSTM: their cost is GEMMs. Floating-point inputs on the autocast device
// are cast (weights through autocast's cache, so a parameter is cast once per
// autocast region); float64 inputs and the integer lengths are left alone, as
// autocast does for every op. Outputs come back in the autocast dtype.
// Backward ops need no rule: their inputs are the forward's outputs and saved
// tensors, already in that dtype.
#pragma once

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <string>

#include "backends.h"
#include "lltm.h"

namespace lltm {
namespace autocast_detail {

template <c10::DeviceType kDevice, typename T>
T cast(const T& t) {
  return at::autocast::cached_cast(at::autocast::get_autocast_dtype(kDevice), t, kDevice);
}

template <c10::DeviceType kDevice>
constexpr c10::DispatchKey autocast_key() {
  return kDevice == c10::DeviceType::CUDA ? c10::DispatchKey::AutocastCUDA : c10::DispatchKey::AutocastCPU;
}

template <c10::DeviceType kDevice, std::size_t kBackend>
CellForwardResult cell_autocast(const at::Tensor& input, const at::Tensor& weights, const OptTensor& bias,
                                const at::Tensor& old_h, const at::Tensor& old_cell) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow(op_name(kBackend, "cell_forward").c_str(), "")
                             .typed<CellForwardSig>();
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key<kDevice>());
  return op.call(cast<kDevice>(input), cast<kDevice>(weights), cast<kDevice>(bias), cast<kDevice>(old_h),
                 cast<kDevice>(old_cell));
}

template <c10::DeviceType kDevice, std::size_t kBackend>
SeqForwardResult seq_autocast(const at::Tensor& input, const at::Tensor& weights, const OptTensor& bias,
                              const at::Tensor& h0, const at::Tensor& c0, const OptTensor& lengths) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow(op_name(kBackend, "seq_forward").c_str(), "")
                             .typed<SeqForwardSig>();
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key<kDevice>());
  return op.call(cast<kDevice>(input), cast<kDevice>(weights), cast<kDevice>(bias), cast<kDevice>(h0),
                 cast<kDevice>(c0), lengths);
}

// Registers the rules of every backend's forward operators.
template <c10::DeviceType kDevice>
void register_autocast(torch::Library& m) {
  for_each_backend([&](auto backend) {
    constexpr std::size_t b = decltype(backend)::value;
    const std::string name = backend_name(b);
    m.impl((name + "_cell_forward").c_str(), &cell_autocast<kDevice, b>);
    m.impl((name + "_seq_forward").c_str(), &seq_autocast<kDevice, b>);
  });
}

}  // namespace autocast_detail
}  // namespace lltm
