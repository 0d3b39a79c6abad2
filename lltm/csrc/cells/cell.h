// The cell seam: what a recurrent cell declares, once, for every backend.
//
// A cell is a traits struct (one header per cell in this folder, listed in
// registry.h). Every kernel (CUDA persistent, CUDA step loop, fused CPU,
// ATen) and the host code around it (planner, operators, autograd, checks)
// is written against this contract and takes the cell as a template
// parameter; nothing outside the cell's header knows its gates or its math.
//
// Per step and unit j of a layer with state size S and G gates:
//   zx[g] = x_t W_ih[g S + j, :]^T     + b_ih[g S + j]
//   zh[g] = h_{t-1} W_hh[g S + j, :]^T + b_hh[g S + j]
// (W_ih (G S, I), W_hh (G S, S): torch's gate-major layout). The kernels keep
// zx and zh apart and hand both to the cell; a cell whose gates only need
// their sum (kSplit = false) may be given the sum in zx and 0 in zh.
//
// States: kStates values per unit carried from step to step, h first (the
// layer's output is h_t). The cell's forward returns the next states and
// kSaved values per unit that the backward needs (saved for all T steps,
// (T, B, kSaved S), value k of unit j at column k S + j). States other than
// h are not saved: `recompute` rebuilds them from the previous states and
// the saved values, one step at a time from the initial state.
//
// Backward of one step, given the gradient of the next states (dnext; h's
// includes the output's gradient), the previous and next states and the
// saved values: dzx[g] = d loss / d zx[g], dzh[g] = d loss / d zh[g], and the
// direct gradient of the previous states (ds; the kernels add dzh W_hh to
// ds[0] themselves). A cell with kSplit = false writes dzx only: its dzh is
// the same. kOldRead / kNewRead say which previous / next states the
// backward reads (bit s for state s), so kernels load only those.
//
// The math is written once, as a template on the value type T (float or
// double on CUDA threads, at::vec::Vectorized on the CPU, a tensor wrapper
// for the ATen backend) and on a math policy M with these static functions
// (each elementwise, each on T):
//   M::sigmoid(x)  M::tanh(x)  M::exp(x)  M::expm1(x)  M::elu(x)  (alpha 1)
//   M::where_gt(x, y, a, b)   x > y ? a : b
//   M::fma(a, b, c)           a b + c rounded once where the backend can
// A state that `recompute` rebuilds must round the same in forward and
// recompute: write its update once, with M::fma where it multiplies and
// adds, and the same expression in both.
// T supports + - * on T, and T(c) for a constant c (a double).
#pragma once

#include <c10/macros/Macros.h>

// Every function of a cell: inline, and callable from CUDA device code.
// The fused CPU kernels' builds (cpu/kernels_<capability>.cpp) define
// LLTM_CELL_ALWAYS_INLINE: their step kernels call a cell's functions on
// whole register tiles (step_kernels.h), which a call spills to memory and
// reloads (GCC kept them out of line; inlined, the LSTM's layer at T = 50,
// 16x32x128 ran 3-7% faster on one core). Not elsewhere: GCC refuses to
// inline a function compiled for a wider instruction set into its caller
// (a cell of lltm.cells.define, compiled after its kernels' target switch,
// is also called by the ATen operators, which keep the baseline).
#if defined(LLTM_CELL_ALWAYS_INLINE) && !defined(__CUDA_ARCH__)
#define LLTM_CELL_FN C10_HOST_DEVICE static C10_ALWAYS_INLINE
#else
#define LLTM_CELL_FN C10_HOST_DEVICE static inline
#endif

namespace lltm {
namespace cells {

// The number of set bits of a state mask (kOldRead, kNewRead).
constexpr int count_states(unsigned mask) { return mask == 0 ? 0 : int(mask & 1u) + count_states(mask >> 1); }

}  // namespace cells
}  // namespace lltm
