// kernels_avx2.cpp again, for bfloat16 and half (kernels_file.h).
#define LLTM_KERNELS_HALF_TYPES 1
#include "kernels_avx2.cpp"
