// Row-major GEMMs on cuBLAS for the fused CUDA backend.
//
// Every operand is a row-major matrix given by a pointer and a leading
// dimension (row stride), so column blocks of a matrix (W[:, :S], the left
// half of grad_weights) are used in place. Kept apart from the kernels so
// that only this file needs the cuBLAS headers.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace lltm {
namespace cuda_detail {

// C (m x n) = op(A) (m x k) * op(B) (k x n) + (accumulate ? C : 0).
// trans_a: A is stored as (k x m), else (m x k); trans_b: B is stored as
// (n x k), else (k x n). All row-major with the given leading dimensions.
struct Gemm {
  bool trans_a, trans_b;
  int64_t m, n, k;
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  bool accumulate;
  void* c;
  int64_t ldc;
};

// Runs the GEMMs in order on the current stream of the current device with
// PyTorch's cuBLAS handle (and its workspace). float32 runs on TF32 tensor
// cores where `tf32` is set, else strict fp32 (the caller's choice:
// precision.h's tf32_products for its pass); the handle's math mode is put
// back afterwards. GEMMs with m, n or k = 0 are skipped; with k = 0 and
// accumulate unset, C must be cleared by the caller.
void run_gemms(c10::ScalarType dtype, const Gemm* gemms, int count, bool tf32);

// One GEMM (no accumulation) with its k range in `splits` equal parts
// (k % splits == 0), each part's product written apart in the accumulation
// type (float; double for float64): C + s m ldc (s < splits) = op(A)[:,
// part s] op(B)[part s, :], one strided-batched call. A split-K GEMM whose
// sum the caller's next kernel adds: cuBLAS's own split-K ends every call
// with a reduction kernel of its own.
void run_gemm_split_k(c10::ScalarType dtype, const Gemm& g, int splits, bool tf32);

// C (cols x rows, ldc) = A^T for a row-major A (rows x cols, lda), float32
// or float64 (cuBLAS's geam; C must not overlap A). For the TF32 GEMMs that
// read their operands K-major (rnn_cuda.cuh).
void transpose(c10::ScalarType dtype, int64_t rows, int64_t cols, const void* a, int64_t lda, void* c,
               int64_t ldc);

// float32 GEMMs as 3xTF32: each operand X split into big = tf32(X) and
// small = tf32(X - big) (together 22 of float32's 24 significant bits), and
// C = A_big B_small + A_small B_big + A_big B_big (+ C) as three TF32 GEMMs
// with float32 sums, small products first: tensor cores at about float32's
// accuracy (the dropped A_small B_small is ~2^-22 of a product). The split
// operands are allocated here, in one allocation by one launch (an operand
// used by several of the GEMMs, or a row block of one, is split once): not
// for the launches of a graph lltm captures itself.
void run_gemms_split_tf32(const Gemm* gemms, int count);

// While one is alive on this thread, run_gemms uses a cuBLAS handle of
// lltm's own (one per thread and device, made by the constructor, so never
// inside a capture), with a workspace of lltm's
// own per device, instead of PyTorch's handle. For the GEMMs of graphs that
// lltm replays itself (seq_graph.h): PyTorch's workspaces belong to a
// stream, and a graph replayed on another stream must not share one with
// work that may run beside it. lltm's workspace is shared by every such
// GEMM of a device: the caller orders its uses (seq_graph.cpp).
class OwnBlasHandle {
 public:
  OwnBlasHandle();
  ~OwnBlasHandle();
  OwnBlasHandle(const OwnBlasHandle&) = delete;
  OwnBlasHandle& operator=(const OwnBlasHandle&) = delete;
};

}  // namespace cuda_detail
}  // namespace lltm
