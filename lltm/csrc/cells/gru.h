// torch.nn.GRU's cell. Gates (r, z, n), torch's order; one state (h).
//   r = sigmoid(zx_r + zh_r), z = sigmoid(zx_z + zh_z)
//   n = tanh(zx_n + r zh_n)          (zh_n = h W_hn^T + b_hn: kept apart)
//   h' = (1 - z) n + z h
#pragma once

#include "cell.h"

namespace lltm {
namespace cells {

struct GRU {
  static constexpr const char* kName = "gru";
  static constexpr int kGates = 3;
  static constexpr int kStates = 1;
  static constexpr int kSaved = 4;  // r, z, n and zh_n
  static constexpr bool kSplit = true;
  static constexpr unsigned kOldRead = 0b1;  // h_{t-1}
  static constexpr unsigned kNewRead = 0;

  template <typename M, typename T>
  LLTM_CELL_FN void forward(const T (&zx)[3], const T (&zh)[3], const T (&s)[1], T (&next)[1],
                            T (&saved)[4]) {
    const T r = M::sigmoid(zx[0] + zh[0]);
    const T z = M::sigmoid(zx[1] + zh[1]);
    const T n = M::tanh(zx[2] + r * zh[2]);
    next[0] = n + z * (s[0] - n);  // (1 - z) n + z h
    saved[0] = r;
    saved[1] = z;
    saved[2] = n;
    saved[3] = zh[2];
  }

  template <typename M, typename T>
  LLTM_CELL_FN void recompute(const T (& /*s*/)[1], const T (& /*saved*/)[4], T (& /*next*/)[1]) {}

  template <typename M, typename T>
  LLTM_CELL_FN void backward(const T (&dnext)[1], const T (&s)[1], const T (& /*next*/)[1],
                             const T (&saved)[4], T (&dzx)[3], T (&dzh)[3], T (&ds)[1]) {
    const T one(1.0);
    const T r = saved[0], z = saved[1], n = saved[2], hn = saved[3];
    const T dh = dnext[0];
    const T dn = dh * (one - z) * (one - n * n);  // through n = tanh(.)
    const T dz = dh * (s[0] - n) * z * (one - z);
    const T dr = dn * hn * r * (one - r);
    dzx[0] = dr;
    dzx[1] = dz;
    dzx[2] = dn;
    dzh[0] = dr;
    dzh[1] = dz;
    dzh[2] = dn * r;  // zh_n enters as r zh_n
    ds[0] = dh * z;   // h' = ... + z h
  }
};

}  // namespace cells
}  // namespace lltm
