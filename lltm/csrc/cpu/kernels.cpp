// Run-time choice of the fused CPU kernels: the build matching the CPU
// capability torch itself uses (at::get_cpu_capability(): the best the CPU
// supports, or the one ATEN_CPU_CAPABILITY asks for), falling back to a
// narrower build where a wider one is absent.
#include "kernels.h"

#include <ATen/Version.h>
#include <torch/library.h>

#include <string>

namespace lltm {
namespace cpu {
namespace {

enum class Capability { kDefault, kAvx2, kAvx512 };

Capability torch_capability() {
  static const Capability cap = [] {
    const std::string name = at::get_cpu_capability();
    if (name == "AVX512") return Capability::kAvx512;
    if (name == "AVX2") return Capability::kAvx2;
    return Capability::kDefault;
  }();
  return cap;
}

Capability usable_capability() {
  static const Capability cap = [] {
    Capability c = torch_capability();
    if (c == Capability::kAvx512 && kernels_avx512(0, c10::ScalarType::Float).forward == nullptr) {
      c = Capability::kAvx2;
    }
    if (c == Capability::kAvx2 && kernels_avx2(0, c10::ScalarType::Float).forward == nullptr) {
      c = Capability::kDefault;
    }
    return c;
  }();
  return cap;
}

}  // namespace

Kernels kernels_for_dtype(int cell, c10::ScalarType dtype) {
  const bool half = c10::isReducedFloatingType(dtype);  // bfloat16 and half (other types: no kernels)
  switch (usable_capability()) {
    case Capability::kAvx512:
      return half ? kernels_avx512_half(cell, dtype) : kernels_avx512(cell, dtype);
    case Capability::kAvx2:
      return half ? kernels_avx2_half(cell, dtype) : kernels_avx2(cell, dtype);
    default:
      return half ? kernels_default_half(cell, dtype) : kernels_default(cell, dtype);
  }
}

const char* kernels_capability() {
  switch (usable_capability()) {
    case Capability::kAvx512:
      return "avx512";
    case Capability::kAvx2:
      return "avx2";
    default:
      return "default";
  }
}

}  // namespace cpu
}  // namespace lltm

// Which build of the kernels runs in this process: "avx512", "avx2" or
// "default" (tests check that ATEN_CPU_CAPABILITY reaches every build).
TORCH_LIBRARY_FRAGMENT(lltm, m) {
  m.def("_fused_cpu_capability() -> str", [] { return std::string(lltm::cpu::kernels_capability()); });
}
