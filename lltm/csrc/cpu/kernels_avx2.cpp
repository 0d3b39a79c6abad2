// The fused CPU kernels compiled for AVX2 + FMA (8 floats per vector, Sleef's
// vectorised exp / expm1 / tanh from libtorch), used where torch itself runs
// with CPU capability AVX2 (see kernels.h). Only GCC on x86-64 can switch
// the instruction set inside a file; elsewhere this build is absent.
#include "baseline_headers.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LLTM_HAVE_AVX2_BUILD 1
#pragma GCC target("avx2,fma,f16c")
// g++ switches code generation at the pragma but does not define the ISA
// macros for it (its C++ front end has read the file ahead); sleef.h
// declares its vector functions only under them.
#ifndef __AVX__
#define __AVX__ 1
#endif
#ifndef __AVX2__
#define __AVX2__ 1
#endif
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#include "step_kernels.h"
#endif

namespace lltm {
namespace cpu {

Kernels kernels_avx2(int cell, c10::ScalarType dtype) {
#ifdef LLTM_HAVE_AVX2_BUILD
  return AVX2::kernels_for(cell, dtype);
#else
  (void)cell;
  (void)dtype;
  return {};
#endif
}

}  // namespace cpu
}  // namespace lltm
