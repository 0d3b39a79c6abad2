// Persistent recurrent kernels of the fused CUDA sequence operators.
//
// One launch runs the whole time loop. The grid is made of thread-block
// clusters (sm_90): a cluster of C CTAs owns a chunk of batch rows, and CTA r
// of the cluster owns the state units [r J, (r + 1) J). Batch chunks are
// independent, so clusters never wait on each other; inside a cluster:
//
//   forward, step t: each CTA computes the three gate rows of its units for
//   its batch rows from W_h's rows (resident in its shared memory for all T
//   steps) and h_{t-1} (a full copy in its shared memory), finishes the cell
//   math of its units itself (c stays in registers in float), writes
//   output and gates, and pushes its slice of h_t into every CTA's
//   copy through distributed shared memory; one cluster barrier per step,
//   during which the next step's input projection is loaded.
//
//   backward, step t (reverse time): each CTA turns the carried dh, dc of its
//   units into d_pre_t (the gradient of the gate pre-activations), pushes
//   its slice of d_pre_t into every CTA, waits at the cluster barrier, and
//   computes d h_{t-1} for its units from W_h's columns (resident, as W_h^T
//   rows) and all of d_pre_t; dh and dc stay in registers in float, and the
//   next step's saved gates and cells are loaded during the barrier.
//
// h_t and d_pre_t go through the exchange in the tensor dtype (what the
// per-step cuBLAS path reads too); every product accumulates in float
// (double for double) with plain FMA: float32 is strict fp32, never TF32.
// Exchange buffers are double-buffered by step parity, so one barrier per
// step suffices: a CTA writes buffer p of another CTA only after the
// barrier that CTA passes after its last read of buffer p.
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>
#include <cooperative_groups.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include "cell_math.cuh"
#include "seq_persistent.h"

namespace lltm {
namespace cuda_detail {

namespace cg = cooperative_groups;

namespace {

constexpr int kMaxThreads = 256;

// The work split of one launch (same fields for forward and backward).
struct Plan {
  int cluster;     // CTAs per cluster
  int units;       // J: state units per CTA (the last CTA may own fewer)
  int rows;        // batch rows per cluster (the last cluster may own fewer)
  int rows_padded; // rows rounded up to a multiple of the rows per thread
  int clusters;
  int per_thread;  // NB: batch rows one thread group accumulates
  int ks;          // lanes that split one dot product's k range (1..32)
  int threads;
  int row;         // padded length (elements) of a shared-memory row of S
  size_t smem;
};

template <typename scalar_t>
struct ForwardParams {
  scalar_t* gates;                // (T, B, 3S): x W_x^T in, activated gates out
  const scalar_t* w;              // (3S, w_ld): W_h = columns [0, S)
  int64_t w_ld;
  const scalar_t* bias;           // (3S,) or null
  const scalar_t* h0;             // (B, S) at b * h0_ld + j
  int64_t h0_ld;
  const scalar_t* c0;             // (B, S) at b * c0_ld + j
  int64_t c0_ld;
  const int64_t* lengths;         // (B,) or null
  scalar_t* output;               // (T, B, S)
  scalar_t* h_n;                  // (B, S)
  scalar_t* c_n;                  // (B, S)
  int64_t steps, batch;
  int state, units, rows, rows_padded, ks, row;
};

template <typename scalar_t>
struct BackwardParams {
  const scalar_t* grad_output;    // (T, B, S) or null
  const scalar_t* grad_h_n;       // (B, S) or null
  const scalar_t* grad_c_n;       // (B, S) or null
  const scalar_t* w;              // (3S, w_ld): W_h = columns [0, S)
  int64_t w_ld;
  const scalar_t* cells;          // (T, B, S)
  const scalar_t* gates;          // (T, B, 3S) activated
  const int64_t* lengths;         // (B,) or null
  scalar_t* d_pre;                // (T, B, 3S)
  scalar_t* grad_h0;              // (B, S) or null
  scalar_t* grad_c0;              // (B, S) or null
  int64_t steps, batch;
  int state, units, rows, rows_padded, ks, row;
};

// Where this CTA sits: its units [j0, j0 + jn) and batch rows [b0, b0 + bn).
struct Slice {
  int rank, ctas, j0, jn, bn;
  int64_t b0;
};

__device__ __forceinline__ Slice my_slice(const cg::cluster_group& cluster,
                                          int units, int rows, int state,
                                          int64_t batch) {
  Slice s;
  s.rank = static_cast<int>(cluster.block_rank());
  s.ctas = static_cast<int>(cluster.num_blocks());
  s.j0 = s.rank * units;
  s.jn = max(0, min(units, state - s.j0));
  s.b0 = static_cast<int64_t>(blockIdx.x / s.ctas) * rows;
  s.bn = static_cast<int>(::min(static_cast<int64_t>(rows), batch - s.b0));
  return s;
}

// The lanes of the KS-lane group this lane belongs to (KS divides 32).
__device__ __forceinline__ unsigned group_mask(int ks) {
  if (ks == 32) return 0xffffffffu;
  const int lane = threadIdx.x & 31;
  return ((1u << ks) - 1u) << (lane & ~(ks - 1));
}

template <int N, typename acc_t>
__device__ __forceinline__ void group_sum(acc_t (&v)[N], int ks, unsigned mask) {
  for (int offset = ks >> 1; offset > 0; offset >>= 1) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(mask, v[i], offset);
  }
}

// The two halves of the cluster barrier. arrive.release orders this
// thread's earlier stores (to any CTA's shared memory) before the other CTAs'
// wait.acquire returns; work between the two overlaps the barrier.
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}

// Thread layout shared by both kernels: thread group q (KS lanes) owns unit
// j0 + q % jn and the NB batch rows r0 .. r0 + NB - 1 of this CTA, for the
// whole sequence. Its lanes split the k range of the dot products and then
// all hold the same sums (a butterfly of commutative adds), so every lane
// runs the cell math of its group's NB rows and keeps the same carried
// state in registers; lane ks stores row n to global memory when
// n % KS == ks, and pushes the new values to the CTAs ks, ks + KS, ...
struct Group {
  int ks, KS, jj, j, r0;
  unsigned mask;
  bool working;
};

template <int NB>
__device__ __forceinline__ Group my_group(const Slice& s, int KS, int rows_padded) {
  Group g;
  g.KS = KS;
  g.ks = threadIdx.x % KS;
  g.mask = group_mask(KS);
  const int q = threadIdx.x / KS;
  g.working = q < s.jn * (rows_padded / NB);
  g.jj = g.working ? q % s.jn : 0;
  g.j = s.j0 + g.jj;
  g.r0 = g.working ? (q / s.jn) * NB : 0;
  return g;
}

template <typename scalar_t, int NB>
__global__ void __launch_bounds__(kMaxThreads)
    seq_forward_persistent_kernel(const ForwardParams<scalar_t> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int V = 16 / sizeof(scalar_t);  // elements per 16-byte chunk
  const cg::cluster_group cluster = cg::this_cluster();
  const Slice s = my_slice(cluster, p.units, p.rows, p.state, p.batch);
  const int J = p.units, S = p.state, row = p.row, Bp = p.rows_padded;
  const int64_t S3 = 3 * int64_t(S);

  extern __shared__ __align__(16) unsigned char smem[];
  scalar_t* w_s = reinterpret_cast<scalar_t*>(smem);  // [3][J][row]
  scalar_t* h_s = w_s + 3 * J * row;                  // [2][Bp][row]

  // W_h's rows of this CTA's units and h0 of its batch rows; zero padding
  // past S and past the last row, so the dot products need no bounds.
  for (int e = threadIdx.x; e < 3 * J * row; e += blockDim.x) {
    const int k = e % row, r = e / row;
    const int g = r / J, jj = r - g * J;
    w_s[e] = (jj < s.jn && k < S)
                 ? p.w[(int64_t(g) * S + s.j0 + jj) * p.w_ld + k]
                 : scalar_t(0);
  }
  for (int e = threadIdx.x; e < 2 * Bp * row; e += blockDim.x) {
    const int k = e % row, r = e / row;
    h_s[e] = (r < s.bn && k < S) ? p.h0[(s.b0 + r) * p.h0_ld + k] : scalar_t(0);
  }

  const Group grp = my_group<NB>(s, p.ks, Bp);
  const int j = grp.j;
  const int chunks = (S + V - 1) / V;
  // Per row of the group: in range, its length, its carried c.
  bool valid[NB];
  int64_t length[NB];
  acc_t c[NB];
#pragma unroll
  for (int n = 0; n < NB; ++n) {
    valid[n] = grp.working && grp.r0 + n < s.bn;
    const int64_t b = s.b0 + grp.r0 + n;
    length[n] = !valid[n] ? 0 : (p.lengths == nullptr ? p.steps : p.lengths[b]);
    c[n] = valid[n] ? static_cast<acc_t>(p.c0[b * p.c0_ld + j]) : acc_t(0);
  }
  acc_t bias[3];
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    bias[i] = (grp.working && p.bias != nullptr) ? static_cast<acc_t>(p.bias[i * S + j]) : acc_t(0);
  }
  // The pre-activations x_t W_x^T of step t, loaded one step ahead.
  acc_t z[3][NB];
  auto load_z = [&](int64_t t) {
#pragma unroll
    for (int n = 0; n < NB; ++n) {
      const bool live = valid[n] && t < length[n];
      const scalar_t* g = p.gates + (t * p.batch + s.b0 + grp.r0 + n) * S3 + j;
#pragma unroll
      for (int i = 0; i < 3; ++i) z[i][n] = live ? static_cast<acc_t>(g[i * S]) : acc_t(0);
    }
  };
  load_z(0);
  scalar_t h_out[NB], y_out[NB], gate_out[3][NB];  // step t's results
  // Every CTA of the cluster runs (and has its buffers set) before any CTA
  // writes into another's shared memory.
  cluster.sync();

  for (int64_t t = 0; t < p.steps; ++t) {
    const scalar_t* h_cur = h_s + (t & 1) * Bp * row;
    scalar_t* h_nxt = h_s + ((t + 1) & 1) * Bp * row;
    const bool last = t + 1 == p.steps;
    if (grp.working) {
      acc_t acc[3 * NB];
#pragma unroll
      for (int i = 0; i < 3 * NB; ++i) acc[i] = acc_t(0);
      const scalar_t* w0 = w_s + grp.jj * row;
      const scalar_t* hb = h_cur + grp.r0 * row;
      for (int k = grp.ks; k < chunks; k += grp.KS) {
        acc_t wv[3][V];
#pragma unroll
        for (int i = 0; i < 3; ++i) load_pack<acc_t, scalar_t, V>(w0 + i * J * row + k * V, wv[i]);
#pragma unroll
        for (int n = 0; n < NB; ++n) {
          acc_t hv[V];
          load_pack<acc_t, scalar_t, V>(hb + n * row + k * V, hv);
#pragma unroll
          for (int v = 0; v < V; ++v) {
#pragma unroll
            for (int i = 0; i < 3; ++i) acc[i * NB + n] += wv[i][v] * hv[v];
          }
        }
      }
      group_sum(acc, grp.KS, grp.mask);
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        if (!valid[n]) continue;
        const int r = grp.r0 + n;
        if (t < length[n]) {
          const CellForward<acc_t> cell(z[0][n] + bias[0] + acc[n],
                                        z[1][n] + bias[1] + acc[NB + n],
                                        z[2][n] + bias[2] + acc[2 * NB + n], c[n]);
          c[n] = cell.new_cell;
          h_out[n] = static_cast<scalar_t>(cell.new_h);
          y_out[n] = h_out[n];
          gate_out[0][n] = static_cast<scalar_t>(cell.input_gate);
          gate_out[1][n] = static_cast<scalar_t>(cell.output_gate);
          gate_out[2][n] = static_cast<scalar_t>(cell.candidate);
        } else {  // past this row's length: zero gates and output, keep h, c
          h_out[n] = h_cur[r * row + j];
          y_out[n] = gate_out[0][n] = gate_out[1][n] = gate_out[2][n] = scalar_t(0);
        }
        if (!last) {
          for (int d = grp.ks; d < s.ctas; d += grp.KS) {
            cluster.map_shared_rank(h_nxt, d)[r * row + j] = h_out[n];
          }
        }
      }
    }
    // The release half of the barrier waits for this thread's earlier
    // stores: only the DSMEM pushes come before it; the global stores
    // (read by no CTA of this launch) follow it.
    if (!last) cluster_arrive();
    if (grp.working) {
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        if (!valid[n] || n % grp.KS != grp.ks) continue;
        const int64_t b = s.b0 + grp.r0 + n;
        scalar_t* g = p.gates + (t * p.batch + b) * S3 + j;
#pragma unroll
        for (int i = 0; i < 3; ++i) g[i * S] = gate_out[i][n];
        p.output[(t * p.batch + b) * S + j] = y_out[n];
        if (last) {
          p.h_n[b * S + j] = h_out[n];
          p.c_n[b * S + j] = static_cast<scalar_t>(c[n]);
        }
      }
    }
    if (last) break;
    if (grp.working) load_z(t + 1);
    cluster_wait();  // every slice of h_t is in every CTA
  }
#endif
}

template <typename scalar_t, int NB>
__global__ void __launch_bounds__(kMaxThreads)
    seq_backward_persistent_kernel(const BackwardParams<scalar_t> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int V = 16 / sizeof(scalar_t);
  const cg::cluster_group cluster = cg::this_cluster();
  const Slice s = my_slice(cluster, p.units, p.rows, p.state, p.batch);
  const int J = p.units, S = p.state, row = p.row, Bp = p.rows_padded;
  const int64_t S3 = 3 * int64_t(S);

  extern __shared__ __align__(16) unsigned char smem[];
  scalar_t* wt_s = reinterpret_cast<scalar_t*>(smem);  // [3][J][row]
  scalar_t* x_s = wt_s + 3 * J * row;                  // [2][Bp][3][row]

  // wt_s[g][jj][k] = W_h[g S + k][j0 + jj]: this CTA's columns of W_h as
  // rows (read with jj fastest, so consecutive threads read consecutive
  // addresses of W).
  for (int e = threadIdx.x; e < 3 * J * row; e += blockDim.x) {
    const int jj = e % J, gk = e / J;
    const int k = gk % row, g = gk / row;
    wt_s[(g * J + jj) * row + k] =
        (jj < s.jn && k < S) ? p.w[(int64_t(g) * S + k) * p.w_ld + s.j0 + jj]
                             : scalar_t(0);
  }
  for (int e = threadIdx.x; e < 2 * Bp * 3 * row; e += blockDim.x) x_s[e] = scalar_t(0);

  const Group grp = my_group<NB>(s, p.ks, Bp);
  const int j = grp.j;
  const int chunks = (S + V - 1) / V;
  bool valid[NB];
  int64_t length[NB];
  acc_t dh[NB], dc[NB];  // the carried gradients of h_t and c_t
#pragma unroll
  for (int n = 0; n < NB; ++n) {
    valid[n] = grp.working && grp.r0 + n < s.bn;
    const int64_t b = s.b0 + grp.r0 + n;
    length[n] = !valid[n] ? 0 : (p.lengths == nullptr ? p.steps : p.lengths[b]);
    const int64_t at = b * S + j;
    dh[n] = valid[n] && p.grad_h_n != nullptr ? static_cast<acc_t>(p.grad_h_n[at]) : acc_t(0);
    dc[n] = valid[n] && p.grad_c_n != nullptr ? static_cast<acc_t>(p.grad_c_n[at]) : acc_t(0);
  }
  // What step t reads from global memory, loaded one step ahead: c_t, the
  // activated gates and the output's gradient.
  acc_t cell_t[NB], gate_t[3][NB], gout_t[NB];
  auto load_step = [&](int64_t t) {
#pragma unroll
    for (int n = 0; n < NB; ++n) {
      const bool live = valid[n] && t < length[n];
      const int64_t e = (t * p.batch + s.b0 + grp.r0 + n) * S + j;
      const scalar_t* g = p.gates + (t * p.batch + s.b0 + grp.r0 + n) * S3 + j;
      cell_t[n] = live ? static_cast<acc_t>(p.cells[e]) : acc_t(0);
      gout_t[n] = live && p.grad_output != nullptr ? static_cast<acc_t>(p.grad_output[e]) : acc_t(0);
#pragma unroll
      for (int i = 0; i < 3; ++i) gate_t[i][n] = live ? static_cast<acc_t>(g[i * S]) : acc_t(0);
    }
  };
  load_step(p.steps - 1);
  scalar_t d_out[3][NB];  // step t's d_pre
  cluster.sync();

  for (int64_t t = p.steps - 1; t >= 0; --t) {
    scalar_t* x_cur = x_s + (t & 1) * Bp * 3 * row;
    // d_pre_t of this group's unit and rows, pushed into every CTA.
    if (grp.working) {
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        if (!valid[n]) continue;
        const int r = grp.r0 + n;
        acc_t d[3] = {acc_t(0), acc_t(0), acc_t(0)};
        if (t < length[n]) {
          const CellBackward<acc_t> cell(dh[n] + gout_t[n], dc[n], cell_t[n],
                                         gate_t[0][n], gate_t[1][n], gate_t[2][n]);
          d[0] = cell.d_input;
          d[1] = cell.d_output;
          d[2] = cell.d_candidate;
          dc[n] = cell.d_cell;
          dh[n] = acc_t(0);  // h_{t-1} reaches h_t only through the gates
        }
        // Past a row's length h_t = h_{t-1}: dh carries over as it is.
#pragma unroll
        for (int i = 0; i < 3; ++i) d_out[i][n] = static_cast<scalar_t>(d[i]);
        for (int dst = grp.ks; dst < s.ctas; dst += grp.KS) {
          scalar_t* remote = cluster.map_shared_rank(x_cur, dst);
#pragma unroll
          for (int i = 0; i < 3; ++i) remote[(r * 3 + i) * row + j] = d_out[i][n];
        }
      }
    }
    cluster_arrive();  // before the global stores: see the forward kernel
    if (grp.working) {
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        if (!valid[n] || n % grp.KS != grp.ks) continue;
        scalar_t* dp = p.d_pre + (t * p.batch + s.b0 + grp.r0 + n) * S3 + j;
#pragma unroll
        for (int i = 0; i < 3; ++i) dp[i * S] = d_out[i][n];
      }
    }
    if (grp.working && t > 0) load_step(t - 1);
    cluster_wait();  // all of d_pre_t is in every CTA
    if (t == 0 && p.grad_h0 == nullptr) break;

    // d h_{t-1}[b, j] += sum_g sum_k d_pre_t[b, g S + k] W_h[g S + k, j]
    if (grp.working) {
      acc_t acc[NB];
#pragma unroll
      for (int n = 0; n < NB; ++n) acc[n] = acc_t(0);
#pragma unroll
      for (int i = 0; i < 3; ++i) {
        const scalar_t* wrow = wt_s + (i * J + grp.jj) * row;
        const scalar_t* xb = x_cur + (grp.r0 * 3 + i) * row;
        for (int k = grp.ks; k < chunks; k += grp.KS) {
          acc_t wv[V];
          load_pack<acc_t, scalar_t, V>(wrow + k * V, wv);
#pragma unroll
          for (int n = 0; n < NB; ++n) {
            acc_t xv[V];
            load_pack<acc_t, scalar_t, V>(xb + n * 3 * row + k * V, xv);
#pragma unroll
            for (int v = 0; v < V; ++v) acc[n] += wv[v] * xv[v];
          }
        }
      }
      group_sum(acc, grp.KS, grp.mask);
#pragma unroll
      for (int n = 0; n < NB; ++n) dh[n] += acc[n];
    }
  }
  // The gradients of the initial state.
#pragma unroll
  for (int n = 0; n < NB; ++n) {
    if (!valid[n] || n % grp.KS != grp.ks) continue;
    const int64_t at = (s.b0 + grp.r0 + n) * S + j;
    if (p.grad_h0 != nullptr) p.grad_h0[at] = static_cast<scalar_t>(dh[n]);
    if (p.grad_c0 != nullptr) p.grad_c0[at] = static_cast<scalar_t>(dc[n]);
  }
#endif
}

// ------------------------------------------------------------------ host

enum class SeqPath { kAuto, kPersistent, kLoop };

SeqPath seq_path() {
  const char* forced = std::getenv("LLTM_SEQ_PATH");
  if (forced == nullptr || *forced == '\0') return SeqPath::kAuto;
  if (std::strcmp(forced, "persistent") == 0) return SeqPath::kPersistent;
  if (std::strcmp(forced, "loop") == 0) return SeqPath::kLoop;
  TORCH_CHECK(false, "LLTM_SEQ_PATH=", forced,
              " is not a sequence path: use persistent, loop, or leave it unset");
}

int forced_cluster() {
  const char* forced = std::getenv("LLTM_SEQ_CLUSTER");
  if (forced == nullptr || *forced == '\0') return 0;
  const int n = std::atoi(forced);
  TORCH_CHECK(n >= 1 && n <= 16, "LLTM_SEQ_CLUSTER=", forced,
              " must be a cluster size from 1 to 16");
  return n;
}

// The split for B batch rows and S units with `cluster` CTAs per cluster,
// or nothing when the shared memory of one CTA cannot hold it.
std::optional<Plan> plan_for(bool backward, int64_t batch, int64_t state,
                             int elem, int cluster,
                             int max_clusters, size_t smem_limit) {
  const int V = 16 / elem;
  const int units = static_cast<int>(ceil_div(state, cluster));
  Plan plan{};
  plan.cluster = static_cast<int>(ceil_div(state, units));  // no idle CTA
  plan.units = units;
  const int64_t chunks = ceil_div(state, V);
  int64_t rows = ceil_div(batch, std::max(1, max_clusters));
  for (; rows >= 1; rows = ceil_div(rows, 2)) {
    const int nb = rows >= 4 ? 4 : (rows >= 2 ? 2 : 1);
    const int64_t padded = ceil_div(rows, nb) * nb;
    const int64_t pairs = int64_t(units) * (padded / nb);
    int ks = 32;
    while (ks > 1 && (pairs * ks > kMaxThreads || ks > chunks)) ks /= 2;
    // Rows a multiple of 8 chunks apart put the KS lanes of 8 / KS groups
    // on one bank set: offset the stride by KS chunks (mod 8) instead.
    int64_t row_chunks = chunks;
    if (ks < 8) {
      while (row_chunks % 8 != ks) ++row_chunks;
    }
    const int64_t row = row_chunks * V;
    const int64_t exchange = backward ? 2 * padded * 3 * row : 2 * padded * row;
    const int64_t smem = (3 * int64_t(units) * row + exchange) * elem;
    // One (unit, rows) pair per thread group: its state lives in registers.
    if (pairs <= kMaxThreads && smem <= static_cast<int64_t>(smem_limit)) {
      plan.rows = static_cast<int>(rows);
      plan.rows_padded = static_cast<int>(padded);
      plan.clusters = static_cast<int>(ceil_div(batch, rows));
      plan.per_thread = nb;
      plan.ks = ks;
      plan.threads = static_cast<int>(
          std::min<int64_t>(kMaxThreads, std::max<int64_t>(32, ceil_div(pairs * ks, 32) * 32)));
      plan.row = static_cast<int>(row);
      plan.smem = static_cast<size_t>(smem);
      return plan;
    }
    if (rows == 1) break;
  }
  return std::nullopt;
}

template <typename Params>
using Kernel = void (*)(Params);

// How many clusters of this launch shape can run at once on the device
// (0: none); asked once per kernel, device and shape.
template <typename Params>
int active_clusters(Kernel<Params> kernel, int device, const cudaLaunchConfig_t& config,
                    int cluster, size_t smem_limit) {
  using Key = std::tuple<const void*, int, int, unsigned, size_t>;
  static std::mutex mutex;
  static std::map<Key, int> cache;
  const Key key{reinterpret_cast<const void*>(kernel), device, cluster, config.blockDim.x,
                config.dynamicSmemBytes};
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  int active = 0;
  // The dynamic shared memory limit is raised to the device's maximum once,
  // so every plan of this kernel can launch.
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem_limit)) != cudaSuccess ||
      (cluster > 8 &&
       cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
           cudaSuccess) ||
      cudaOccupancyMaxActiveClusters(&active, kernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();
    active = 0;
  }
  cache.emplace(key, active);
  return active;
}

// The launch configuration of a plan (`attr` holds its cluster shape).
cudaLaunchConfig_t launch_config(const Plan& plan, cudaStream_t stream,
                                 cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid_size(int64_t(plan.cluster) * plan.clusters));
  config.blockDim = dim3(plan.threads);
  config.dynamicSmemBytes = plan.smem;
  config.stream = stream;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = plan.cluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  return config;
}

template <typename scalar_t, bool kBackward, int NB>
constexpr auto kernel_instance() {
  if constexpr (kBackward) {
    return &seq_backward_persistent_kernel<scalar_t, NB>;
  } else {
    return &seq_forward_persistent_kernel<scalar_t, NB>;
  }
}

// The instantiation for NB batch rows per thread group (1, 2 or 4).
template <typename scalar_t, bool kBackward>
auto kernel_for(int per_thread) {
  switch (per_thread) {
    case 4: return kernel_instance<scalar_t, kBackward, 4>();
    case 2: return kernel_instance<scalar_t, kBackward, 2>();
    default: return kernel_instance<scalar_t, kBackward, 1>();
  }
}

// Picks the plan and launches the kernel with it; false when no plan can
// run here.
template <typename scalar_t, bool kBackward, typename Params>
bool launch(const char* what, const Params& base, int64_t batch, int64_t state,
            const at::Tensor& like) {
  const SeqPath path = seq_path();
  if (path == SeqPath::kLoop) return false;
  auto refuse = [&](const char* why) {
    TORCH_CHECK(path != SeqPath::kPersistent, "lltm::fused (CUDA): LLTM_SEQ_PATH=persistent, but the persistent ",
                what, " kernel cannot run here: ", why);
    return false;
  };
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(like.get_device());
  if (prop->major < 9) return refuse("it needs thread-block clusters (compute capability 9.0 or newer)");
  const int forced = forced_cluster();
  const int sms = prop->multiProcessorCount;
  const size_t smem_limit = prop->sharedMemPerBlockOptin;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  // Default: 8 CTAs per cluster (the portable size), 16 when W_h's slices
  // only fit in 16 CTAs' shared memory.
  const int sizes[] = {forced > 0 ? forced : 8, 16};
  const int tries = forced > 0 ? 1 : 2;
  const int device = like.get_device();
  // How many clusters of this plan's shape can run at once (0: none).
  auto schedulable = [&](const Plan& plan) {
    cudaLaunchAttribute attr;
    return active_clusters(kernel_for<scalar_t, kBackward>(plan.per_thread), device,
                           launch_config(plan, stream, attr), plan.cluster, smem_limit);
  };
  for (int attempt = 0; attempt < tries; ++attempt) {
    const int cluster = std::min<int64_t>(sizes[attempt], state);
    auto plan_with = [&](int max_clusters) {
      return plan_for(kBackward, batch, state, sizeof(scalar_t), cluster, max_clusters,
                      smem_limit);
    };
    std::optional<Plan> plan = plan_with(sms / cluster);
    if (!plan) continue;
    const int active = schedulable(*plan);
    if (active == 0) continue;
    if (plan->clusters > active) {
      // Fewer clusters than planned fit on the device at once (GPC sizes):
      // the rest would run as a second wave. Spread the batch over the ones
      // that fit instead, where their shared memory allows.
      std::optional<Plan> wider = plan_with(active);
      if (wider && wider->clusters <= active && schedulable(*wider) >= wider->clusters) {
        plan = wider;
      }
    }
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config = launch_config(*plan, stream, attr);
    const Kernel<Params> kernel = kernel_for<scalar_t, kBackward>(plan->per_thread);
    Params params = base;
    params.units = plan->units;
    params.rows = plan->rows;
    params.rows_padded = plan->rows_padded;
    params.ks = plan->ks;
    params.row = plan->row;
    C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, params));
    return true;
  }
  return refuse("W_h does not fit in the shared memory of one cluster");
}

}  // namespace

bool seq_forward_persistent(const at::Tensor& gates, const RowMajor& w,
                            const at::Tensor& bias, const RowMajor& h0,
                            const RowMajor& c0, const at::Tensor& lengths,
                            const at::Tensor& output, const at::Tensor& h_n,
                            const at::Tensor& c_n) {
  const int64_t steps = gates.size(0), batch = gates.size(1), state = output.size(2);
  bool launched = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, gates.scalar_type(), "lltm_seq_forward_persistent", [&] {
        ForwardParams<scalar_t> p{};
        p.gates = gates.mutable_data_ptr<scalar_t>();
        p.w = w.data<scalar_t>();
        p.w_ld = w.ld;
        p.bias = bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr;
        p.h0 = h0.data<scalar_t>();
        p.h0_ld = h0.ld;
        p.c0 = c0.data<scalar_t>();
        p.c0_ld = c0.ld;
        p.lengths = lengths.defined() ? lengths.const_data_ptr<int64_t>() : nullptr;
        p.output = output.mutable_data_ptr<scalar_t>();
        p.h_n = h_n.mutable_data_ptr<scalar_t>();
        p.c_n = c_n.mutable_data_ptr<scalar_t>();
        p.steps = steps;
        p.batch = batch;
        p.state = static_cast<int>(state);
        launched = launch<scalar_t, false>("forward", p, batch, state, gates);
      });
  return launched;
}

bool seq_backward_persistent(const at::Tensor& grad_output,
                             const at::Tensor& grad_h_n,
                             const at::Tensor& grad_c_n, const RowMajor& w,
                             const at::Tensor& cells, const at::Tensor& gates,
                             const at::Tensor& lengths, const at::Tensor& d_pre,
                             const at::Tensor& grad_h0, const at::Tensor& grad_c0) {
  const int64_t steps = cells.size(0), batch = cells.size(1), state = cells.size(2);
  bool launched = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, cells.scalar_type(), "lltm_seq_backward_persistent", [&] {
        auto ptr = [](const at::Tensor& t) {
          return t.defined() ? t.const_data_ptr<scalar_t>() : nullptr;
        };
        auto mut = [](const at::Tensor& t) {
          return t.defined() ? t.mutable_data_ptr<scalar_t>() : nullptr;
        };
        BackwardParams<scalar_t> p{};
        p.grad_output = ptr(grad_output);
        p.grad_h_n = ptr(grad_h_n);
        p.grad_c_n = ptr(grad_c_n);
        p.w = w.data<scalar_t>();
        p.w_ld = w.ld;
        p.cells = cells.const_data_ptr<scalar_t>();
        p.gates = gates.const_data_ptr<scalar_t>();
        p.lengths = lengths.defined() ? lengths.const_data_ptr<int64_t>() : nullptr;
        p.d_pre = d_pre.mutable_data_ptr<scalar_t>();
        p.grad_h0 = mut(grad_h0);
        p.grad_c0 = mut(grad_c0);
        p.steps = steps;
        p.batch = batch;
        p.state = static_cast<int>(state);
        launched = launch<scalar_t, true>("backward", p, batch, state, cells);
      });
  return launched;
}

}  // namespace cuda_detail
}  // namespace lltm
