// The cells' math on the CPU, on at::vec::Vectorized values: the vector
// functions of the cells' math policy (cells/cell.h: VecMath below), and
// loads and stores of one vector of units in opmath. The step kernels
// (step_kernels.h) run each cell's pointwise code, written once in its
// traits header, on the accumulators of their GEMM tiles.
//
// Included by the kernels_<capability>.cpp files only, after each has
// chosen its instruction set: everything here lives in the inline namespace
// CPU_CAPABILITY, like at::vec itself, so the copies compiled for different
// instruction sets never meet at link time.
//
// Arithmetic runs in opmath_t: float for float, bfloat16 and half (loaded,
// computed in fp32, rounded once on store), double for double. A row's last
// vector of units may be partial: loads fill the lanes past the row with 0,
// stores leave them alone, so the math runs on whole vectors only.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace lltm {
namespace cpu {
inline namespace CPU_CAPABILITY {

template <typename T>
using Vec = at::vec::Vectorized<T>;

// ---- vector math -----------------------------------------------------------

// e^x: at::vec's (Sleef, a call into libtorch) by default.
template <typename T>
inline Vec<T> exp_vec(const Vec<T>& x) {
  return x.exp();
}
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
// float e^x and e^x - 1 inline, within 2 ulp: the calls into Sleef cost more
// than their arithmetic here (each spills the live vector registers), and
// the forward pass makes four per element. x = n ln2 + r with |r| <= ln2 / 2
// (ln2 split in two so that n ln2 is exact); p = e^r - 1 by its Taylor
// series to r^7 (truncation < 2e-8 relative), s = 2^n from the exponent bits:
//   e^x = s p + s,   e^x - 1 = s p + (s - 1)
// the latter exact in its last step where n = 0 (|x| < ln2 / 2), the range
// where e^x - 1 would cancel. x is clamped to [-87, 88] so that 2^n stays a
// normal float: e^x saturates at e^-87 and e^88 outside, which the gates
// never tell apart from 0 and infinity (1 / (1 + e^88) < 1e-38).
struct ExpParts {
  Vec<float> p, s;
};
inline ExpParts exp_parts(const Vec<float>& x_in) {
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
  const Vec<int32_t> biased = at::vec::convert_to_int_of_same_size(n) + Vec<int32_t>(127);
  return {p * r, at::vec::cast<float>(biased << Vec<int32_t>(23))};
}
template <>
inline Vec<float> exp_vec(const Vec<float>& x) {
  const ExpParts e = exp_parts(x);
  return at::vec::fmadd(e.s, e.p, e.s);
}
#endif

// 1 / x: a division by default.
template <typename T>
inline Vec<T> reciprocal(const Vec<T>& x) {
  return x.reciprocal();
}
#if defined(CPU_CAPABILITY_AVX512)
// float 1 / x from the 14-bit estimate and one Newton step (relative error
// below 2^-27, under one ulp): a zmm division occupies the divider for
// several cycles, and the forward pass makes three per element.
template <>
inline Vec<float> reciprocal(const Vec<float>& x) {
  const Vec<float> r(_mm512_rcp14_ps(x));
  return r * at::vec::fnmadd(x, r, Vec<float>(2.0f));  // r (2 - x r)
}
#endif

template <typename T>
inline Vec<T> sigmoid(const Vec<T>& z) {
  const Vec<T> one(T(1));
  return reciprocal(one + exp_vec(z.neg()));
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
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
// float: one range reduction and one polynomial (see exp_parts) instead of
// the series and e^x above.
template <>
inline Vec<float> expm1(const Vec<float>& x) {
  const ExpParts e = exp_parts(x);
  return at::vec::fmadd(e.s, e.p, e.s - Vec<float>(1.0f));
}
#endif
template <typename T>
inline Vec<T> elu(const Vec<T>& z) {
  return Vec<T>::blendv(expm1(z), z, z > Vec<T>(T(0)));
}
// tanh(x) = sign(x) (1 - e^-2|x|) / (1 + e^-2|x|), the numerator by expm1 (no
// cancellation near 0); Sleef's tanh costs about as much as its expm1.
template <typename T>
inline Vec<T> tanh(const Vec<T>& x) {
  const Vec<T> e = expm1(x.abs() * Vec<T>(T(-2)));  // in (-1, 0]
  const Vec<T> t = e.neg() * reciprocal(e + Vec<T>(T(2)));
  return Vec<T>::blendv(t, t.neg(), x < Vec<T>(T(0)));
}

// ---- loads and stores in opmath ---------------------------------------------

template <typename T>
inline Vec<T> load(const T* p) {
  return Vec<T>::loadu(p);
}
template <typename T>
inline void store(T* p, const Vec<T>& v) {
  v.store(p);
}
// bfloat16 / half: Vec<float>::size() elements widened to one float vector.
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
#if defined(CPU_CAPABILITY_AVX512)
// one float vector narrowed, not two (convert_from_float takes a pair and
// rounds both: here the same vector twice, twice the work per store)
inline void store(c10::BFloat16* p, const Vec<float>& v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), at::vec::cvtfp32_bf16(__m512(v)));
}
inline void store(c10::Half* p, const Vec<float>& v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), at::vec::cvtfp32_fp16(__m512(v)));
}
#endif

// The first n (<= one vector) elements at p, in opmath; 0 in the other lanes.
template <typename T>
inline Vec<at::opmath_type<T>> load(const T* p, int64_t n) {
  using acc_t = at::opmath_type<T>;
  if (n == Vec<acc_t>::size()) return load(p);
  if constexpr (std::is_same_v<T, acc_t>) {
    return Vec<T>::loadu(p, n);
  } else {
    T buf[Vec<acc_t>::size()] = {};
    for (int64_t k = 0; k < n; ++k) buf[k] = p[k];
    return load(buf);
  }
}
// Stores the first n (<= one vector) lanes of v at p.
template <typename T>
inline void store(T* p, const Vec<at::opmath_type<T>>& v, int64_t n) {
  using acc_t = at::opmath_type<T>;
  if (n == Vec<acc_t>::size()) {
    store(p, v);
  } else if constexpr (std::is_same_v<T, acc_t>) {
    v.store(p, n);
  } else {
    T buf[Vec<acc_t>::size()];
    store(buf, v);
    for (int64_t k = 0; k < n; ++k) p[k] = buf[k];
  }
}

// ---- the cells' math policy (cells/cell.h) -----------------------------------

// The math policy M of the cells' pointwise code (cells/cell.h) on one vector
// of opmath values: the functions above, and at::vec's fused multiply-add
// (one instruction in the AVX2 and AVX-512 builds, a product then a sum in
// the baseline build: every kernel of one build rounds a cell's state update
// the same way, the forward and the recompute of backward alike).
template <typename T>
struct VecMath {
  using V = Vec<T>;
  static V sigmoid(const V& x) { return cpu::CPU_CAPABILITY::sigmoid(x); }
  static V tanh(const V& x) { return cpu::CPU_CAPABILITY::tanh(x); }
  static V exp(const V& x) { return exp_vec(x); }
  static V expm1(const V& x) { return cpu::CPU_CAPABILITY::expm1(x); }
  static V elu(const V& x) { return cpu::CPU_CAPABILITY::elu(x); }
  // x > y ? a : b
  static V where_gt(const V& x, const V& y, const V& a, const V& b) { return V::blendv(b, a, x > y); }
  // a b + c
  static V fma(const V& a, const V& b, const V& c) { return at::vec::fmadd(a, b, c); }
};

}  // namespace CPU_CAPABILITY
}  // namespace cpu
}  // namespace lltm
