// How lltm's float32 products run: strict fp32, TF32 tensor cores, or the
// accurate mode: tensor cores at fp32's accuracy (docs/precision.md).
//
// The LLTM has no forget gate: its cell state sums every step's update, and
// the forward's rounding errors stay in it for the rest of the sequence.
// TF32's 10-bit mantissa in the gate pre-activations (x W_ih^T and
// h_{t-1} W_hh^T) moves the forward trajectory far enough that at T = 1000
// every gradient is lost (relative error ~1). TF32 in the backward alone
// costs little at T = 1000 (where strict fp32 itself keeps only ~3 digits)
// but ~5e-4 of every gradient at T = 100 to 200, 40x strict fp32's: within
// 2x of strict fp32 at every T needs fp32-class products everywhere. So:
//
//   kIeee      every product strict fp32
//   kTf32      every product on TF32 tensor cores
//   kAccurate  the forward strict fp32 (its products set the trajectory
//              every gradient depends on: as 3xTF32, x W_ih^T or the step
//              products put the output's error at T = 1000 at 2.4x strict
//              fp32's, docs/precision.md); on the fused CUDA backend the
//              backward's recurrent products (dz W_hh) on the persistent
//              kernels' 3xTF32 MMA dot where the planner finds it faster
//              than their FMA dot (each operand split into a TF32 part and
//              a TF32 remainder, three TF32 products from a zero
//              accumulator a k step: tensor cores at about fp32's
//              accuracy), else strict; the backward's GEMMs over all T*B
//              rows (dz W_ih, dz^T x, dz^T h) strict (cuBLAS's 3xTF32,
//              LLTM_SPLIT_TF32_MACS, loses accuracy with their length);
//              strict fp32 where ATen runs them.
//
// The mode is lltm's own setting (lltm.set_fp32_precision, the operator
// lltm::_set_fp32_precision), or, where none is set, PyTorch's: TF32 where
// torch allows it for cuBLAS matmuls (torch.backends.cuda.matmul.allow_tf32,
// fp32_precision = "tf32", set_float32_matmul_precision("high" / "medium")),
// else strict. It is read at every call, inside the operators, so a compiled
// graph follows it too; the CUDA graphs and plans the fused backend caches
// carry the resolved per-pass choice in their keys.
//
// Header only: libraries compiled apart (a user cell's) read the one setting
// of lltm._C through the dispatcher.
#pragma once

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/mm.h>

#include <cstdint>
#include <optional>

namespace lltm {

enum class Fp32Mode : int64_t { kIeee = 0, kTf32 = 1, kAccurate = 2 };

// lltm::_set_fp32_precision: "" follows PyTorch; "ieee", "tf32" and
// "accurate" set the mode (anything else raises a ValueError).
void set_fp32_precision(c10::string_view mode);
// lltm::_fp32_precision_setting: the Fp32Mode set, or -1 (follow PyTorch).
int64_t fp32_precision_setting();

// The setting as any library sees it (through the dispatcher).
inline int64_t fp32_setting() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("lltm::_fp32_precision_setting", "").typed<int64_t()>();
  return op.call();
}

// The mode in force now.
inline Fp32Mode fp32_mode() {
  const int64_t setting = fp32_setting();
  if (setting >= 0) return static_cast<Fp32Mode>(setting);
  return at::globalContext().allowTF32CuBLAS() ? Fp32Mode::kTf32 : Fp32Mode::kIeee;
}

// Whether float32 products of the forward (backward = false) or the backward
// pass may run on plain TF32 tensor cores now (the same for both passes in
// every mode so far; a pass's caches key on it).
inline bool tf32_products(bool backward) {
  (void)backward;
  return fp32_mode() == Fp32Mode::kTf32;
}

// Whether the persistent kernels' MMA dot may run a pass's float32 step
// products as 3xTF32 (persistent_dots.cuh's Tf32x3): the backward's in the
// accurate mode. Not the forward's: a dot's error is the FMA dot's or less,
// but the tensor cores truncate their internal sums, an error of one sign
// that the LLTM's cell state (no forget gate) adds up over T: 3xTF32 step
// products in the forward put the output's error at T = 1000 at 2.4x
// strict fp32's (docs/precision.md).
inline bool split_tf32_steps(bool backward) { return backward && fp32_mode() == Fp32Mode::kAccurate; }

// Whether the fused CUDA backend may run the float32 GEMMs over all T*B
// rows of the backward (backward = true) or the forward pass as 3xTF32 now
// (from LLTM_SPLIT_TF32_MACS on, rnn_cuda.cuh; strict without it): the
// backward's in the accurate mode, the forward's never.
inline bool split_tf32_rows(bool backward) { return backward && fp32_mode() == Fp32Mode::kAccurate; }

// For code whose products are ATen's (at::mm follows torch's TF32 switch):
// turns TF32 off on this thread for its scope where lltm's mode wants the
// pass strict. It can only take TF32 away: where torch does not allow TF32,
// ATen's products stay strict whatever lltm's mode. Products with a 1-D bias
// go through addmm_rows below: the guard does not reach at::addmm's.
class Fp32PassGuard {
 public:
  explicit Fp32PassGuard(bool backward) {
    if (!tf32_products(backward)) guard_.emplace();
  }

 private:
  std::optional<at::NoTF32Guard> guard_;
};

// Whether an at::addmm(bias, a, b) with a 1-D bias would run TF32 that a
// Fp32PassGuard in force means to take away: on CUDA that addmm is
// cuBLASLt's GEMM with a bias epilogue, whose float32 math follows torch's
// switch alone (torch's cuBLASLt path does not read at::NoTF32Guard; the
// plain cuBLAS GEMM of at::mm does).
inline bool guard_misses_bias_epilogue(const at::Tensor& a) {
  return a.is_cuda() && a.scalar_type() == at::kFloat && at::NoTF32Guard::should_disable_tf32() &&
         at::globalContext().allowTF32CuBLAS();
}

// bias + a b, bias (N,) broadcast over the M rows of a (M, K) b (K, N): as
// at::addmm, but with the bias added after a plain GEMM where the epilogue
// would keep TF32 a Fp32PassGuard takes away.
inline at::Tensor addmm_rows(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b) {
  if (!guard_misses_bias_epilogue(a)) return at::addmm(bias, a, b);
  return at::mm(a, b).add_(bias);
}

// addmm_rows into out (M, N).
inline void addmm_rows_out(at::Tensor& out, const at::Tensor& bias, const at::Tensor& a,
                           const at::Tensor& b) {
  if (!guard_misses_bias_epilogue(a)) {
    at::addmm_out(out, bias, a, b);
    return;
  }
  at::mm_out(out, a, b);
  out.add_(bias);
}

}  // namespace lltm
