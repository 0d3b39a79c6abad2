// The fused CPU backend's kernels, as seen by the operators (cell_cpu.cpp,
// seq_cpu.cpp): the step of a layer (or one cell call) as a GEMM whose
// register tile goes straight through the cell's pointwise math, and a plain
// GEMM for the gradients of the weights and of the input.
//
// The kernels are compiled once per CPU capability (kernels_default.cpp,
// kernels_avx2.cpp, kernels_avx512.cpp, each with its own instruction set)
// and the build matching torch's own choice (at::get_cpu_capability(), which
// honours ATEN_CPU_CAPABILITY) is picked at run time. This header is
// compiled with the baseline flags: plain types only.
//
// Shapes: B = batch, I = input features, S = state size, K = S + I. Every
// (B, S) / (B, 3S) buffer is row-major with rows S / 3S apart unless a
// leading dimension (ld_*) is given. "opmath" is the type the arithmetic
// runs in: float for float, bfloat16 and half, double for double.
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
//   z = [h_prev | x] W^T + bias                (a GEMM tile per rows x unit block)
//   i = sigmoid(z_i), o = sigmoid(z_o), a = elu(z_c)
//   c_new = c_prev + a * i;  h_new = tanh(c_new) * o
// Rows past their length: zero gates, c_new = c_prev, h_new = 0, and h_prev
// copied to h_carry.
struct ForwardStep {
  const void* h_prev;  // (B, S) h_{t-1}, rows ld_h apart
  int64_t ld_h;
  const void* x;  // (B, I) x_t, rows ld_x apart
  int64_t ld_x;
  const void* packed;      // (opmath) W packed by pack_gates
  const void* bias;        // (3S,) or nullptr
  const void* c_prev;      // (B, S)
  void* c_new;             // (B, S)
  void* h_new;             // (B, S) h_t (0 on rows past their length)
  void* h_carry;           // (B, S) or nullptr: h_t where the row takes the
                           // step, h_prev where it does not (with lengths)
  void* gates;             // (B, 3S) out: activated gates i, o, a
  const int64_t* lengths;  // (B,) or nullptr (every row takes the step)
  int64_t step;            // t, compared with lengths
  int64_t batch, state, features;
};

// One backward step over all rows and a range of unit blocks:
//   dh = d_pre_next W_h (+ dh_carry where the row is at its last step or
//        d_pre_next is nullptr)                 (a GEMM tile per rows x <= 3 blocks)
//   gh = dh + grad_out;  k = tanh(cell)
//   dc = dc_in + gh o (1 - k^2)                 d tanh = 1 - tanh^2
//   d_i = dc a i (1 - i);  d_o = gh k o (1 - o)  d sigmoid = s (1 - s)
//   d_c = dc i elu'(a);  dc_out = dc            d c_t / d c_{t-1} = 1
// Rows past their length: d_pre = 0, dc passes through, dh is kept in
// dh_carry. With dh_out set there is no pointwise part: dh is written there
// (the gradient of h0, after the first step).
struct BackwardStep {
  const void* d_pre_next;  // (B, 3S) gradient of step t + 1's pre-activations, or nullptr
  const void* packed;      // (opmath) W_h packed by pack_units for the same blocks
  void* dh_carry;          // (B, S) opmath: gradient of h_t carried from above
                           // (grad_h_n, or the cell's grad_h); written on rows
                           // past their length
  const void* grad_out;    // (B, S) gradient of output[t], added, or nullptr
  const void* dc_in;       // (B, S) opmath: gradient of c_t
  void* dc_out;            // (B, S) opmath: gradient of c_{t-1}, or nullptr; may be dc_in
  const void* cell;        // (B, S) c_t
  const void* gates;       // (B, 3S) activated gates of step t
  void* d_pre;             // (B, 3S) out: gradient of the pre-activations
  void* bias_grad;         // (3S,) opmath, or nullptr: d_pre summed over rows, added
  void* dh_out;            // (B, S) opmath, or nullptr: see above
  const int64_t* lengths;  // (B,) or nullptr
  int64_t step;            // t
  int64_t batch, state;
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

// Packs the gate weights W (3S, K), rows ldw apart, for the forward step:
// unit block jb holds, for every k, W[g*S + j][k] for g = i, o, c and the
// block's `width` units j (zero past S). Only blocks [begin, end) are written.
using PackGatesFn = void (*)(const void* w, int64_t ldw, int64_t state, int64_t k, void* out, int64_t begin,
                             int64_t end);
// Packs W_h (3S, S) (the first S columns of W, rows ldw apart) for the
// backward step on unit blocks [begin, end): panels of up to three blocks,
// each holding, for every row k < 3S, W_h[k][j] for its units j (zero past
// S). The grouping depends on [begin, end): pack and run the same range.
using PackUnitsFn = void (*)(const void* w, int64_t ldw, int64_t state, void* out, int64_t begin,
                             int64_t end);
using ForwardFn = void (*)(const ForwardStep&, int64_t block_begin, int64_t block_end);
using BackwardFn = void (*)(const BackwardStep&, int64_t block_begin, int64_t block_end);
using GemmFn = void (*)(const Gemm&, int64_t m_begin, int64_t m_end, int64_t n_begin, int64_t n_end);

// The kernels of one capability, for one dtype.
struct Kernels {
  int64_t width;      // units per block: opmath values per vector
  int64_t tile_rows;  // the GEMM's row split unit: a multiple of every tile's rows
  int64_t tile_cols;  // columns of a GEMM panel
  PackGatesFn pack_gates;
  PackUnitsFn pack_units;
  ForwardFn forward;
  BackwardFn backward;
  GemmFn gemm;

  // opmath elements of the packed weights
  int64_t gate_blocks(int64_t state) const { return (state + width - 1) / width; }
  int64_t gates_packed_size(int64_t state, int64_t k) const { return gate_blocks(state) * k * 3 * width; }
  int64_t units_packed_size(int64_t state) const { return gate_blocks(state) * 3 * state * width; }
};

// Kernels of one capability for `dtype` (float, double, bfloat16, half);
// nullptr members for other dtypes, or where the build is absent.
Kernels kernels_default(c10::ScalarType dtype);
Kernels kernels_avx2(c10::ScalarType dtype);
Kernels kernels_avx512(c10::ScalarType dtype);

// The kernels for `dtype` at the capability torch runs with.
Kernels kernels_for_dtype(c10::ScalarType dtype);

// "avx512", "avx2" or "default": the capability kernels_for_dtype uses.
const char* kernels_capability();

}  // namespace cpu
}  // namespace lltm
