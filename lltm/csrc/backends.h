// The compiled backends, as lltm/_registry.py lists them (the one list of
// backends): both build modes pass their names, in order, as
//   -DLLTM_COMPILED_BACKENDS=aten:fused
// (lltm/_sources.py). The schemas (ops.cpp), the autograd registrations
// (autograd_*.cpp) and the autocast rules (autocast.h) are made for each;
// lltm::_compiled_backends returns them, and lltm/_extension.py refuses a
// library built with another list. Adding a backend: its entry in the
// registry, and its kernel folder.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#ifndef LLTM_COMPILED_BACKENDS
#error "LLTM_COMPILED_BACKENDS is defined by the build: see lltm/_sources.py"
#endif

namespace lltm {
namespace backends_detail {

#define LLTM_STRINGIFY_BACKENDS_(...) #__VA_ARGS__
#define LLTM_STRINGIFY_BACKENDS(...) LLTM_STRINGIFY_BACKENDS_(__VA_ARGS__)
inline constexpr std::string_view kList = LLTM_STRINGIFY_BACKENDS(LLTM_COMPILED_BACKENDS);

constexpr std::size_t count(std::string_view list) {
  std::size_t n = 1;
  for (char c : list) n += c == ':';
  return n;
}

template <std::size_t N>
constexpr std::array<std::string_view, N> split(std::string_view list) {
  std::array<std::string_view, N> names{};
  for (std::size_t i = 0; i < N; ++i) {
    const std::size_t end = list.find(':');
    names[i] = list.substr(0, end);
    list = end == std::string_view::npos ? std::string_view() : list.substr(end + 1);
  }
  return names;
}

}  // namespace backends_detail

// Every compiled backend has the same four operators,
// lltm::<backend>_{cell,seq}_{forward,backward}.
inline constexpr std::size_t kNumCompiledBackends = backends_detail::count(backends_detail::kList);
inline constexpr std::array<std::string_view, kNumCompiledBackends> kCompiledBackends =
    backends_detail::split<kNumCompiledBackends>(backends_detail::kList);

inline std::string backend_name(std::size_t backend) { return std::string(kCompiledBackends[backend]); }

// "lltm::<backend>_<what>", e.g. op_name(0, "cell_forward").
inline std::string op_name(std::size_t backend, const char* what) {
  return "lltm::" + backend_name(backend) + "_" + what;
}

// Calls f(std::integral_constant<std::size_t, I>{}) for every backend index I
// (a compile-time constant: the autograd and autocast kernels are templates
// on it).
template <typename F, std::size_t... I>
void for_each_backend_impl(F&& f, std::index_sequence<I...>) {
  (f(std::integral_constant<std::size_t, I>{}), ...);
}
template <typename F>
void for_each_backend(F&& f) {
  for_each_backend_impl(std::forward<F>(f), std::make_index_sequence<kNumCompiledBackends>{});
}

}  // namespace lltm
