// torch.nn.LSTM's cell. Gates (i, f, g, o), torch's order; states (h, c).
//   i = sigmoid(z_i), f = sigmoid(z_f), g = tanh(z_g), o = sigmoid(z_o)    z = zx + zh
//   c' = f c + i g;  h' = o tanh(c')
#pragma once

#include "cell.h"

namespace lltm {
namespace cells {

struct LSTM {
  static constexpr const char* kName = "lstm";
  static constexpr int kGates = 4;
  static constexpr int kStates = 2;
  static constexpr int kSaved = 4;  // the activated gates i, f, g, o
  static constexpr bool kSplit = false;
  static constexpr unsigned kOldRead = 0b10;  // c_{t-1}
  static constexpr unsigned kNewRead = 0b10;  // c_t

  template <typename M, typename T>
  LLTM_CELL_FN void forward(const T (&zx)[4], const T (&zh)[4], const T (&s)[2], T (&next)[2],
                            T (&saved)[4]) {
    const T i = M::sigmoid(zx[0] + zh[0]);
    const T f = M::sigmoid(zx[1] + zh[1]);
    const T g = M::tanh(zx[2] + zh[2]);
    const T o = M::sigmoid(zx[3] + zh[3]);
    next[1] = M::fma(f, s[1], i * g);
    next[0] = o * M::tanh(next[1]);
    saved[0] = i;
    saved[1] = f;
    saved[2] = g;
    saved[3] = o;
  }

  template <typename M, typename T>
  LLTM_CELL_FN void recompute(const T (&s)[2], const T (&saved)[4], T (&next)[2]) {
    next[1] = M::fma(saved[1], s[1], saved[0] * saved[2]);  // c' = f c + i g, as forward rounds it
  }

  template <typename M, typename T>
  LLTM_CELL_FN void backward(const T (&dnext)[2], const T (&s)[2], const T (&next)[2], const T (&saved)[4],
                             T (&dzx)[4], T (& /*dzh*/)[4], T (&ds)[2]) {
    const T one(1.0);
    const T i = saved[0], f = saved[1], g = saved[2], o = saved[3];
    const T k = M::tanh(next[1]);
    const T dc = dnext[1] + dnext[0] * o * (one - k * k);  // d tanh = 1 - tanh^2
    dzx[0] = dc * g * i * (one - i);                       // d sigmoid = s (1 - s)
    dzx[1] = dc * s[1] * f * (one - f);
    dzx[2] = dc * i * (one - g * g);
    dzx[3] = dnext[0] * k * o * (one - o);
    ds[0] = T(0.0);  // h reaches h' only through the gates
    ds[1] = dc * f;  // d c' / d c = f
  }
};

}  // namespace cells
}  // namespace lltm
