// Kernels of the small-size path: at the tutorial's sizes a step is a few
// MFLOP and costs far less than a kernel launch, so forward is ONE kernel
// (GEMM over [old_h | input] read through two pointers, with the cell's
// pointwise math as its epilogue) and backward is the pointwise gradient
// kernel plus ONE kernel for both GEMMs (dX = d_pre W and dW = d_pre^T X).
//
// The GEMM engine is a plain shared-memory tiled SIMT loop with a register
// prefetch of the next tile; operands come through loader functors, so they
// can be strided, split over two tensors or transposed without a copy.
#pragma once

#include "cell_math.cuh"

namespace lltm {
namespace cuda_detail {

// A group of kThreads threads computes a BM x BN tile of C = A (M x R) * B
// (R x N) in steps of BK along R; each thread holds TM x TN accumulators, at
// rows ty + i * TY and columns tx + q * TX of the tile (strided, so that
// shared-memory reads are conflict-free and global stores coalesce). A block
// holds KS such groups that split the R steps among them (intra-block
// split-K: KS times the warps to hide latency on the short grids of small
// steps) and add their partial sums at the end.
template <int BM_, int BN_, int BK_, int TM_, int TN_>
struct Tile {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, TM = TM_, TN = TN_;
  static constexpr int TX = BN / TN, TY = BM / TM;
  static constexpr int kThreads = TX * TY;
  // One padding column: transposed shared-memory stores stay conflict-free.
  static constexpr int kLdA = BM + 1, kLdB = BN + 1;
  static constexpr int kSmemA = BK * kLdA, kSmemB = BK * kLdB;
  static constexpr int kPerThreadA = BM * BK / kThreads;
  static constexpr int kPerThreadB = BN * BK / kThreads;
  static_assert(BM % TM == 0 && BN % TN == 0, "tile must split evenly");
  static_assert(BM * BK % kThreads == 0 && BN * BK % kThreads == 0,
                "tile loads must split evenly over the threads");
  // Shared memory (in acc_t elements) of a block of KS groups: their tiles,
  // reused at the end for the partial sums of groups 1..KS-1.
  template <int KS>
  static constexpr int smem_elems() {
    const int tiles = KS * (kSmemA + kSmemB);
    const int sums = (KS - 1) * TM * TN * kThreads;
    return tiles > sums ? tiles : sums;
  }
};

// Split-K factor of the small-path kernels: 4 groups for float
// accumulators, 2 for double (shared memory and registers).
template <typename acc_t>
struct SplitK {
  static constexpr int value = sizeof(acc_t) == 8 ? 2 : 4;
};

// acc[i][q] = sum over r < R of A(ty + i TY, r) * B(r, tx + q TX) in tile
// coordinates, complete in group 0 on return (the other groups' acc are
// partial and must be dropped). load_a(m, r) / load_b(r, n) return the
// operand in acc_t, or 0 out of range (r >= R included). kAAlongR: A is
// contiguous along r (else along m); kBAlongN: B is contiguous along n (else
// along r); consecutive threads then load consecutive addresses.
template <typename T, int KS, bool kAAlongR, bool kBAlongN, typename acc_t, typename LoadA, typename LoadB>
__device__ __forceinline__ void tile_gemm(acc_t (&acc)[T::TM][T::TN], int64_t R, const LoadA& load_a,
                                          const LoadB& load_b, acc_t* __restrict__ smem) {
  const int group = threadIdx.x / T::kThreads;
  const int tid = threadIdx.x % T::kThreads;
  const int tx = tid % T::TX;
  const int ty = tid / T::TX;
  acc_t* __restrict__ smem_a = smem + group * (T::kSmemA + T::kSmemB);
  acc_t* __restrict__ smem_b = smem_a + T::kSmemA;
#pragma unroll
  for (int i = 0; i < T::TM; ++i) {
#pragma unroll
    for (int q = 0; q < T::TN; ++q) acc[i][q] = acc_t(0);
  }
  // Every group runs the same number of rounds (barriers stay uniform); a
  // step past R loads zeros.
  const int64_t rounds = (R + int64_t(T::BK) * KS - 1) / (int64_t(T::BK) * KS);

  // Element e of a tile: (m, r) or (r, n) with the contiguous index fastest.
  auto a_coord = [](int e, int& m, int& r) {
    if (kAAlongR) {
      m = e / T::BK;
      r = e % T::BK;
    } else {
      r = e / T::BM;
      m = e % T::BM;
    }
  };
  auto b_coord = [](int e, int& r, int& n) {
    if (kBAlongN) {
      r = e / T::BN;
      n = e % T::BN;
    } else {
      n = e / T::BK;
      r = e % T::BK;
    }
  };
  acc_t reg_a[T::kPerThreadA], reg_b[T::kPerThreadB];
  auto fetch = [&](int64_t round) {
    const int64_t r0 = (round * KS + group) * T::BK;
#pragma unroll
    for (int k = 0; k < T::kPerThreadA; ++k) {
      int m, r;
      a_coord(tid + k * T::kThreads, m, r);
      reg_a[k] = load_a(m, r0 + r);
    }
#pragma unroll
    for (int k = 0; k < T::kPerThreadB; ++k) {
      int r, n;
      b_coord(tid + k * T::kThreads, r, n);
      reg_b[k] = load_b(r0 + r, n);
    }
  };
  auto stash = [&]() {
#pragma unroll
    for (int k = 0; k < T::kPerThreadA; ++k) {
      int m, r;
      a_coord(tid + k * T::kThreads, m, r);
      smem_a[r * T::kLdA + m] = reg_a[k];
    }
#pragma unroll
    for (int k = 0; k < T::kPerThreadB; ++k) {
      int r, n;
      b_coord(tid + k * T::kThreads, r, n);
      smem_b[r * T::kLdB + n] = reg_b[k];
    }
  };

  if (rounds > 0) {
    fetch(0);
    stash();
    __syncthreads();
  }
  for (int64_t s = 0; s < rounds; ++s) {
    const bool more = s + 1 < rounds;
    if (more) fetch(s + 1);  // in flight during the math below
#pragma unroll
    for (int r = 0; r < T::BK; ++r) {
      acc_t a[T::TM], b[T::TN];
#pragma unroll
      for (int i = 0; i < T::TM; ++i) a[i] = smem_a[r * T::kLdA + ty + i * T::TY];
#pragma unroll
      for (int q = 0; q < T::TN; ++q) b[q] = smem_b[r * T::kLdB + tx + q * T::TX];
#pragma unroll
      for (int i = 0; i < T::TM; ++i) {
#pragma unroll
        for (int q = 0; q < T::TN; ++q) acc[i][q] += a[i] * b[q];
      }
    }
    __syncthreads();
    if (more) {
      stash();
      __syncthreads();
    }
  }
  if (KS > 1) {
    // Groups 1..KS-1 hand their partial sums to group 0 (fixed order:
    // deterministic). The tiles are dead: the loop ended on a barrier.
    constexpr int kAcc = T::TM * T::TN;
    if (group > 0) {
#pragma unroll
      for (int i = 0; i < T::TM; ++i) {
#pragma unroll
        for (int q = 0; q < T::TN; ++q) {
          smem[((group - 1) * kAcc + i * T::TN + q) * T::kThreads + tid] = acc[i][q];
        }
      }
    }
    __syncthreads();
    if (group == 0) {
      for (int g = 1; g < KS; ++g) {
#pragma unroll
        for (int i = 0; i < T::TM; ++i) {
#pragma unroll
          for (int q = 0; q < T::TN; ++q) {
            acc[i][q] += smem[((g - 1) * kAcc + i * T::TN + q) * T::kThreads + tid];
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------- forward --

// Tile of the fused forward: 16 batch rows x 16 state columns, whose 48 GEMM
// columns are the three gates of those state columns (tile column
// n = gate * 16 + j), so each thread ends up holding all three gates of its
// (row, state column) pairs and runs the cell math in registers.
constexpr int kFwdStateCols = 16;
using ForwardTile = Tile<16, 3 * kFwdStateCols, 16, 2, 3>;
static_assert(ForwardTile::TX == kFwdStateCols, "one state column per tx");

template <typename scalar_t>
constexpr int small_kernel_threads() {
  return ForwardTile::kThreads * SplitK<at::opmath_type<scalar_t>>::value;
}

template <typename scalar_t>
__global__ void __launch_bounds__(small_kernel_threads<scalar_t>())
    cell_forward_small_kernel(const scalar_t* __restrict__ old_h, int64_t ld_h,    // (B, S)
                              const scalar_t* __restrict__ input, int64_t ld_x,    // (B, I)
                              const scalar_t* __restrict__ weights, int64_t ld_w,  // (3S, S + I)
                              const scalar_t* __restrict__ bias,                   // (3S,) or null
                              const scalar_t* __restrict__ old_cell,  // (B, S) at b * c_rs + j * c_cs
                              int64_t c_rs, int64_t c_cs,
                              scalar_t* __restrict__ new_h,     // (B, S) contiguous
                              scalar_t* __restrict__ new_cell,  // (B, S) contiguous
                              scalar_t* __restrict__ gates,     // (B, 3S) contiguous
                              int64_t batch, int64_t state, int64_t features,
                              int64_t state_tiles) {  // ceil(S / kFwdStateCols)
  using T = ForwardTile;
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int KS = SplitK<acc_t>::value;
  __shared__ acc_t smem[T::template smem_elems<KS>()];

  const int64_t row0 = (blockIdx.x / state_tiles) * T::BM;
  const int64_t col0 = (blockIdx.x % state_tiles) * kFwdStateCols;
  const int64_t K = state + features;

  // A = X = [old_h | input], read through two pointers (no concatenation).
  auto load_x = [&](int m, int64_t k) -> acc_t {
    const int64_t b = row0 + m;
    if (b >= batch || k >= K) return acc_t(0);
    return k < state ? static_cast<acc_t>(old_h[b * ld_h + k])
                     : static_cast<acc_t>(input[b * ld_x + (k - state)]);
  };
  // B = W^T restricted to the rows of the tile's three gates.
  auto load_w = [&](int64_t k, int n) -> acc_t {
    const int gate = n / kFwdStateCols;
    const int64_t j = col0 + n % kFwdStateCols;
    if (j >= state || k >= K) return acc_t(0);
    return static_cast<acc_t>(weights[(gate * state + j) * ld_w + k]);
  };
  acc_t acc[T::TM][T::TN];
  tile_gemm<T, KS, /*kAAlongR=*/true, /*kBAlongN=*/false>(acc, K, load_x, load_w, smem);
  if (threadIdx.x >= T::kThreads) return;  // group 0 holds the sums

  const int tx = threadIdx.x % T::TX;
  const int ty = threadIdx.x / T::TX;
  const int64_t j = col0 + tx;
  if (j >= state) return;
  acc_t b_i = acc_t(0), b_o = acc_t(0), b_c = acc_t(0);
  if (bias != nullptr) {
    b_i = static_cast<acc_t>(bias[j]);
    b_o = static_cast<acc_t>(bias[state + j]);
    b_c = static_cast<acc_t>(bias[2 * state + j]);
  }
#pragma unroll
  for (int i = 0; i < T::TM; ++i) {
    const int64_t b = row0 + ty + i * T::TY;
    if (b >= batch) continue;
    // accumulator column q = gate (tile column gate * 16 + tx)
    const CellForward<acc_t> cell(acc[i][0] + b_i, acc[i][1] + b_o, acc[i][2] + b_c,
                                  static_cast<acc_t>(old_cell[b * c_rs + j * c_cs]));
    scalar_t* g = gates + b * 3 * state + j;
    g[0] = static_cast<scalar_t>(cell.input_gate);
    g[state] = static_cast<scalar_t>(cell.output_gate);
    g[2 * state] = static_cast<scalar_t>(cell.candidate);
    new_cell[b * state + j] = static_cast<scalar_t>(cell.new_cell);
    new_h[b * state + j] = static_cast<scalar_t>(cell.new_h);
  }
}

// --------------------------------------------------------------- backward --

// dX = d_pre W: (B x K), reduction over the 3S gate columns.
using BackwardXTile = Tile<16, 32, 16, 2, 2>;
// dW = d_pre^T X: (3S x K), reduction over the batch.
using BackwardWTile = Tile<32, 32, 16, 2, 4>;
static_assert(BackwardXTile::kThreads == BackwardWTile::kThreads &&
                  BackwardXTile::kThreads == ForwardTile::kThreads,
              "both roles run in one launch, like the forward kernel");

// Both GEMMs of backward in one launch: blocks [0, x_tiles) compute tiles of
// dX (the longer reductions, scheduled first), the rest tiles of dW. dX
// columns [x_col_begin, x_col_end) are computed: [0, S) is grad_old_h,
// [S, S + I) grad_input, so a gradient nobody asked for is skipped.
template <typename scalar_t>
__global__ void __launch_bounds__(small_kernel_threads<scalar_t>())
    cell_backward_small_kernel(const scalar_t* __restrict__ d_pre,                  // (B, 3S) contiguous
                               const scalar_t* __restrict__ weights, int64_t ld_w,  // (3S, S + I)
                               const scalar_t* __restrict__ old_h, int64_t ld_h,    // (B, S)
                               const scalar_t* __restrict__ input, int64_t ld_x,    // (B, I)
                               scalar_t* __restrict__ grad_old_h,                   // (B, S) contiguous
                               scalar_t* __restrict__ grad_input,                   // (B, I) contiguous
                               scalar_t* __restrict__ grad_weights,                 // (3S, S + I) contiguous
                               int64_t batch, int64_t state, int64_t features, int64_t x_col_begin,
                               int64_t x_col_end, int64_t x_tiles,
                               int64_t x_col_tiles,    // dX: tiles, tiles per row
                               int64_t w_col_tiles) {  // dW: tiles per row
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int KS = SplitK<acc_t>::value;
  constexpr int kSmemX = BackwardXTile::template smem_elems<KS>();
  constexpr int kSmemW = BackwardWTile::template smem_elems<KS>();
  __shared__ acc_t smem[kSmemX > kSmemW ? kSmemX : kSmemW];
  const int64_t S3 = 3 * state;
  const int64_t K = state + features;

  if (static_cast<int64_t>(blockIdx.x) < x_tiles) {
    using T = BackwardXTile;
    const int64_t tile = blockIdx.x;
    const int64_t row0 = (tile / x_col_tiles) * T::BM;
    const int64_t col0 = x_col_begin + (tile % x_col_tiles) * T::BN;
    auto load_dp = [&](int m, int64_t r) -> acc_t {
      const int64_t b = row0 + m;
      return (b < batch && r < S3) ? static_cast<acc_t>(d_pre[b * S3 + r]) : acc_t(0);
    };
    auto load_w = [&](int64_t r, int n) -> acc_t {
      const int64_t k = col0 + n;
      return (r < S3 && k < x_col_end) ? static_cast<acc_t>(weights[r * ld_w + k]) : acc_t(0);
    };
    acc_t acc[T::TM][T::TN];
    tile_gemm<T, KS, /*kAAlongR=*/true, /*kBAlongN=*/true>(acc, S3, load_dp, load_w, smem);
    if (threadIdx.x >= T::kThreads) return;  // group 0 holds the sums
    const int tx = threadIdx.x % T::TX;
    const int ty = threadIdx.x / T::TX;
#pragma unroll
    for (int i = 0; i < T::TM; ++i) {
      const int64_t b = row0 + ty + i * T::TY;
      if (b >= batch) continue;
#pragma unroll
      for (int q = 0; q < T::TN; ++q) {
        const int64_t k = col0 + tx + q * T::TX;
        if (k >= x_col_end) continue;
        const scalar_t v = static_cast<scalar_t>(acc[i][q]);
        if (k < state) {
          grad_old_h[b * state + k] = v;
        } else {
          grad_input[b * features + (k - state)] = v;
        }
      }
    }
  } else {
    using T = BackwardWTile;
    const int64_t tile = static_cast<int64_t>(blockIdx.x) - x_tiles;
    const int64_t row0 = (tile / w_col_tiles) * T::BM;  // gate column of d_pre
    const int64_t col0 = (tile % w_col_tiles) * T::BN;  // column of X
    auto load_dpt = [&](int m, int64_t b) -> acc_t {    // d_pre^T (3S x B)
      const int64_t r = row0 + m;
      return (r < S3 && b < batch) ? static_cast<acc_t>(d_pre[b * S3 + r]) : acc_t(0);
    };
    auto load_x = [&](int64_t b, int n) -> acc_t {  // X = [old_h | input]
      const int64_t k = col0 + n;
      if (b >= batch || k >= K) return acc_t(0);
      return k < state ? static_cast<acc_t>(old_h[b * ld_h + k])
                       : static_cast<acc_t>(input[b * ld_x + (k - state)]);
    };
    acc_t acc[T::TM][T::TN];
    tile_gemm<T, KS, /*kAAlongR=*/false, /*kBAlongN=*/true>(acc, batch, load_dpt, load_x, smem);
    if (threadIdx.x >= T::kThreads) return;  // group 0 holds the sums
    const int tx = threadIdx.x % T::TX;
    const int ty = threadIdx.x / T::TX;
#pragma unroll
    for (int i = 0; i < T::TM; ++i) {
      const int64_t r = row0 + ty + i * T::TY;
      if (r >= S3) continue;
#pragma unroll
      for (int q = 0; q < T::TN; ++q) {
        const int64_t k = col0 + tx + q * T::TX;
        if (k < K) grad_weights[r * K + k] = static_cast<scalar_t>(acc[i][q]);
      }
    }
  }
}

}  // namespace cuda_detail
}  // namespace lltm
