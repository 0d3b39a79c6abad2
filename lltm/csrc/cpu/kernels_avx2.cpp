// The fused CPU kernels compiled for AVX2 + FMA (8 floats per vector, Sleef's
// vectorised exp / expm1 / tanh from libtorch), used where torch itself runs
// with CPU capability AVX2 (see kernels.h). Only GCC on x86-64 can switch
// the instruction set inside a file; elsewhere this build is absent.
// (before any header: the cells' functions inline into the step kernels, cells/cell.h)
#define LLTM_CELL_ALWAYS_INLINE 1
#include "baseline_headers.h"
#include "kernels_file.h"
// the instruction set switch, after every header that keeps the baseline one
#include "target_avx2.h"
#ifdef LLTM_HAVE_AVX2_BUILD
#include "step_kernels.h"
#endif

namespace lltm {
namespace cpu {

Kernels LLTM_KERNELS_FN(avx2)(int cell, c10::ScalarType dtype) {
#ifdef LLTM_HAVE_AVX2_BUILD
  return AVX2::kernels_for<LLTM_KERNELS_DTYPES>(cell, dtype);
#else
  (void)cell;
  (void)dtype;
  return {};
#endif
}

}  // namespace cpu
}  // namespace lltm
