// The fused CPU backend's step kernels (kernels.h: ForwardStep,
// BackwardStep, RecomputeStates), written once over the cell's traits
// (cells/cell.h): each GEMM register tile of a step goes through the cell's
// pointwise code while it is still in registers, so a step reads its weights
// and writes its results once, with no buffer of pre-activations between a
// GEMM and a pass.
//
// Forward: the tile is rows x the G gates of one unit block, from the
// weights packed with the G gates of a block side by side, so that one tile
// holds every pre-activation its units need. A cell without kSplit gets
// zx + zh from one K loop over [h_{t-1} | x_t]; a cell with kSplit (GRU)
// gets x_t W_ih^T and h_{t-1} W_hh^T from two K loops, the first set aside
// (in L1) while the second runs. Backward: the tile is rows x one panel of
// up to three unit blocks of dh = dzh_{t+1} W_hh, and the cell's backward
// turns it into dzx and dzh of step t for the same units.
//
// The cell's code runs on all rows of a tile at once: its value type is
// Rows<T, R> (R vectors, one per row), so each of its operations issues R
// independent instructions back to back, which the core overlaps (one row's
// chain of activations is ~200 cycles of latency and ~30 of throughput).
// Rows past their length run the math too and store what they keep instead.
//
// Included by the kernels_<capability>.cpp files only (see cell_math.h),
// after they have chosen their instruction set, so that the cells' code is
// compiled with it.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>

#include "../cells/registry.h"
#include "cell_math.h"
#include "gemm.h"
#include "kernels.h"

namespace lltm {
namespace cpu {
inline namespace CPU_CAPABILITY {

// ---- the cells' value type: one vector per row of a tile -----------------------

template <typename T, int R>
struct Rows {
  Vec<T> v[R];
  Rows() = default;
  explicit Rows(double c) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) v[r] = Vec<T>(static_cast<T>(c));
  }
};

#define LLTM_ROWS_OP(op)                                                               \
  template <typename T, int R>                                                         \
  C10_ALWAYS_INLINE Rows<T, R> operator op(const Rows<T, R>& a, const Rows<T, R>& b) { \
    Rows<T, R> out;                                                                    \
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) out.v[r] = a.v[r] op b.v[r];  \
    return out;                                                                        \
  }
LLTM_ROWS_OP(+)
LLTM_ROWS_OP(-)
LLTM_ROWS_OP(*)
#undef LLTM_ROWS_OP

// The cells' math policy on Rows: VecMath on each row's vector.
template <typename T, int R>
struct RowsMath {
  using X = Rows<T, R>;
  using M = VecMath<T>;
#define LLTM_ROWS_FN(fn)                                                           \
  static C10_ALWAYS_INLINE X fn(const X& x) {                                      \
    X out;                                                                         \
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) out.v[r] = M::fn(x.v[r]); \
    return out;                                                                    \
  }
  LLTM_ROWS_FN(sigmoid)
  LLTM_ROWS_FN(tanh)
  LLTM_ROWS_FN(exp)
  LLTM_ROWS_FN(expm1)
  LLTM_ROWS_FN(elu)
#undef LLTM_ROWS_FN
  static C10_ALWAYS_INLINE X where_gt(const X& x, const X& y, const X& a, const X& b) {
    X out;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) out.v[r] = M::where_gt(x.v[r], y.v[r], a.v[r], b.v[r]);
    return out;
  }
  static C10_ALWAYS_INLINE X fma(const X& a, const X& b, const X& c) {
    X out;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) out.v[r] = M::fma(a.v[r], b.v[r], c.v[r]);
    return out;
  }
};

inline bool row_active(const int64_t* lengths, int64_t row, int64_t step) {
  return lengths == nullptr || step < lengths[row];
}

// ---- forward -------------------------------------------------------------------

template <typename Cell, typename scalar_t>
void forward_blocks(const ForwardStep& s, int64_t block_begin, int64_t block_end) {
  using T = at::opmath_type<scalar_t>;
  constexpr int G = Cell::kGates, NS = Cell::kStates, NV = Cell::kSaved;
  constexpr int64_t V = Vec<T>::size();
  const int64_t S = s.state, I = s.features, K = S + I, n_all = s.batch * S;
  const auto* h_prev = static_cast<const scalar_t*>(s.h_prev);
  const auto* x = static_cast<const scalar_t*>(s.x);
  const auto* bias_x = static_cast<const T*>(s.bias_x);
  const auto* bias_h = static_cast<const T*>(s.bias_h);
  const auto* s_prev = static_cast<const scalar_t*>(s.s_prev);
  auto* s_next = static_cast<scalar_t*>(s.s_next);
  auto* h_new = static_cast<scalar_t*>(s.h_new);
  auto* h_carry = static_cast<scalar_t*>(s.h_carry);
  auto* saved = static_cast<scalar_t*>(s.saved);
  for (int64_t jb = block_begin; jb < block_end; ++jb) {
    const int64_t j0 = jb * V, n = std::min(V, S - j0);
    const T* panel = static_cast<const T*>(s.packed) + jb * K * G * V;
    Vec<T> bx[G], bh[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      bx[g] = bias_x ? load(bias_x + g * S + j0, n) : Vec<T>(T(0));
      bh[g] = bias_h ? load(bias_h + g * S + j0, n) : Vec<T>(T(0));
    }
    for_row_tiles<kRows<G>>(0, s.batch, [&]<int R>(int64_t r0) {
      using X = Rows<T, R>;
      Vec<T> acc[R][G];
      X zx[G], zh[G];
      zero_tile(acc);
      if constexpr (Cell::kSplit) {
        // zx = x_t W_ih^T + b_ih, set aside; zh = h_{t-1} W_hh^T + b_hh
        mac_tile<R, G>(acc, x + r0 * s.ld_x, s.ld_x, 1, I, panel + S * G * V, G * V);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
          for (int g = 0; g < G; ++g) zx[g].v[r] = acc[r][g] + bx[g];
        }
        zero_tile(acc);
        mac_tile<R, G>(acc, h_prev + r0 * s.ld_h, s.ld_h, 1, S, panel, G * V);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
          for (int g = 0; g < G; ++g) zh[g].v[r] = acc[r][g] + bh[g];
        }
      } else {
        // zx = [h_{t-1} | x_t] [W_hh | W_ih]^T + biases: the two column blocks, one K loop each;
        // zh = -0, which adds to anything exactly
        mac_tile<R, G>(acc, h_prev + r0 * s.ld_h, s.ld_h, 1, S, panel, G * V);
        mac_tile<R, G>(acc, x + r0 * s.ld_x, s.ld_x, 1, I, panel + S * G * V, G * V);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
          for (int g = 0; g < G; ++g) zx[g].v[r] = acc[r][g] + bx[g];
        }
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) zh[g] = X(-0.0);
      }
      X old[NS], next[NS], sv[NV];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const int64_t row = r0 + r;
        old[0].v[r] = load(h_prev + row * s.ld_h + j0, n);
#pragma GCC unroll 4
        for (int k = 1; k < NS; ++k) old[k].v[r] = load(s_prev + (k - 1) * s.s_stride + row * s.ld_s + j0, n);
      }
      Cell::template forward<RowsMath<T, R>>(zx, zh, old, next, sv);
      for (int r = 0; r < R; ++r) {
        const int64_t row = r0 + r, at = row * S + j0;
        scalar_t* sv_out = saved + row * NV * S + j0;
        if (!row_active(s.lengths, row, s.step)) {
          // past the row's length: zero saved values and output, the states kept
          const Vec<T> zero(T(0));
          for (int k = 0; k < NV; ++k) store(sv_out + k * S, zero, n);
          for (int k = 1; k < NS; ++k) store(s_next + (k - 1) * n_all + at, old[k].v[r], n);
          store(h_new + at, zero, n);
          if (h_carry) store(h_carry + at, old[0].v[r], n);
          continue;
        }
#pragma GCC unroll 4
        for (int k = 0; k < NV; ++k) store(sv_out + k * S, sv[k].v[r], n);
#pragma GCC unroll 4
        for (int k = 1; k < NS; ++k) store(s_next + (k - 1) * n_all + at, next[k].v[r], n);
        store(h_new + at, next[0].v[r], n);
        if (h_carry) store(h_carry + at, next[0].v[r], n);
      }
    });
  }
}

// ---- backward ------------------------------------------------------------------

// Rows [0, B) x the NB unit blocks from j_first of one panel (pack_backward).
template <typename Cell, typename scalar_t, int NB>
void backward_panel(const BackwardStep& s, int64_t j_first) {
  using T = at::opmath_type<scalar_t>;
  constexpr int G = Cell::kGates, NS = Cell::kStates, NV = Cell::kSaved;
  constexpr unsigned kOld = Cell::kOldRead, kNew = Cell::kNewRead;
  constexpr int64_t V = Vec<T>::size();
  const int64_t S = s.state, GS = G * S;
  const auto* dzh_next = static_cast<const scalar_t*>(s.dzh_next);
  const auto* dh_in = static_cast<const T*>(s.dh_in);
  auto* dh_out = static_cast<T*>(s.dh_out);
  const auto* grad_out = static_cast<const scalar_t*>(s.grad_out);
  auto* ds = static_cast<T*>(s.ds);
  const auto* saved = static_cast<const scalar_t*>(s.saved);
  const auto* h_new = static_cast<const scalar_t*>(s.h_new);
  const auto* h_old = static_cast<const scalar_t*>(s.h_old);
  const auto* s_new = static_cast<const scalar_t*>(s.s_new);
  const auto* s_old = static_cast<const scalar_t*>(s.s_old);
  auto* dzx_out = static_cast<scalar_t*>(s.dzx);
  auto* dzh_out = static_cast<scalar_t*>(s.dzh);
  auto* dh_h0 = static_cast<T*>(s.dh_h0);
  const T* panel = static_cast<const T*>(s.packed) + j_first * GS * V;
  const int64_t cols = std::min(NB * V, S - j_first * V);  // the panel's units
  // dzx and dzh summed over the rows, per gate and unit block
  Vec<T> dbx[G][NB], dbh[G][NB];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 4
    for (int u = 0; u < NB; ++u) dbx[g][u] = dbh[g][u] = Vec<T>(T(0));
  }
  for_row_tiles<kRows<NB>>(0, s.batch, [&]<int R>(int64_t r0) {
    using X = Rows<T, R>;
    if (!dh_h0) {
      // step t's rows are far apart in memory, which the hardware prefetchers
      // do not follow: asked for before the K loop, they arrive while it runs
      for (int r = 0; r < R; ++r) {
        const int64_t row = r0 + r, at = row * S + j_first * V;
        for (int k = 0; k < NV; ++k) prefetch(saved + row * NV * S + k * S + j_first * V, cols);
        if (grad_out) prefetch(grad_out + at, cols);
        if (kNew & 1u) prefetch(h_new + at, cols);
        if (kOld & 1u) prefetch(h_old + row * s.ld_h_old + j_first * V, cols);
        for (int k = 1; k < NS; ++k) {
          if (kNew >> k & 1u) prefetch(s_new + (k - 1) * s.s_new_stride + at, cols);
          if (kOld >> k & 1u)
            prefetch(s_old + (k - 1) * s.s_old_stride + row * s.ld_s_old + j_first * V, cols);
        }
        for (int g = 0; g < G; ++g) {
          prefetch_for_write(dzx_out + row * GS + g * S + j_first * V, cols);
          if (Cell::kSplit) prefetch_for_write(dzh_out + row * GS + g * S + j_first * V, cols);
        }
      }
    }
    Vec<T> acc[R][NB];
    zero_tile(acc);
    if (dzh_next) mac_tile<R, NB>(acc, dzh_next + r0 * GS, GS, 1, GS, panel, NB * V);
    // the tile set aside, so that the loop below over its unit blocks (one
    // copy of the cell's code, not NB) leaves the accumulators in registers
    Vec<T> tile[NB][R];
#pragma GCC unroll 4
    for (int u = 0; u < NB; ++u) {
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) tile[u][r] = acc[r][u];
    }
#pragma GCC unroll 1
    for (int u = 0; u < NB; ++u) {
      const int64_t j0 = (j_first + u) * V, n = std::min(V, S - j0);
      // d h_t (without the output's gradient): the GEMM's part and the rest
      X dh;
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) dh.v[r] = tile[u][r] + load(dh_in + (r0 + r) * S + j0, n);
      if (dh_h0) {
        for (int r = 0; r < R; ++r) store(dh_h0 + (r0 + r) * S + j0, dh.v[r], n);
        continue;
      }
      const Vec<T> zero(T(0));
      X dnext[NS], old[NS], next[NS], sv[NV], dzx[G], dzh[G], dprev[NS];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const int64_t row = r0 + r, at = row * S + j0;
        dnext[0].v[r] = grad_out ? dh.v[r] + load(grad_out + at, n) : dh.v[r];
        old[0].v[r] = kOld & 1u ? load(h_old + row * s.ld_h_old + j0, n) : zero;
        next[0].v[r] = kNew & 1u ? load(h_new + at, n) : zero;
#pragma GCC unroll 4
        for (int k = 1; k < NS; ++k) {
          dnext[k].v[r] = load(ds + (k - 1) * s.ds_stride + at, n);
          old[k].v[r] =
              kOld >> k & 1u ? load(s_old + (k - 1) * s.s_old_stride + row * s.ld_s_old + j0, n) : zero;
          next[k].v[r] = kNew >> k & 1u ? load(s_new + (k - 1) * s.s_new_stride + at, n) : zero;
        }
#pragma GCC unroll 4
        for (int k = 0; k < NV; ++k) sv[k].v[r] = load(saved + row * NV * S + k * S + j0, n);
      }
      Cell::template backward<RowsMath<T, R>>(dnext, old, next, sv, dzx, dzh, dprev);
      for (int r = 0; r < R; ++r) {
        const int64_t row = r0 + r, at = row * S + j0;
        scalar_t* dx = dzx_out + row * GS + j0;
        scalar_t* dq = Cell::kSplit ? dzh_out + row * GS + j0 : nullptr;
        if (!row_active(s.lengths, row, s.step)) {
          // past the row's length: no gradient of its gates; the carried ones pass on
          for (int g = 0; g < G; ++g) {
            store(dx + g * S, zero, n);
            if constexpr (Cell::kSplit) store(dq + g * S, zero, n);
          }
          store(dh_out + at, dh.v[r], n);
          continue;
        }
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
          store(dx + g * S, dzx[g].v[r], n);
          dbx[g][u] += dzx[g].v[r];
          if constexpr (Cell::kSplit) {
            store(dq + g * S, dzh[g].v[r], n);
            dbh[g][u] += dzh[g].v[r];
          }
        }
#pragma GCC unroll 4
        for (int k = 1; k < NS; ++k) store(ds + (k - 1) * s.ds_stride + at, dprev[k].v[r], n);
        // the cell's direct d h_{t-1}; the next step adds dzh_t W_hh
        store(dh_out + at, dprev[0].v[r], n);
      }
    }
  });
  if (!dh_h0) {
    for (int u = 0; u < NB; ++u) {
      const int64_t j0 = (j_first + u) * V, n = std::min(V, S - j0);
      for (int g = 0; g < G; ++g) {
        if (s.bias_grad_x) {
          T* b = static_cast<T*>(s.bias_grad_x) + g * S + j0;
          store(b, load(b, n) + dbx[g][u], n);
        }
        if (Cell::kSplit && s.bias_grad_h) {
          T* b = static_cast<T*>(s.bias_grad_h) + g * S + j0;
          store(b, load(b, n) + dbh[g][u], n);
        }
      }
    }
  }
}

template <typename Cell, typename scalar_t>
void backward_blocks(const BackwardStep& s, int64_t block_begin, int64_t block_end) {
  static_assert(kTileCols == 3, "the dispatch below covers panels of 1 to 3 blocks");
  for (int64_t q = 0; q < unit_panels(block_end - block_begin); ++q) {
    const auto [j0, j1] = unit_panel(block_begin, block_end, q);
    if (j1 - j0 == 3) {
      backward_panel<Cell, scalar_t, 3>(s, j0);
    } else if (j1 - j0 == 2) {
      backward_panel<Cell, scalar_t, 2>(s, j0);
    } else {
      backward_panel<Cell, scalar_t, 1>(s, j0);
    }
  }
}

// ---- the recompute of the states other than h ------------------------------------

// Each row walks t over contiguous rows of S (the states of step t - 1 it
// reads were written one step before, and are in cache).
template <typename Cell, typename scalar_t>
void recompute_rows(const RecomputeStates& p, int64_t row_begin, int64_t row_end) {
  using T = at::opmath_type<scalar_t>;
  constexpr int NS = Cell::kStates, NV = Cell::kSaved;
  constexpr int64_t V = Vec<T>::size();
  if constexpr (NS > 1) {
    const int64_t S = p.state, B = p.batch, T_ = p.steps, n_all = B * S;
    const auto* saved = static_cast<const scalar_t*>(p.saved);
    const auto* s0 = static_cast<const scalar_t*>(p.s0);
    auto* states = static_cast<scalar_t*>(p.states);
    for (int64_t row = row_begin; row < row_end; ++row) {
      const int64_t length = p.lengths ? p.lengths[row] : T_;
      for (int64_t t = 0; t < T_; ++t) {
        const scalar_t* sv_t = saved + (t * B + row) * NV * S;
        for (int64_t j0 = 0; j0 < S; j0 += V) {
          const int64_t n = std::min(V, S - j0);
          // state k before step t, and where it goes after
          const auto prev = [&](int k) {
            return t == 0 ? s0 + (k - 1) * n_all + row * S + j0
                          : states + ((k - 1) * T_ + t - 1) * n_all + row * S + j0;
          };
          const auto out = [&](int k) { return states + ((k - 1) * T_ + t) * n_all + row * S + j0; };
          Vec<T> s[NS], sv[NV], next[NS];
          s[0] = Vec<T>(T(0));  // h is not rebuilt
#pragma GCC unroll 4
          for (int k = 1; k < NS; ++k) s[k] = load(prev(k), n);
          if (t >= length) {
            for (int k = 1; k < NS; ++k) store(out(k), s[k], n);
            continue;
          }
#pragma GCC unroll 4
          for (int k = 0; k < NV; ++k) sv[k] = load(sv_t + k * S + j0, n);
          Cell::template recompute<VecMath<T>>(s, sv, next);
#pragma GCC unroll 4
          for (int k = 1; k < NS; ++k) store(out(k), next[k], n);
        }
      }
    }
  }
}

// ---- the kernels of one cell and dtype -------------------------------------------

template <typename Cell, typename scalar_t>
Kernels kernels_of() {
  constexpr int64_t V = Vec<at::opmath_type<scalar_t>>::size();
  return {V,
          kRows<1>,
          kTileCols * V,
          Cell::kGates,
          &pack_forward<scalar_t, Cell::kGates>,
          &pack_backward<scalar_t, Cell::kGates>,
          &forward_blocks<Cell, scalar_t>,
          &backward_blocks<Cell, scalar_t>,
          &recompute_rows<Cell, scalar_t>,
          &gemm<scalar_t>};
}

// The cell's kernels for `dtype`, where `kDtypes` has it (nullptrs otherwise).
template <typename Cell, Dtypes kDtypes = Dtypes::kAll>
Kernels kernels_of_cell(c10::ScalarType dtype) {
  if constexpr (kDtypes != Dtypes::kHalves) {
    if (dtype == c10::ScalarType::Float) return kernels_of<Cell, float>();
    if (dtype == c10::ScalarType::Double) return kernels_of<Cell, double>();
  }
  if constexpr (kDtypes != Dtypes::kFloats) {
    if (dtype == c10::ScalarType::BFloat16) return kernels_of<Cell, c10::BFloat16>();
    if (dtype == c10::ScalarType::Half) return kernels_of<Cell, c10::Half>();
  }
  return {};
}

#ifndef LLTM_ONE_CELL_BUILD  // (a cell's own build, lltm.cells.define, instantiates only its own)
// The kernels of this capability for cell `cell` (its index in
// cells::BuiltIn) and `dtype`, where `kDtypes` has it; nullptrs for others.
template <Dtypes kDtypes>
Kernels kernels_for(int cell, c10::ScalarType dtype) {
  Kernels out{};
  int index = 0;
  cells::for_each_cell([&](auto c) {
    if (index++ == cell) out = kernels_of_cell<decltype(c), kDtypes>(dtype);
  });
  return out;
}
#endif

}  // namespace CPU_CAPABILITY
}  // namespace cpu
}  // namespace lltm
