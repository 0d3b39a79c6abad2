// Device-side math of the LLTM cell, shared by every CUDA kernel.
//
// Arithmetic runs in `acc_t` = at::opmath_type<scalar_t>: float for float,
// half and bfloat16, double for double. Each function has a float and a
// double overload, so double never goes through a float-only routine (the
// tutorial's fmax/fmin on doubles truncated to float and failed gradcheck).
#pragma once

#include <ATen/OpMathType.h>
#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "../cells/registry.h"

namespace lltm {
namespace cuda_detail {

// sigmoid(z) = 1 / (1 + e^-z)
__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }
__device__ __forceinline__ double sigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }

// elu(z) = z for z > 0, e^z - 1 otherwise (alpha = 1)
__device__ __forceinline__ float elu(float z) { return z > 0.0f ? z : expm1f(z); }
__device__ __forceinline__ double elu(double z) { return z > 0.0 ? z : expm1(z); }

__device__ __forceinline__ float tanh_(float z) { return tanhf(z); }
__device__ __forceinline__ double tanh_(double z) { return tanh(z); }

// Fast forms for the persistent kernels' float math (float32 and the
// 2-byte types): the SFU's exponential and reciprocal in place of the
// accurate expf / expm1f / tanhf and IEEE division, each within ~2.5e-7 of
// the exact value (absolute; a few float ulps relative where the value is not
// near 0), far below a half-precision ulp of the gates and below the
// round-off a float32 step's dot product adds (tests/test_seq_paths.py
// holds T = 1000 in float32 to twice plain PyTorch's error).
__device__ __forceinline__ float sigmoid_fast(float z) { return __fdividef(1.0f, 1.0f + __expf(-z)); }
__device__ __forceinline__ float elu_fast(float z) {
  if (z > 0.0f) return z;
  // e^z - 1 cancels near 0: its Taylor polynomial there (the next term is < 4e-10 for z > -1/4)
  if (z > -0.25f) {
    float p = 1.0f / 5040.0f;
    p = p * z + 1.0f / 720.0f;
    p = p * z + 1.0f / 120.0f;
    p = p * z + 1.0f / 24.0f;
    p = p * z + 1.0f / 6.0f;
    p = p * z + 0.5f;
    p = p * z + 1.0f;
    return p * z;
  }
  return __expf(z) - 1.0f;
}
// tanh(z) = 1 - 2 / (1 + e^2z); e^2z = inf gives 1, e^2z = 0 gives -1
__device__ __forceinline__ float tanh_fast(float z) {
  return 1.0f - __fdividef(2.0f, 1.0f + __expf(2.0f * z));
}

// The cells' math policy on a thread's float or double values (cells/cell.h):
// exact functions for every dtype, or fast ones for float math (kFast).
template <bool kFast>
struct Activations {
  template <typename T>
  __device__ static __forceinline__ T sigmoid(T z) {
    return cuda_detail::sigmoid(z);
  }
  template <typename T>
  __device__ static __forceinline__ T elu(T z) {
    return cuda_detail::elu(z);
  }
  template <typename T>
  __device__ static __forceinline__ T tanh(T z) {
    return tanh_(z);
  }
  __device__ static __forceinline__ float exp(float z) { return expf(z); }
  __device__ static __forceinline__ double exp(double z) { return ::exp(z); }
  __device__ static __forceinline__ float expm1(float z) { return expm1f(z); }
  __device__ static __forceinline__ double expm1(double z) { return ::expm1(z); }
  template <typename T>
  __device__ static __forceinline__ T where_gt(T x, T y, T a, T b) {
    return x > y ? a : b;
  }
  __device__ static __forceinline__ float fma(float a, float b, float c) { return fmaf(a, b, c); }
  __device__ static __forceinline__ double fma(double a, double b, double c) { return ::fma(a, b, c); }
};

template <>
struct Activations<true> : Activations<false> {
  __device__ static __forceinline__ float sigmoid(float z) { return sigmoid_fast(z); }
  __device__ static __forceinline__ float elu(float z) { return elu_fast(z); }
  __device__ static __forceinline__ float tanh(float z) { return tanh_fast(z); }
  __device__ static __forceinline__ float exp(float z) { return __expf(z); }
};

// One LLTM step from the gate pre-activations (bias included): the LLTM
// cell's own code (cells/lltm.h), for the single-step kernels.
template <typename acc_t, bool kFast = false>
struct CellForward {
  acc_t input_gate, output_gate, candidate, new_cell, new_h;

  __device__ __forceinline__ CellForward(acc_t z_i, acc_t z_o, acc_t z_c, acc_t old_cell) {
    const acc_t zx[3] = {z_i, z_o, z_c}, zh[3] = {acc_t(0), acc_t(0), acc_t(0)};
    const acc_t s[2] = {acc_t(0), old_cell};
    acc_t next[2], saved[3];
    cells::LLTM::forward<Activations<kFast>>(zx, zh, s, next, saved);
    input_gate = saved[0];
    output_gate = saved[1];
    candidate = saved[2];
    new_cell = next[1];
    new_h = next[0];
  }
};

// Gradients of one LLTM step with respect to the gate pre-activations and
// the old cell, from the saved activations (cells/lltm.h).
template <typename acc_t, bool kFast = false>
struct CellBackward {
  acc_t d_input, d_output, d_candidate;  // d loss / d pre-activation
  acc_t d_cell;                          // d loss / d old_cell = d loss / d c'

  __device__ __forceinline__ CellBackward(acc_t grad_h, acc_t grad_cell, acc_t new_cell, acc_t input_gate,
                                          acc_t output_gate, acc_t candidate) {
    const acc_t dnext[2] = {grad_h, grad_cell}, s[2] = {acc_t(0), acc_t(0)}, next[2] = {acc_t(0), new_cell};
    const acc_t saved[3] = {input_gate, output_gate, candidate};
    acc_t dz[3], unused[3], ds[2];
    cells::LLTM::backward<Activations<kFast>>(dnext, s, next, saved, dz, unused, ds);
    d_input = dz[0];
    d_output = dz[1];
    d_candidate = dz[2];
    d_cell = ds[1];
  }
};

// V consecutive elements, aligned so that one 16-byte (or narrower) memory
// instruction moves them.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T val[V];
};

template <typename acc_t, typename T, int V>
__device__ __forceinline__ void load_pack(const T* p, acc_t (&out)[V]) {
  const Pack<T, V> pack = *reinterpret_cast<const Pack<T, V>*>(p);
#pragma unroll
  for (int v = 0; v < V; ++v) out[v] = static_cast<acc_t>(pack.val[v]);
}

// Loads V elements of a row, element v at p[v * col_stride]; one vector load
// when the caller has checked that they are contiguous and aligned.
template <typename acc_t, typename T, int V>
__device__ __forceinline__ void load_pack_strided(const T* p, int64_t col_stride, bool vectorized,
                                                  acc_t (&out)[V]) {
  if (vectorized) {
    load_pack<acc_t, T, V>(p, out);
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = static_cast<acc_t>(p[v * col_stride]);
  }
}

template <typename acc_t, typename T, int V>
__device__ __forceinline__ void store_pack(T* p, const acc_t (&in)[V]) {
  Pack<T, V> pack;
#pragma unroll
  for (int v = 0; v < V; ++v) pack.val[v] = static_cast<T>(in[v]);
  *reinterpret_cast<Pack<T, V>*>(p) = pack;
}

}  // namespace cuda_detail
}  // namespace lltm
