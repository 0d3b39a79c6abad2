// The one function of a kernels_<capability>.cpp file (kernels.h):
// kernels_<capability>, float and double; or, where
// kernels_<capability>_half.cpp compiles the same file again with
// LLTM_KERNELS_HALF_TYPES defined, kernels_<capability>_half, bfloat16 and
// half. Two files a capability because a build compiles its files in
// parallel, and each capability's file of all four dtypes was the longest of
// the build (AVX-512: 150 s of g++ -O3, against 68 s and 81 s for the two).
#pragma once

#ifdef LLTM_KERNELS_HALF_TYPES
#define LLTM_KERNELS_FN(capability) kernels_##capability##_half
#define LLTM_KERNELS_DTYPES ::lltm::cpu::Dtypes::kHalves
#else
#define LLTM_KERNELS_FN(capability) kernels_##capability
#define LLTM_KERNELS_DTYPES ::lltm::cpu::Dtypes::kFloats
#endif
