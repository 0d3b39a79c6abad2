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

// The activations of a cell: exact (every dtype), or fast (float math,
// kFast).
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
};

template <>
struct Activations<true> {
  __device__ static __forceinline__ float sigmoid(float z) { return sigmoid_fast(z); }
  __device__ static __forceinline__ float elu(float z) { return elu_fast(z); }
  __device__ static __forceinline__ float tanh(float z) { return tanh_fast(z); }
};

// One cell step from the gate pre-activations (bias included).
template <typename acc_t, bool kFast = false>
struct CellForward {
  acc_t input_gate, output_gate, candidate, new_cell, new_h;

  __device__ __forceinline__ CellForward(acc_t z_i, acc_t z_o, acc_t z_c, acc_t old_cell) {
    using A = Activations<kFast>;
    input_gate = A::sigmoid(z_i);
    output_gate = A::sigmoid(z_o);
    candidate = A::elu(z_c);
    new_cell = old_cell + candidate * input_gate;  // c' = c + elu(z_c) * i
    new_h = A::tanh(new_cell) * output_gate;       // h' = tanh(c') * o
  }
};

// Gradients of one cell step with respect to the gate pre-activations and the
// old cell, from the saved activations (every derivative is a function of
// the activation, so the pre-activations are never stored).
template <typename acc_t, bool kFast = false>
struct CellBackward {
  acc_t d_input, d_output, d_candidate;  // d loss / d pre-activation
  acc_t d_cell;                          // d loss / d old_cell = d loss / d c'

  __device__ __forceinline__ CellBackward(acc_t grad_h, acc_t grad_cell, acc_t new_cell, acc_t input_gate,
                                          acc_t output_gate, acc_t candidate) {
    const acc_t one = acc_t(1);
    const acc_t t = Activations<kFast>::tanh(new_cell);
    // d h' / d o = tanh(c');  d tanh(c') = 1 - tanh(c')^2
    const acc_t d_og = grad_h * t;
    d_cell = grad_cell + grad_h * output_gate * (one - t * t);
    const acc_t d_ig = d_cell * candidate;     // d c' / d i = elu(z_c)
    const acc_t d_cand = d_cell * input_gate;  // d c' / d elu(z_c) = i
    // d sigmoid(z) = s (1 - s)
    d_input = d_ig * input_gate * (one - input_gate);
    d_output = d_og * output_gate * (one - output_gate);
    // d elu(z) = 1 for z > 0, elu(z) + 1 otherwise
    d_candidate = d_cand * (candidate > acc_t(0) ? one : candidate + one);
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
