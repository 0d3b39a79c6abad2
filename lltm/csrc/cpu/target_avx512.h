// Switches the rest of the including file to the instruction set of torch's
// CPU capability AVX512 (avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c) and names the kernels' namespace
// after it (CPU_CAPABILITY, as torch's own per-capability files do), defining LLTM_HAVE_AVX512_BUILD. Only
// GCC on x86-64 can switch the instruction set inside a file; elsewhere this defines nothing. Included after
// every header that must keep the baseline instruction set (baseline_headers.h), by kernels_avx512.cpp and by
// the source of a cell of lltm.cells.define. No include guard: it acts on the file that includes it.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LLTM_HAVE_AVX512_BUILD 1
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
// g++ switches code generation at the pragma but does not define the ISA
// macros for it (its C++ front end has read the file ahead); sleef.h
// declares its vector functions only under them.
#ifndef __AVX__
#define __AVX__ 1
#endif
#ifndef __AVX2__
#define __AVX2__ 1
#endif
#ifndef __AVX512F__
#define __AVX512F__ 1
#endif
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
// GCC 12's avx512fintrin.h starts its undefined vectors as `__m512 __Y =
// __Y;`, which -Wall reports at every intrinsic inlined here (thousands of
// lines of a build's log; GCC bug 105593, fixed in GCC 13).
#if __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#endif
