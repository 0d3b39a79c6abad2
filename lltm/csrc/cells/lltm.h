// The LLTM cell of PyTorch's C++/CUDA extension tutorial: an LSTM without a
// forget gate, with an ELU candidate. Gates (i, o, c), states (h, c).
//   i = sigmoid(z_i), o = sigmoid(z_o), a = elu(z_c)     z = zx + zh
//   c' = c + a i;  h' = tanh(c') o
// Its public weights (3S, S + I) are [W_hh | W_ih] side by side and its one
// bias is b_ih (no b_hh): the operators pass views of them.
#pragma once

#include "cell.h"

namespace lltm {
namespace cells {

struct LLTM {
  static constexpr const char* kName = "lltm";
  static constexpr int kGates = 3;
  static constexpr int kStates = 2;
  static constexpr int kSaved = 3;  // the activated gates i, o, a
  static constexpr bool kSplit = false;
  static constexpr unsigned kOldRead = 0;     // nothing of the previous states
  static constexpr unsigned kNewRead = 0b10;  // c_t

  template <typename M, typename T>
  LLTM_CELL_FN void forward(const T (&zx)[3], const T (&zh)[3], const T (&s)[2], T (&next)[2],
                            T (&saved)[3]) {
    const T i = M::sigmoid(zx[0] + zh[0]);
    const T o = M::sigmoid(zx[1] + zh[1]);
    const T a = M::elu(zx[2] + zh[2]);
    next[1] = M::fma(a, i, s[1]);
    next[0] = M::tanh(next[1]) * o;
    saved[0] = i;
    saved[1] = o;
    saved[2] = a;
  }

  template <typename M, typename T>
  LLTM_CELL_FN void recompute(const T (&s)[2], const T (&saved)[3], T (&next)[2]) {
    next[1] = M::fma(saved[2], saved[0], s[1]);  // c' = c + a i, as forward rounds it
  }

  template <typename M, typename T>
  LLTM_CELL_FN void backward(const T (&dnext)[2], const T (& /*s*/)[2], const T (&next)[2],
                             const T (&saved)[3], T (&dzx)[3], T (& /*dzh*/)[3], T (&ds)[2]) {
    const T one(1.0);
    const T i = saved[0], o = saved[1], a = saved[2];
    const T k = M::tanh(next[1]);
    const T dc = dnext[1] + dnext[0] * o * (one - k * k);  // d tanh = 1 - tanh^2
    dzx[0] = dc * a * i * (one - i);                       // d sigmoid = s (1 - s)
    dzx[1] = dnext[0] * k * o * (one - o);
    dzx[2] = dc * i * M::where_gt(a, T(0.0), one, a + one);  // d elu = 1, or elu + 1 below 0
    ds[0] = T(0.0);                                          // h reaches h' only through the gates
    ds[1] = dc;                                              // d c' / d c = 1
  }
};

}  // namespace cells
}  // namespace lltm
