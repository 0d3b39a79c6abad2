// The fused CPU backend's pointwise passes, as seen by the operators
// (cell_cpu.cpp, seq_cpu.cpp): one forward and one backward pass over a
// range of batch rows of one time step, everything between two GEMMs.
//
// The passes are compiled once per CPU capability (pointwise_default.cpp,
// pointwise_avx2.cpp, pointwise_avx512.cpp, each with its own instruction
// set) and the one matching torch's own choice (at::get_cpu_capability(),
// which honours ATEN_CPU_CAPABILITY) is picked at run time. This header is
// compiled with the baseline flags: plain types only.
//
// Layout: every buffer is contiguous, rows of S (state) or 3S (gates)
// elements; S = state size, B = batch.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace lltm {
namespace cpu {

// One forward step: pre-activations -> activated gates, new cell, new h.
struct ForwardStep {
  void* gates;              // (B, 3S) in: pre-activations without bias (and
                            // without hproj when given); out: activated gates
  const void* hproj;        // (B, 3S) h_{t-1} W_h^T to add, or nullptr
  const void* bias;         // (3S,) or nullptr
  const void* old_cell;     // (B, S) c_{t-1}
  void* new_cell;           // (B, S) c_t
  void* new_h;              // (B, S) h_t (0 on rows past their length)
  void* h_carry;            // (B, S) carried h, or nullptr: written on rows
                            // inside their length when lengths is given
  const int64_t* lengths;   // (B,) or nullptr (every row takes the step)
  int64_t step;             // t, compared with lengths
  int64_t state;            // S
};

// One backward step: incoming gradients -> gradients of the gate
// pre-activations and of the old cell.
struct BackwardStep {
  void* grad_h;             // (B, S) gradient of h_t carried from t + 1 (cell:
                            // grad_h); set to 0 on rows inside their length
                            // when zero_grad_h (the caller then accumulates
                            // the next GEMM into it)
  const void* grad_out;     // (B, S) gradient of output[t], added, or nullptr
  const void* dc_in;        // (B, S) gradient of c_t from t + 1 (cell: grad_cell)
  void* dc_out;             // (B, S) gradient of c_{t-1}, or nullptr; may be dc_in
  const void* new_cell;     // (B, S) c_t
  const void* gates;        // (B, 3S) activated gates of step t
  void* d_pre;              // (B, 3S) out: gradient of the pre-activations
  const int64_t* lengths;   // (B,) or nullptr
  int64_t step;             // t
  int64_t state;            // S
  bool zero_grad_h;
  // dc_in / dc_out hold float (opmath) values instead of the tensors' dtype
  // (the sequence keeps the carried cell gradient in fp32 for bf16 / fp16).
  bool dc_opmath;
};

using ForwardRowsFn = void (*)(const ForwardStep&, int64_t begin, int64_t end);
using BackwardRowsFn = void (*)(const BackwardStep&, int64_t begin, int64_t end);

// The passes of one capability, for one dtype.
struct PointwiseKernels {
  ForwardRowsFn forward;
  BackwardRowsFn backward;
};

// Kernels of one capability for `dtype` (float, double, bfloat16, half).
PointwiseKernels pointwise_default(c10::ScalarType dtype);
PointwiseKernels pointwise_avx2(c10::ScalarType dtype);
PointwiseKernels pointwise_avx512(c10::ScalarType dtype);

// The kernels for `dtype` at the capability torch runs with.
PointwiseKernels pointwise_kernels(c10::ScalarType dtype);

// "avx512", "avx2" or "default": the capability pointwise_kernels uses.
const char* pointwise_capability();

}  // namespace cpu
}  // namespace lltm
