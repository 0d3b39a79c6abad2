// The fused CPU backend's step kernels (kernels.h: ForwardStep,
// BackwardStep): each GEMM register tile of a step goes through the cell's
// math (cell_math.h) while it is still in registers, so a step reads its
// weights and writes its results once, with no buffer of pre-activations
// between a GEMM and a pass.
//
// Forward: the tile is rows x (i, o, c) of one unit block, from W packed
// with the three gates of a block side by side, so that one tile holds
// every pre-activation its units need. Backward: the tile is rows x one
// panel of up to three unit blocks of dh = d_pre_{t+1} W_h, and the cell's
// backward math turns it into d_pre_t for the same units.
//
// Included by the kernels_<capability>.cpp files only (see cell_math.h).
#pragma once

#include <ATen/OpMathType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>

#include "cell_math.h"
#include "gemm.h"
#include "kernels.h"

namespace lltm {
namespace cpu {
inline namespace CPU_CAPABILITY {

template <typename scalar_t>
void forward_blocks(const ForwardStep& s, int64_t block_begin, int64_t block_end) {
  using T = at::opmath_type<scalar_t>;
  constexpr int64_t V = Vec<T>::size();
  const int64_t S = s.state, K = S + s.features;
  const auto* h_prev = static_cast<const scalar_t*>(s.h_prev);
  const auto* x = static_cast<const scalar_t*>(s.x);
  const auto* bias = static_cast<const scalar_t*>(s.bias);
  const auto* c_prev = static_cast<const scalar_t*>(s.c_prev);
  auto* c_new = static_cast<scalar_t*>(s.c_new);
  auto* h_new = static_cast<scalar_t*>(s.h_new);
  auto* h_carry = static_cast<scalar_t*>(s.h_carry);
  auto* gates = static_cast<scalar_t*>(s.gates);
  for (int64_t jb = block_begin; jb < block_end; ++jb) {
    const int64_t j0 = jb * V, n = std::min(V, S - j0);
    const T* panel = static_cast<const T*>(s.packed) + jb * K * 3 * V;
    Vec<T> b[3];
#pragma GCC unroll 3
    for (int gate = 0; gate < 3; ++gate) b[gate] = bias ? load(bias + gate * S + j0, n) : Vec<T>(T(0));
    for_row_tiles<kRows<3>>(0, s.batch, [&]<int M>(int64_t r0) {
      Vec<T> acc[M][3];
      zero_tile(acc);
      // z = h_{t-1} W_h^T + x_t W_x^T: the two column blocks of W, one K loop each
      mac_tile<M, 3>(acc, h_prev + r0 * s.ld_h, s.ld_h, 1, S, panel, 3 * V);
      mac_tile<M, 3>(acc, x + r0 * s.ld_x, s.ld_x, 1, s.features, panel + S * 3 * V, 3 * V);
#pragma GCC unroll 16
      for (int r = 0; r < M; ++r) {
        const int64_t row = r0 + r;
        scalar_t* g = gates + row * 3 * S + j0;
        const int64_t at = row * S + j0;
        if (s.lengths && s.step >= s.lengths[row]) {
          const Vec<T> zero(T(0));
          store(g, zero, n);
          store(g + S, zero, n);
          store(g + 2 * S, zero, n);
          store(c_new + at, load(c_prev + at, n), n);
          store(h_new + at, zero, n);
          if (h_carry) store(h_carry + at, load(h_prev + row * s.ld_h + j0, n), n);
          continue;
        }
        const CellForward<T> out =
            cell_forward(acc[r][0] + b[0], acc[r][1] + b[1], acc[r][2] + b[2], load(c_prev + at, n));
        store(g, out.i, n);
        store(g + S, out.o, n);
        store(g + 2 * S, out.a, n);
        store(c_new + at, out.cell, n);
        store(h_new + at, out.h, n);
        if (h_carry) store(h_carry + at, out.h, n);
      }
    });
  }
}

// Rows [0, B) x the NB unit blocks from j_first of one panel (pack_units).
template <typename scalar_t, int NB>
void backward_panel(const BackwardStep& s, int64_t j_first) {
  using T = at::opmath_type<scalar_t>;
  constexpr int64_t V = Vec<T>::size();
  const int64_t S = s.state;
  const auto* d_next = static_cast<const scalar_t*>(s.d_pre_next);
  auto* dh_carry = static_cast<T*>(s.dh_carry);
  const auto* grad_out = static_cast<const scalar_t*>(s.grad_out);
  const auto* dc_in = static_cast<const T*>(s.dc_in);
  auto* dc_out = static_cast<T*>(s.dc_out);
  const auto* cell = static_cast<const scalar_t*>(s.cell);
  const auto* gates = static_cast<const scalar_t*>(s.gates);
  auto* d_pre = static_cast<scalar_t*>(s.d_pre);
  auto* dh_out = static_cast<T*>(s.dh_out);
  const T* panel = static_cast<const T*>(s.packed) + j_first * 3 * S * V;
  // d_pre summed over the rows, per gate and unit block
  Vec<T> db[3][NB];
#pragma GCC unroll 3
  for (int gate = 0; gate < 3; ++gate) {
#pragma GCC unroll 4
    for (int u = 0; u < NB; ++u) db[gate][u] = Vec<T>(T(0));
  }
  for_row_tiles<kRows<NB>>(0, s.batch, [&]<int M>(int64_t r0) {
    if (!dh_out) {
      for (int r = 0; r < M; ++r) {
        const int64_t row = r0 + r, at = row * S + j_first * V, n = std::min(NB * V, S - j_first * V);
        prefetch(cell + at, n);
        if (grad_out) prefetch(grad_out + at, n);
        for (int gate = 0; gate < 3; ++gate) {
          prefetch(gates + row * 3 * S + gate * S + j_first * V, n);
          prefetch_for_write(d_pre + row * 3 * S + gate * S + j_first * V, n);
        }
      }
    }
    Vec<T> acc[M][NB];
    zero_tile(acc);
    if (d_next) mac_tile<M, NB>(acc, d_next + r0 * 3 * S, 3 * S, 1, 3 * S, panel, NB * V);
#pragma GCC unroll 16
    for (int r = 0; r < M; ++r) {
      const int64_t row = r0 + r;
      // the row's last step (or the first reverse step): the gradient
      // carried from above joins the GEMM's
      const bool add_carry = !d_next || (s.lengths && s.step + 1 >= s.lengths[row]);
      const bool skip = s.lengths && s.step >= s.lengths[row];
#pragma GCC unroll 4
      for (int u = 0; u < NB; ++u) {
        const int64_t j0 = (j_first + u) * V, n = std::min(V, S - j0);
        const int64_t at = row * S + j0;
        Vec<T> dh = acc[r][u];
        if (add_carry) dh += load(dh_carry + at, n);
        if (dh_out) {
          store(dh_out + at, dh, n);
          continue;
        }
        scalar_t* d = d_pre + row * 3 * S + j0;
        if (skip) {
          const Vec<T> zero(T(0));
          store(d, zero, n);
          store(d + S, zero, n);
          store(d + 2 * S, zero, n);
          if (dc_out && dc_out != dc_in) store(dc_out + at, load(dc_in + at, n), n);
          store(dh_carry + at, dh, n);
          continue;
        }
        const Vec<T> gh = grad_out ? dh + load(grad_out + at, n) : dh;
        const scalar_t* g = gates + row * 3 * S + j0;
        const CellBackward<T> out = cell_backward(gh, load(dc_in + at, n), load(g, n), load(g + S, n),
                                                  load(g + 2 * S, n), load(cell + at, n));
        store(d, out.d_i, n);
        store(d + S, out.d_o, n);
        store(d + 2 * S, out.d_c, n);
        if (dc_out) store(dc_out + at, out.dc, n);
        db[0][u] += out.d_i;
        db[1][u] += out.d_o;
        db[2][u] += out.d_c;
      }
    }
  });
  if (s.bias_grad && !dh_out) {
    for (int u = 0; u < NB; ++u) {
      const int64_t j0 = (j_first + u) * V, n = std::min(V, S - j0);
      for (int gate = 0; gate < 3; ++gate) {
        T* bg = static_cast<T*>(s.bias_grad) + gate * S + j0;
        store(bg, load(bg, n) + db[gate][u], n);
      }
    }
  }
}

template <typename scalar_t>
void backward_blocks(const BackwardStep& s, int64_t block_begin, int64_t block_end) {
  static_assert(kTileCols == 3, "the dispatch below covers panels of 1 to 3 blocks");
  for (int64_t q = 0; q < unit_panels(block_end - block_begin); ++q) {
    const auto [j0, j1] = unit_panel(block_begin, block_end, q);
    if (j1 - j0 == 3) {
      backward_panel<scalar_t, 3>(s, j0);
    } else if (j1 - j0 == 2) {
      backward_panel<scalar_t, 2>(s, j0);
    } else {
      backward_panel<scalar_t, 1>(s, j0);
    }
  }
}

// The kernels of this capability for one dtype (nullptrs for others).
template <typename scalar_t>
Kernels kernels_of() {
  return {Vec<at::opmath_type<scalar_t>>::size(),
          kRows<1>,
          kTileCols * Vec<at::opmath_type<scalar_t>>::size(),
          &pack_gates<scalar_t>,
          &pack_units<scalar_t>,
          &forward_blocks<scalar_t>,
          &backward_blocks<scalar_t>,
          &gemm<scalar_t>};
}

inline Kernels kernels_for(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float:
      return kernels_of<float>();
    case c10::ScalarType::Double:
      return kernels_of<double>();
    case c10::ScalarType::BFloat16:
      return kernels_of<c10::BFloat16>();
    case c10::ScalarType::Half:
      return kernels_of<c10::Half>();
    default:
      return {};
  }
}

}  // namespace CPU_CAPABILITY
}  // namespace cpu
}  // namespace lltm
