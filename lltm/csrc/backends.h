// The compiled backends and operator families, written once. The schemas
// (ops.cpp), the autograd registrations (autograd_*.cpp) and the autocast
// rules (cuda/autocast.cu) are generated from these lists; Python reads them
// back through lltm::_compiled_backends (lltm/_backends.py), so adding a
// backend means one entry here plus its kernel folder.
#pragma once

#include <array>
#include <cstddef>
#include <string>

namespace lltm {

// Every compiled backend has the same four operators,
// lltm::<backend>_{cell,seq}_{forward,backward}.
inline constexpr std::array<const char*, 2> kCompiledBackends = {"aten",
                                                                 "fused"};
inline constexpr std::size_t kNumCompiledBackends = kCompiledBackends.size();

// "lltm::<backend>_<what>", e.g. op_name(0, "cell_forward").
inline std::string op_name(std::size_t backend, const char* what) {
  return std::string("lltm::") + kCompiledBackends[backend] + "_" + what;
}

}  // namespace lltm
