// Headers that the kernels_<capability>.cpp files include before they
// switch the instruction set (#pragma GCC target): inline functions and
// templates declared here keep the baseline instruction set, so a copy of
// them emitted by an AVX2 or AVX-512 file is safe on every CPU, whichever
// copy the linker keeps. Only at::vec (namespaced by CPU_CAPABILITY), the
// kernels (cell_math.h, gemm.h, step_kernels.h) and the cells' code
// (cells/*.h: templates instantiated on each build's own vector types, so
// their symbols differ per build) are compiled with the wider instruction
// sets: no cell header may be included here.
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
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels.h"
