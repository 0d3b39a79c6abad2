// The fused CPU passes with the baseline instruction set (x86-64: SSE2), the
// fallback on every CPU and the only build on other architectures and
// compilers (see pointwise.h).
#include "baseline_headers.h"

#define CPU_CAPABILITY DEFAULT
#include "cell_math.h"

namespace lltm {
namespace cpu {

PointwiseKernels pointwise_default(c10::ScalarType dtype) {
  return DEFAULT::kernels_for(dtype);
}

}  // namespace cpu
}  // namespace lltm
