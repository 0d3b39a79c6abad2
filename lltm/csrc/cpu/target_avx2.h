// Switches the rest of the including file to the instruction set of torch's
// CPU capability AVX2 (avx2,fma,f16c) and names the kernels' namespace after it
// (CPU_CAPABILITY, as torch's own per-capability files do), defining
// LLTM_HAVE_AVX2_BUILD. Only GCC on x86-64 can switch the instruction set
// inside a file; elsewhere this defines nothing. Included after every header
// that must keep the baseline instruction set (baseline_headers.h), by
// kernels_avx2.cpp and by the source of a cell of lltm.cells.define. No
// include guard: it acts on the file that includes it.
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
#endif
