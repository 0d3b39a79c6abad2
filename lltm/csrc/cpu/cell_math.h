// The LLTM cell's pointwise math on the CPU, scalar and at::vec::Vectorized,
// and the row loops of the fused passes built from it (see pointwise.h).
//
// Included by the pointwise_<capability>.cpp files only, after each has
// chosen its instruction set: everything here lives in the inline namespace
// CPU_CAPABILITY, like at::vec itself, so the copies compiled for different
// instruction sets never meet at link time.
//
// Arithmetic runs in opmath_t: float for float, bfloat16 and half (loaded,
// computed in fp32, rounded once on store), double for double. A row is
// processed in vectors of Vec::size() elements; the tail that does not fill
// a vector goes through the scalar versions of the same formulas.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "pointwise.h"

namespace lltm {
namespace cpu {
inline namespace CPU_CAPABILITY {

template <typename T>
using Vec = at::vec::Vectorized<T>;

// ---- scalar math -----------------------------------------------------------

// sigmoid(z) = 1 / (1 + e^-z)
template <typename T>
inline T sigmoid(T z) {
  return T(1) / (T(1) + std::exp(-z));
}
// elu(z) = z for z > 0, e^z - 1 otherwise (alpha = 1)
template <typename T>
inline T elu(T z) {
  return z > T(0) ? z : std::expm1(z);
}
// d elu(z) = 1 for z > 0, elu(z) + 1 otherwise: a function of the activation
template <typename T>
inline T elu_grad(T a) {
  return a > T(0) ? T(1) : a + T(1);
}

// ---- vector math -----------------------------------------------------------

// e^x: at::vec's (Sleef, a call into libtorch) by default.
template <typename T>
inline Vec<T> exp_vec(const Vec<T>& x) {
  return x.exp();
}
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
// float e^x inline, within 2 ulp: the calls into Sleef cost more than their
// arithmetic here (each spills the live vector registers), and the pass makes
// four per element. x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two so
// that n ln2 is exact), e^r by its Taylor series to r^7 (truncation < 6e-9),
// 2^n from the exponent bits. x is clamped to [-87, 88] so that 2^n stays a
// normal float: e^x saturates at e^-87 and e^88 outside, which the gates never
// tell apart from 0 and infinity (1 / (1 + e^88) < 1e-38).
template <>
inline Vec<float> exp_vec(const Vec<float>& x_in) {
  const Vec<float> x = at::vec::clamp(x_in, Vec<float>(-87.0f), Vec<float>(88.0f));
  const Vec<float> n = (x * Vec<float>(1.44269504088896341f)).round();  // x / ln2
  Vec<float> r = at::vec::fmadd(n, Vec<float>(-0.693359375f), x);
  r = at::vec::fmadd(n, Vec<float>(2.12194440e-4f), r);
  Vec<float> p(1.0f / 5040);
  p = at::vec::fmadd(p, r, Vec<float>(1.0f / 720));
  p = at::vec::fmadd(p, r, Vec<float>(1.0f / 120));
  p = at::vec::fmadd(p, r, Vec<float>(1.0f / 24));
  p = at::vec::fmadd(p, r, Vec<float>(1.0f / 6));
  p = at::vec::fmadd(p, r, Vec<float>(0.5f));
  p = at::vec::fmadd(p, r, Vec<float>(1.0f));
  p = at::vec::fmadd(p, r, Vec<float>(1.0f));
  const Vec<int32_t> biased = at::vec::convert_to_int_of_same_size(n) + Vec<int32_t>(127);
  return p * at::vec::cast<float>(biased << Vec<int32_t>(23));
}
#endif

template <typename T>
inline Vec<T> sigmoid(const Vec<T>& z) {
  const Vec<T> one(T(1));
  return (one + exp_vec(z.neg())).reciprocal();
}
// e^x - 1 to a few ulp, without Sleef's expm1 (measured at ~20x the cost of
// its exp, the largest item of the forward pass): where |x| < 0.35, where
// e^x - 1 would cancel, the Taylor series x sum_{k<K} x^k / (k+1)! (K = 8
// terms leave < 1e-9 relative for float, K = 13 < 1e-16 for double);
// elsewhere e^x - 1, within 3 ulp there.
template <typename T>
inline Vec<T> expm1(const Vec<T>& x) {
  constexpr int kTerms = std::is_same_v<T, double> ? 13 : 8;
  // 1 / (k + 1)! for k = 0 .. kTerms - 1
  constexpr double kInvFactorial[13] = {1.0,
                                        1.0 / 2,
                                        1.0 / 6,
                                        1.0 / 24,
                                        1.0 / 120,
                                        1.0 / 720,
                                        1.0 / 5040,
                                        1.0 / 40320,
                                        1.0 / 362880,
                                        1.0 / 3628800,
                                        1.0 / 39916800,
                                        1.0 / 479001600,
                                        1.0 / 6227020800.0};
  Vec<T> p(static_cast<T>(kInvFactorial[kTerms - 1]));
  for (int k = kTerms - 2; k >= 0; --k) {
    p = at::vec::fmadd(p, x, Vec<T>(static_cast<T>(kInvFactorial[k])));
  }
  const Vec<T> one(T(1));
  return Vec<T>::blendv(exp_vec(x) - one, p * x, x.abs() < Vec<T>(T(0.35)));
}
template <typename T>
inline Vec<T> elu(const Vec<T>& z) {
  return Vec<T>::blendv(expm1(z), z, z > Vec<T>(T(0)));
}
// tanh(x) = sign(x) (1 - e^-2|x|) / (1 + e^-2|x|), the numerator by expm1 (no
// cancellation near 0); Sleef's tanh costs about as much as its expm1.
template <typename T>
inline Vec<T> tanh(const Vec<T>& x) {
  const Vec<T> e = expm1(x.abs() * Vec<T>(T(-2)));  // in (-1, 0]
  const Vec<T> t = e.neg() / (e + Vec<T>(T(2)));
  return Vec<T>::blendv(t, t.neg(), x < Vec<T>(T(0)));
}
template <typename T>
inline Vec<T> elu_grad(const Vec<T>& a) {
  const Vec<T> one(T(1));
  return Vec<T>::blendv(a + one, one, a > Vec<T>(T(0)));
}

// ---- loads and stores in opmath ---------------------------------------------

// Width of one step of the row loops: one vector of opmath values.
template <typename scalar_t>
constexpr int64_t kWidth = Vec<at::opmath_type<scalar_t>>::size();

template <typename T>
inline Vec<T> load(const T* p) {
  return Vec<T>::loadu(p);
}
template <typename T>
inline void store(T* p, const Vec<T>& v) {
  v.store(p);
}
// bfloat16 / half: kWidth<T> elements widened to one float vector.
inline Vec<float> load(const c10::BFloat16* p) {
  Vec<float> out;
  at::vec::load_to_float(p, out);
  return out;
}
inline Vec<float> load(const c10::Half* p) {
  Vec<float> out;
  at::vec::load_to_float(p, out);
  return out;
}
template <typename T, typename = std::enable_if_t<at::is_reduced_floating_point_v<T>>>
inline void store(T* p, const Vec<float>& v) {
  at::vec::convert_from_float<T>(v, v).store(p, Vec<float>::size());
}

// ---- the passes ------------------------------------------------------------

// Forward over rows [begin, end) of one step (ForwardStep in pointwise.h):
//   z = gates (+ hproj) (+ bias);  i = sigmoid(z_i), o = sigmoid(z_o), a = elu(z_c)
//   c' = c + a * i;  h' = tanh(c') * o
// Rows past their length: zero gates, c' = c, h' (output) = 0, h_carry kept.
template <typename scalar_t>
void forward_rows(const ForwardStep& s, int64_t begin, int64_t end) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int64_t W = kWidth<scalar_t>;
  const int64_t S = s.state;
  const auto* bias = static_cast<const scalar_t*>(s.bias);
  for (int64_t b = begin; b < end; ++b) {
    scalar_t* g = static_cast<scalar_t*>(s.gates) + b * 3 * S;
    const scalar_t* hp = s.hproj ? static_cast<const scalar_t*>(s.hproj) + b * 3 * S : nullptr;
    const scalar_t* c = static_cast<const scalar_t*>(s.old_cell) + b * S;
    scalar_t* c_new = static_cast<scalar_t*>(s.new_cell) + b * S;
    scalar_t* h_new = static_cast<scalar_t*>(s.new_h) + b * S;
    scalar_t* h_carry = s.h_carry ? static_cast<scalar_t*>(s.h_carry) + b * S : nullptr;
    if (s.lengths && s.step >= s.lengths[b]) {
      for (int64_t j = 0; j < 3 * S; ++j) g[j] = scalar_t(0);
      for (int64_t j = 0; j < S; ++j) {
        c_new[j] = c[j];
        h_new[j] = scalar_t(0);
      }
      continue;
    }
    int64_t j = 0;
    for (; j + W <= S; j += W) {
      Vec<acc_t> zi = load(g + j), zo = load(g + S + j), zc = load(g + 2 * S + j);
      if (hp) {
        zi += load(hp + j);
        zo += load(hp + S + j);
        zc += load(hp + 2 * S + j);
      }
      if (bias) {
        zi += load(bias + j);
        zo += load(bias + S + j);
        zc += load(bias + 2 * S + j);
      }
      const Vec<acc_t> i = sigmoid(zi), o = sigmoid(zo), a = elu(zc);
      const Vec<acc_t> cn = at::vec::fmadd(a, i, load(c + j));
      const Vec<acc_t> hn = tanh(cn) * o;
      store(g + j, i);
      store(g + S + j, o);
      store(g + 2 * S + j, a);
      store(c_new + j, cn);
      store(h_new + j, hn);
      if (h_carry) store(h_carry + j, hn);
    }
    for (; j < S; ++j) {
      acc_t zi = acc_t(g[j]), zo = acc_t(g[S + j]), zc = acc_t(g[2 * S + j]);
      if (hp) {
        zi += acc_t(hp[j]);
        zo += acc_t(hp[S + j]);
        zc += acc_t(hp[2 * S + j]);
      }
      if (bias) {
        zi += acc_t(bias[j]);
        zo += acc_t(bias[S + j]);
        zc += acc_t(bias[2 * S + j]);
      }
      const acc_t i = sigmoid(zi), o = sigmoid(zo), a = elu(zc);
      const acc_t cn = acc_t(c[j]) + a * i;
      const acc_t hn = std::tanh(cn) * o;
      g[j] = scalar_t(i);
      g[S + j] = scalar_t(o);
      g[2 * S + j] = scalar_t(a);
      c_new[j] = scalar_t(cn);
      h_new[j] = scalar_t(hn);
      if (h_carry) h_carry[j] = scalar_t(hn);
    }
  }
}

// Backward over rows [begin, end) of one step (BackwardStep in pointwise.h),
// from the saved activations i, o, a and c':
//   gh = grad_h (+ grad_out);  k = tanh(c')
//   dc = dc_in + gh * o * (1 - k^2)                 d tanh = 1 - tanh^2
//   d_i = dc * a * i (1 - i);  d_o = gh * k * o (1 - o)     d sigmoid = s (1 - s)
//   d_c = dc * i * elu'(a);  dc_out = dc            d c' / d c = 1
// Rows past their length: d_pre = 0, the cell and h gradients pass through.
template <typename scalar_t, typename dc_t>
void backward_rows_impl(const BackwardStep& s, int64_t begin, int64_t end) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int64_t W = kWidth<scalar_t>;
  const int64_t S = s.state;
  for (int64_t b = begin; b < end; ++b) {
    scalar_t* gh_p = static_cast<scalar_t*>(s.grad_h) + b * S;
    const scalar_t* go = s.grad_out ? static_cast<const scalar_t*>(s.grad_out) + b * S : nullptr;
    const dc_t* dc_in = static_cast<const dc_t*>(s.dc_in) + b * S;
    dc_t* dc_out = s.dc_out ? static_cast<dc_t*>(s.dc_out) + b * S : nullptr;
    const scalar_t* cn = static_cast<const scalar_t*>(s.new_cell) + b * S;
    const scalar_t* g = static_cast<const scalar_t*>(s.gates) + b * 3 * S;
    scalar_t* d = static_cast<scalar_t*>(s.d_pre) + b * 3 * S;
    if (s.lengths && s.step >= s.lengths[b]) {
      for (int64_t j = 0; j < 3 * S; ++j) d[j] = scalar_t(0);
      if (dc_out && dc_out != dc_in) {
        for (int64_t j = 0; j < S; ++j) dc_out[j] = dc_in[j];
      }
      continue;
    }
    const Vec<acc_t> one(acc_t(1));
    int64_t j = 0;
    for (; j + W <= S; j += W) {
      Vec<acc_t> gh = load(gh_p + j);
      if (go) gh += load(go + j);
      const Vec<acc_t> i = load(g + j), o = load(g + S + j), a = load(g + 2 * S + j);
      const Vec<acc_t> k = tanh(load(cn + j));
      const Vec<acc_t> dc = at::vec::fmadd(gh * o, one - k * k, load(dc_in + j));
      store(d + j, dc * a * i * (one - i));
      store(d + S + j, gh * k * o * (one - o));
      store(d + 2 * S + j, dc * i * elu_grad(a));
      if (dc_out) store(dc_out + j, dc);
    }
    for (; j < S; ++j) {
      acc_t gh = acc_t(gh_p[j]);
      if (go) gh += acc_t(go[j]);
      const acc_t i = acc_t(g[j]), o = acc_t(g[S + j]), a = acc_t(g[2 * S + j]);
      const acc_t k = std::tanh(acc_t(cn[j]));
      const acc_t dc = acc_t(dc_in[j]) + gh * o * (acc_t(1) - k * k);
      d[j] = scalar_t(dc * a * i * (acc_t(1) - i));
      d[S + j] = scalar_t(gh * k * o * (acc_t(1) - o));
      d[2 * S + j] = scalar_t(dc * i * elu_grad(a));
      if (dc_out) dc_out[j] = dc_t(dc);
    }
    if (s.zero_grad_h) {
      for (int64_t j2 = 0; j2 < S; ++j2) gh_p[j2] = scalar_t(0);
    }
  }
}

template <typename scalar_t>
void backward_rows(const BackwardStep& s, int64_t begin, int64_t end) {
  using acc_t = at::opmath_type<scalar_t>;
  if (s.dc_opmath) {
    backward_rows_impl<scalar_t, acc_t>(s, begin, end);
  } else {
    backward_rows_impl<scalar_t, scalar_t>(s, begin, end);
  }
}

// The kernels of this capability for one dtype (nullptrs for others).
inline PointwiseKernels kernels_for(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float:
      return {&forward_rows<float>, &backward_rows<float>};
    case c10::ScalarType::Double:
      return {&forward_rows<double>, &backward_rows<double>};
    case c10::ScalarType::BFloat16:
      return {&forward_rows<c10::BFloat16>, &backward_rows<c10::BFloat16>};
    case c10::ScalarType::Half:
      return {&forward_rows<c10::Half>, &backward_rows<c10::Half>};
    default:
      return {nullptr, nullptr};
  }
}

}  // namespace CPU_CAPABILITY
}  // namespace cpu
}  // namespace lltm
