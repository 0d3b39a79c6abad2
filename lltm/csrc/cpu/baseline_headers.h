// Headers that the kernels_<capability>.cpp files include before they
// switch the instruction set (#pragma GCC target): inline functions and
// templates declared here keep the baseline instruction set, so a copy of
// them emitted by an AVX2 or AVX-512 file is safe on every CPU, whichever
// copy the linker keeps. Only at::vec (namespaced by CPU_CAPABILITY) and
// the kernels (cell_math.h, gemm.h, step_kernels.h) are compiled with the
// wider instruction sets.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/core/ScalarType.h>
#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/util/complex.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels.h"
