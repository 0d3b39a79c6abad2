// The cells' math policy (cells/cell.h) on whole tensors, for the ATen
// backend: a cell's pointwise code runs once per step on (B, S) tensors, one
// ATen op per operation. Constants (T(1.0) in a cell) stay scalars until
// they meet a tensor, so they cost no allocation.
#pragma once

#include <ATen/ATen.h>

namespace lltm {
namespace aten_detail {

// A tensor, or a constant.
struct Value {
  at::Tensor t;
  double c = 0.0;

  Value() = default;
  Value(double constant) : c(constant) {}             // NOLINT(google-explicit-constructor): a cell's T(1.0)
  Value(at::Tensor tensor) : t(std::move(tensor)) {}  // NOLINT(google-explicit-constructor)
  bool is_constant() const { return !t.defined(); }
};

inline Value operator+(const Value& a, const Value& b) {
  if (a.is_constant() && b.is_constant()) return Value(a.c + b.c);
  if (a.is_constant()) return Value(b.t + a.c);
  if (b.is_constant()) return Value(a.t + b.c);
  return Value(a.t + b.t);
}
inline Value operator-(const Value& a, const Value& b) {
  if (a.is_constant() && b.is_constant()) return Value(a.c - b.c);
  if (a.is_constant()) return Value(at::rsub(b.t, a.c));  // c - b
  if (b.is_constant()) return Value(a.t - b.c);
  return Value(a.t - b.t);
}
inline Value operator*(const Value& a, const Value& b) {
  if (a.is_constant() && b.is_constant()) return Value(a.c * b.c);
  if (a.is_constant()) return Value(b.t * a.c);
  if (b.is_constant()) return Value(a.t * b.c);
  return Value(a.t * b.t);
}

struct TensorMath {
  static Value sigmoid(const Value& x) { return Value(at::sigmoid(x.t)); }
  static Value tanh(const Value& x) { return Value(at::tanh(x.t)); }
  static Value exp(const Value& x) { return Value(at::exp(x.t)); }
  static Value expm1(const Value& x) { return Value(at::expm1(x.t)); }
  static Value elu(const Value& x) { return Value(at::elu(x.t)); }
  static Value where_gt(const Value& x, const Value& y, const Value& a, const Value& b) {
    const at::Tensor cond = y.is_constant() ? at::gt(x.t, y.c) : at::gt(x.t, y.t);
    if (a.is_constant() && b.is_constant()) return Value(at::where(cond, a.c, b.c));
    if (a.is_constant()) return Value(at::where(cond, at::Scalar(a.c), b.t));
    if (b.is_constant()) return Value(at::where(cond, a.t, at::Scalar(b.c)));
    return Value(at::where(cond, a.t, b.t));
  }
  // a b + c: at::addcmul (one fused multiply-add in ATen's AVX2 / AVX-512 CPU kernels and on CUDA)
  static Value fma(const Value& a, const Value& b, const Value& c) {
    if (a.is_constant() || b.is_constant()) return a * b + c;
    if (c.is_constant()) return Value(at::addcmul(at::full_like(a.t, c.c), a.t, b.t));
    return Value(at::addcmul(c.t, a.t, b.t));
  }
};

}  // namespace aten_detail
}  // namespace lltm
