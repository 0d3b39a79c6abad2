// The fused CPU kernels with the baseline instruction set (x86-64: SSE2), the
// fallback on every CPU and the only build on other architectures and
// compilers (see kernels.h).
// (before any header: the cells' functions inline into the step kernels, cells/cell.h)
#define LLTM_CELL_ALWAYS_INLINE 1
#include "baseline_headers.h"
#include "kernels_file.h"

#define CPU_CAPABILITY DEFAULT
#include "step_kernels.h"

namespace lltm {
namespace cpu {

Kernels LLTM_KERNELS_FN(default)(int cell, c10::ScalarType dtype) {
  return DEFAULT::kernels_for<LLTM_KERNELS_DTYPES>(cell, dtype);
}

}  // namespace cpu
}  // namespace lltm
