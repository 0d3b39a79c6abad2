// The fused CPU backend's kernels, as seen by the operators (rnn_cpu.cpp,
// cell_cpu.cpp): the step of a layer (or one cell call) as a GEMM whose
// register tile goes straight through the cell's pointwise math, the
// recompute of the carried states for backward, and a plain GEMM for the
// gradients of the weights and of the input. Written once over the cell's
// traits (cells/cell.h); one set of kernels per cell of cells/registry.h
// and dtype.
//
// The kernels are compiled once per CPU capability (kernels_default.cpp,
// kernels_avx2.cpp, kernels_avx512.cpp, each with its own instruction set;
// its half types in kernels_<capability>_half.cpp, so that a build compiles
// the two halves in parallel) and the build matching torch's own choice
// (at::get_cpu_capability(), which honours ATEN_CPU_CAPABILITY) is picked at
// run time. This header is
// compiled with the baseline flags: plain types only, and no cell header
// (the cells' math is instantiated in each capability's file, after it has
// chosen its instruction set): a cell is named by its index in
// cells::BuiltIn.
//
// Shapes: B = batch, I = input features, S = state size, G = the cell's
// gates, NS its states (h first), NV its saved values per unit. Every
// (B, n S) buffer is row-major with rows n S apart unless a leading
// dimension (ld_*) is given. "opmath" is the type the arithmetic runs in:
// float for float, bfloat16 and half, double for double.
//
// Work is split over units (state columns) in blocks of `width` units (one
// vector of opmath values): the unit blocks of a step are independent given
// the previous step, so the threads of a layer each own a range of them for
// the whole sequence (see common.h), and pack only their weights.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace lltm {
namespace cpu {

// One forward step over all rows and a range of unit blocks:
//   zx = x_t W_ih^T + bias_x, zh = h_{t-1} W_hh^T + bias_h   (a GEMM tile per
//   rows x unit block, the G gates side by side; a cell without kSplit gets
//   zx + zh in zx, from one K loop over [h_{t-1} | x_t])
//   the cell's forward: next states and saved values
// Rows past their length: zero saved values, the states kept, h_new = 0,
// and h_prev copied to h_carry.
struct ForwardStep {
  const void* h_prev;  // (B, S) h_{t-1}, rows ld_h apart
  int64_t ld_h;
  const void* x;  // (B, I) x_t, rows ld_x apart
  int64_t ld_x;
  const void* packed;      // (opmath) W_hh and W_ih packed by pack_forward
  const void* bias_x;      // (G S,) opmath or nullptr: b_ih (+ b_hh without kSplit)
  const void* bias_h;      // (G S,) opmath or nullptr: b_hh (kSplit)
  const void* s_prev;      // (NS - 1, B, S) the other states before the step, state k at
                           // (k - 1) * s_stride + row * ld_s; nullptr when NS = 1
  int64_t ld_s, s_stride;  //
  void* s_next;            // (NS - 1, B, S) contiguous: after the step
  void* h_new;             // (B, S) h_t (0 on rows past their length)
  void* h_carry;           // (B, S) or nullptr: h_t where the row takes the
                           // step, h_prev where it does not (with lengths)
  void* saved;             // (B, NV S) out: the cell's saved values
  const int64_t* lengths;  // (B,) or nullptr (every row takes the step)
  int64_t step;            // t, compared with lengths
  int64_t batch, state, features;
};

// One backward step over all rows and a range of unit blocks:
//   dh = dzh_next W_hh + dh_in                  (a GEMM tile per rows x <= 3 blocks)
//   the cell's backward from d h_t = dh + grad_out and the other states'
//   carried gradients ds: dzx, dzh, and the gradients of the previous
//   states (ds in place; the cell's direct d h_{t-1} term into dh_out,
//   which the next step's GEMM completes)
// Rows past their length: dzx = dzh = 0, ds passes through, dh goes to
// dh_out. With dh_h0 set there is no pointwise part: dh is written there
// (the gradient of h0, after the first step).
struct BackwardStep {
  const void* dzh_next;  // (B, G S) dzh of step t + 1, or nullptr (the last step)
  const void* packed;    // (opmath) W_hh packed by pack_backward for the same blocks
  const void* dh_in;     // (B, S) opmath: the gradient of h_t beside the GEMM's (the
                         // carried gradient, or the cell's direct term of step t + 1)
  void* dh_out;          // (B, S) opmath: the same for step t - 1; may be dh_in
  const void* grad_out;  // (B, S) gradient of output[t], added, or nullptr
  void* ds;              // (NS - 1, B, S) opmath, in place: gradients of the other
                         // states after step t in, before it out; nullptr when NS = 1
  int64_t ds_stride;     // elements from one state of ds to the next (B S of the whole batch)
  const void* saved;     // (B, NV S) the saved values of step t
  const void* h_new;     // (B, S) h_t (read where the cell's kNewRead asks)
  const void* h_old;     // (B, S) h_{t-1}, rows ld_h_old apart (kOldRead)
  int64_t ld_h_old;      //
  const void* s_new;     // (NS - 1, B, S) the other states after step t, state k at
                         // (k - 1) * s_new_stride + row * S (kNewRead)
  int64_t s_new_stride;  //
  const void* s_old;     // the same before step t, at (k - 1) * s_old_stride + row * ld_s_old
  int64_t ld_s_old, s_old_stride;
  void* dzx;               // (B, G S) out
  void* dzh;               // (B, G S) out (kSplit), else nullptr: dzx is dzh
  void* bias_grad_x;       // (G S,) opmath or nullptr: dzx summed over rows, added
  void* bias_grad_h;       // (G S,) opmath or nullptr: dzh summed over rows, added (kSplit)
  void* dh_h0;             // (B, S) opmath, or nullptr: see above
  const int64_t* lengths;  // (B,) or nullptr
  int64_t step;            // t
  int64_t batch, state;
};

// The states other than h after every step, for backward: the cell's
// recompute from the initial states and the saved values, in the forward's
// order and rounding (the same vector math, stored in the dtype after every
// step as the forward stores them). Rows [row_begin, row_end).
struct RecomputeStates {
  const void* saved;       // (T, B, NV S)
  const void* s0;          // (NS - 1, B, S) contiguous: the initial states
  void* states;            // (NS - 1, T, B, S) out
  const int64_t* lengths;  // (B,) or nullptr; rows keep their states past it
  int64_t steps, batch, state;
};

// C (M, N) = A (M, K) B (K, N) (+ C when accumulate), on C's rows
// [m_begin, m_end) and columns [n_begin, n_end). A's element (m, k) is at
// a[m * a_rs + k * a_ks] (a transposed operand is a pair of strides), B is
// row-major with rows ldb apart, C is opmath with rows ldc apart. B is
// packed per call, in blocks of K.
struct Gemm {
  const void* a;
  int64_t a_rs, a_ks;
  const void* b;
  int64_t ldb;
  void* c;
  int64_t ldc;
  int64_t m, n, k;
  bool accumulate;
};

// Packs W_hh (G S, S) and W_ih (G S, I), rows ld_hh / ld_ih apart, for the
// forward step: unit block jb holds, for every k < S + I, [W_hh | W_ih][g S + j][k]
// for the G gates g and the block's `width` units j (zero past S). Only blocks
// [begin, end) are written.
using PackForwardFn = void (*)(const void* w_hh, int64_t ld_hh, const void* w_ih, int64_t ld_ih,
                               int64_t state, int64_t features, void* out, int64_t begin, int64_t end);
// Packs W_hh (G S, S), rows ld apart, for the backward step on unit blocks
// [begin, end): panels of up to three blocks, each holding, for every row
// k < G S, W_hh[k][j] for its units j (zero past S). The grouping depends on
// [begin, end): pack and run the same range.
using PackBackwardFn = void (*)(const void* w_hh, int64_t ld, int64_t state, void* out, int64_t begin,
                                int64_t end);
using ForwardFn = void (*)(const ForwardStep&, int64_t block_begin, int64_t block_end);
using BackwardFn = void (*)(const BackwardStep&, int64_t block_begin, int64_t block_end);
using RecomputeFn = void (*)(const RecomputeStates&, int64_t row_begin, int64_t row_end);
using GemmFn = void (*)(const Gemm&, int64_t m_begin, int64_t m_end, int64_t n_begin, int64_t n_end);

// The kernels of one capability, for one cell and dtype.
struct Kernels {
  int64_t width;      // units per block: opmath values per vector
  int64_t tile_rows;  // the GEMM's row split unit: a multiple of every tile's rows
  int64_t tile_cols;  // columns of a GEMM panel
  int64_t gates;      // the cell's G
  PackForwardFn pack_forward;
  PackBackwardFn pack_backward;
  ForwardFn forward;
  BackwardFn backward;
  RecomputeFn recompute;
  GemmFn gemm;

  // opmath elements of the packed weights
  int64_t blocks(int64_t state) const { return (state + width - 1) / width; }
  int64_t forward_packed_size(int64_t state, int64_t features) const {
    return blocks(state) * (state + features) * gates * width;
  }
  int64_t backward_packed_size(int64_t state) const { return blocks(state) * gates * state * width; }
};

// The dtypes whose kernels a file instantiates: all four (a cell of
// lltm.cells.define), or float and double / bfloat16 and half (the two files
// of each capability's built-in kernels).
enum class Dtypes { kAll, kFloats, kHalves };

// Kernels of one capability for cell `cell` (its index in cells::BuiltIn)
// and `dtype`: float and double (kernels_<capability>), bfloat16 and half
// (kernels_<capability>_half); nullptr members for other dtypes, or where
// the build is absent.
Kernels kernels_default(int cell, c10::ScalarType dtype);
Kernels kernels_default_half(int cell, c10::ScalarType dtype);
Kernels kernels_avx2(int cell, c10::ScalarType dtype);
Kernels kernels_avx2_half(int cell, c10::ScalarType dtype);
Kernels kernels_avx512(int cell, c10::ScalarType dtype);
Kernels kernels_avx512_half(int cell, c10::ScalarType dtype);

// The kernels for `cell` and `dtype` at the capability torch runs with.
Kernels kernels_for_dtype(int cell, c10::ScalarType dtype);

// "avx512", "avx2" or "default": the capability kernels_for_dtype uses.
const char* kernels_capability();

}  // namespace cpu
}  // namespace lltm
