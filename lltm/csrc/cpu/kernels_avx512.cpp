// The fused CPU kernels compiled for AVX-512 (F, BW, VL, DQ) + FMA: 16 floats
// per vector, Sleef's vectorised exp / expm1 / tanh from libtorch. Used where
// torch itself runs with CPU capability AVX512 (see kernels.h). Only GCC
// on x86-64 can switch the instruction set inside a file; elsewhere this
// build is absent.
// (before any header: the cells' functions inline into the step kernels, cells/cell.h)
#define LLTM_CELL_ALWAYS_INLINE 1
#include "baseline_headers.h"
#include "kernels_file.h"
// the instruction set switch, after every header that keeps the baseline one
#include "target_avx512.h"
#ifdef LLTM_HAVE_AVX512_BUILD
#include "step_kernels.h"
#endif

namespace lltm {
namespace cpu {

Kernels LLTM_KERNELS_FN(avx512)(int cell, c10::ScalarType dtype) {
#ifdef LLTM_HAVE_AVX512_BUILD
  return AVX512::kernels_for<LLTM_KERNELS_DTYPES>(cell, dtype);
#else
  (void)cell;
  (void)dtype;
  return {};
#endif
}

}  // namespace cpu
}  // namespace lltm
