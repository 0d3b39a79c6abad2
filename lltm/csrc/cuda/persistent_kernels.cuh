// The persistent recurrent kernels, written once for every cell (the
// cell's traits, cells/cell.h, are a template parameter) and both exchange
// policies; seq_persistent.cu has the overview, persistent_launch.cuh launches them.
//
// Template parameters: the Cell, the tensor dtype, NB batch rows per thread
// group, the dot (kDot: FMA chains, or tensor-core tiles in the dtype's
// form or as 3xTF32; persistent_params.cuh's DotKind), W_hh's slice
// in registers (kRegW != 0: the FMA dot's chunks; the MMA dot's A
// fragments, kRegW 1 of every k step of a warp's task, 2 of the first ones
// with the rest read from shared memory) or in shared memory (0), and the
// Exchange policy.
#pragma once

#include <ATen/OpMathType.h>

#include <type_traits>

#include "cell_math.cuh"
#include "persistent_dots.cuh"
#include "persistent_exchange.cuh"
#include "persistent_params.cuh"

namespace lltm {
namespace cuda_detail {

// tile_sum adds at most kMaxKsplit slices: the planner gives a task at most one per warp.
static_assert(kMaxKsplit >= kMaxThreads / 32,
              "a CTA's warps can split k into more slices than tile_sum adds");

// 16-byte chunks of W_hh's rows (forward) or columns (backward) a lane of
// the FMA dot keeps in registers: G gates x 4 words each, 96 registers at
// most (seq_plan.h's reg_chunks, which the planner checks).
template <typename Cell>
constexpr int kRegChunksOf = reg_chunks(Cell::kGates);

// Fills `rows` shared-memory rows `row` elements apart (row a multiple of
// 16 bytes, `dst` 16-byte aligned) from global rows: row r's first `cols`
// elements from row_of(r), zero past them and where row_of(r) is null. The
// prologue is latency-bound (a CTA stages tens of KB once per launch): 16
// bytes a load where `vec` says the global rows allow it, and kInFlight
// loads of each thread in flight before their stores.
template <typename scalar_t, typename RowOf>
__device__ __forceinline__ void stage_rows(scalar_t* dst, int rows, int row, int cols, bool vec,
                                           const RowOf& row_of) {
  constexpr int V = 16 / sizeof(scalar_t), kInFlight = 4;
  const int per_row = row / V, total = rows * per_row;
  for (int e0 = threadIdx.x; e0 < total; e0 += kInFlight * blockDim.x) {
    Pack<scalar_t, V> chunk[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int e = e0 + u * blockDim.x, r = e / per_row, k0 = (e - r * per_row) * V;
      const scalar_t* src = e < total ? row_of(r) : nullptr;
      if (src != nullptr && vec && k0 + V <= cols) {
        chunk[u] = *reinterpret_cast<const Pack<scalar_t, V>*>(src + k0);
      } else {
#pragma unroll
        for (int v = 0; v < V; ++v)
          chunk[u].val[v] = src != nullptr && k0 + v < cols ? src[k0 + v] : scalar_t(0);
      }
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int e = e0 + u * blockDim.x;
      if (e < total) reinterpret_cast<Pack<scalar_t, V>*>(dst)[e] = chunk[u];
    }
  }
}

// Whether rows `ld` elements apart from `p` can be read 16 bytes at a time.
template <typename scalar_t>
__device__ __forceinline__ bool rows_vectorizable(const scalar_t* p, int64_t ld) {
  return ld % (16 / sizeof(scalar_t)) == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// The common prologue of both kernels: refuses to run in a build without
// the code it needs for the device (the host never launches it there).
template <bool kClusters, bool kMma>
__device__ __forceinline__ bool unsupported_here() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  // No clusters (or MMA, below sm_80) in this build's code for the device:
  // the host never launches this (seq_persistent's arch check); if it did,
  // fail loudly.
  if constexpr (kClusters || (kMma && __CUDA_ARCH__ < 800)) {
    __trap();
    return true;
  }
#endif
  return false;
}

// The grid path's MMA kernels need more than 128 registers a thread (one
// CTA an SM at 256 threads). A minimum of one CTA an SM lets ptxas give
// them up to 255; without one it took some to 128, with spills (sm_90: the
// LSTM's float multicast forward, two rows a thread, 180 bytes). 0 leaves
// the others to ptxas (the FMA kernels fit 2-4 CTAs an SM).
template <DotKind kDot, typename Exchange>
constexpr int kMinCtas = kDot != DotKind::kFma && !Exchange::kClusterOnly ? 1 : 0;

// The MMA dot's form for a kernel's dot and dtype (persistent_dots.cuh).
template <DotKind kDot, typename scalar_t>
using MmaForm = std::conditional_t<kDot == DotKind::kMma3xTf32, Tf32x3, scalar_t>;

template <typename Cell, typename scalar_t, int NB, DotKind kDot, int kRegW,
          template <typename> class Exchange>
__global__ void __launch_bounds__(kMaxThreads, (kMinCtas<kDot, Exchange<scalar_t>>))
    seq_forward_persistent_kernel(const ForwardParams<scalar_t> p) {
  using acc_t = at::opmath_type<scalar_t>;
  using M = Activations<sizeof(scalar_t) <= 4>;  // fast activations for float math
  constexpr int G = Cell::kGates, NS = Cell::kStates, NV = Cell::kSaved;
  constexpr int V = 16 / sizeof(scalar_t);  // elements per 16-byte chunk
  constexpr int kRegChunks = kRegChunksOf<Cell>;
  constexpr bool kCluster = Exchange<scalar_t>::kClusterOnly;
  constexpr bool kMma = kDot != DotKind::kFma;
  // (The accurate mode keeps the forward's step products strict: precision.h's split_tf32_steps.)
  static_assert(kDot != DotKind::kMma3xTf32, "no 3xTF32 dot in the forward");
  // W_hh in registers: the FMA dot's chunks, or the MMA dot's A fragments
  // (one B tile, NB = 1; persistent_dots.cuh's hold_a), all or the first.
  constexpr bool kFmaRegs = kRegW != 0 && !kMma, kHeldA = kRegW != 0 && kMma,
                 kHeldPart = kHeldA && kRegW == 2;
  static_assert(!kHeldA || NB == 1, "the held A fragments are one row a thread group's");
  if (unsupported_here<Exchange<scalar_t>::kClusters, kMma>()) return;
  const Slice s = my_slice(p);
  const int J = p.units, S = p.state, row = p.row, Bp = p.rows_padded;
  constexpr int kParities = kCluster ? 2 : 1;

  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* base = smem + kHeaderBytes;          // past the exchange's mbarriers
  scalar_t* w_s = reinterpret_cast<scalar_t*>(base);  // [G][J][row], then zero rows up to w_rows
  scalar_t* h_s = w_s + p.w_rows * row;               // [parities][Bp][row]
  [[maybe_unused]] float* tile =
      reinterpret_cast<float*>(base + mma_tile_offset((p.w_rows + kParities * Bp) * row, sizeof(scalar_t)));

  // W_hh's rows of this CTA's units and h0 of its batch rows; zero padding
  // past S and past the last row, so the dot products need no bounds.
  stage_rows(w_s, p.w_rows, row, S, rows_vectorizable(p.w, p.w_ld), [&](int r) -> const scalar_t* {
    const int g = r / J, jj = r - g * J;
    return g < G && jj < s.jn ? p.w + (int64_t(g) * S + s.j0 + jj) * p.w_ld : nullptr;
  });
  stage_rows(h_s, kParities * Bp, row, S, rows_vectorizable(p.state0[0], p.state0_ld[0]),
             [&](int r) -> const scalar_t* {
               return r < s.bn ? p.state0[0] + int64_t(s.b0 + r) * p.state0_ld[0] : nullptr;
             });
  const Exchange<scalar_t> ex = Exchange<scalar_t>::make(p, s, h_s, 1, smem);

  // Thread groups cover the chunk's rows in NB-row steps (Bp may pad further, for the MMA tiles).
  const Group grp = my_group<NB>(s, p.ks, (p.rows + NB - 1) / NB * NB);
  const int j = grp.j;
  const int chunks = (S + V - 1) / V;
  // The FMA dot with W_hh in registers (kRegW; the planner left it out of
  // shared memory): lane ks holds chunks ks + m KS of its unit's G gate
  // rows, zero past S (threads that are not working hold unit j0's).
  Pack<scalar_t, V> w_r[G][kFmaRegs ? kRegChunks : 1];
  if constexpr (kFmaRegs) {
#pragma unroll
    for (int i = 0; i < G; ++i) {
      const scalar_t* w_row = p.w + (int64_t(i) * S + j) * p.w_ld;
#pragma unroll
      for (int m = 0; m < kRegChunks; ++m) {
        const int k0 = (grp.ks + m * grp.KS) * V;
#pragma unroll
        for (int v = 0; v < V; ++v) w_r[i][m].val[v] = k0 + v < S ? w_row[k0 + v] : scalar_t(0);
      }
    }
  }
  // Per row of the group: in range, its length, its carried states other than h.
  bool valid[NB];
  int64_t length[NB];
  acc_t carried[NS][NB];  // [0] unused: h lives in the exchange buffer
#pragma unroll
  for (int n = 0; n < NB; ++n) {
    valid[n] = grp.working && grp.r0 + n < s.bn;
    const int64_t b = s.b0 + grp.r0 + n;
    length[n] = !valid[n] ? 0 : (p.lengths == nullptr ? p.steps : p.lengths[b]);
#pragma unroll
    for (int k = 1; k < NS; ++k) {
      carried[k][n] = valid[n] ? static_cast<acc_t>(p.state0[k][b * p.state0_ld[k] + j]) : acc_t(0);
    }
  }
  acc_t b_ih[G], b_hh[G];
#pragma unroll
  for (int i = 0; i < G; ++i) {
    b_ih[i] = (grp.working && p.b_ih != nullptr) ? static_cast<acc_t>(p.b_ih[i * S + j]) : acc_t(0);
    b_hh[i] = (grp.working && p.b_hh != nullptr) ? static_cast<acc_t>(p.b_hh[i * S + j]) : acc_t(0);
  }
  // Element offsets of row n's unit j at step 0 in (T, B, G S), (T, B, NV S)
  // and (T, B, S); step t adds t times one step's elements.
  const int64_t zx_step = p.batch * G * int64_t(S), saved_step = p.batch * NV * int64_t(S),
                out_step = p.batch * S;
  int64_t at_zx[NB], at_saved[NB], at_out[NB];
#pragma unroll
  for (int n = 0; n < NB; ++n) {
    const int64_t b = s.b0 + grp.r0 + n;
    at_zx[n] = b * G * S + j;
    at_saved[n] = b * NV * S + j;
    at_out[n] = b * S + j;
  }
  // The input projections x_t W_ih^T of step t, loaded one step ahead and
  // kept in the tensor dtype until step t's cell math widens them: a
  // conversion here would wait for the loads (an HBM round trip) before the
  // exchange's wait, on the step's critical path where the thread that
  // polls the group holds rows.
  scalar_t z[G][NB];
  auto load_z = [&](int64_t t) {
#pragma unroll
    for (int n = 0; n < NB; ++n) {
      const bool live = valid[n] && t < length[n];
      const scalar_t* g = p.zx + t * zx_step + at_zx[n];
#pragma unroll
      for (int i = 0; i < G; ++i) z[i][n] = live ? g[i * S] : scalar_t(0);
    }
  };
  load_z(0);
  scalar_t h_out[NB], y_out[NB], saved_out[NV][NB];  // step t's results
  // The MMA dot's first task of this warp, placed once (persistent_dots.cuh).
  [[maybe_unused]] WarpTask task{};
  if constexpr (kMma) task = warp_task<scalar_t>(1, S, p.mtiles, p.mstack, Bp / 8, p.ksplit);
  ex.start();  // (its barrier also ends the staging of w_s)
  [[maybe_unused]] HeldA<1, kHeldPart> held;
  [[maybe_unused]] bool holds = false;
  if constexpr (kHeldA) {
    holds = holds_task(p.mtiles, p.mstack, p.ksplit);
    if (holds) hold_a<scalar_t, 1, kHeldPart>(w_s, 0, row, S, p.mstack, task, held);
  }
  StepClocks clk;
  clk.start();

  for (int64_t t = 0; t < p.steps; ++t) {
    // h_{t-1} is in parity t & 1 (h0 in 0); h_t goes to the other one.
    const scalar_t* h_cur = ex.view(t & 1);
    const int next = (t + 1) & 1;
    const bool last = t + 1 == p.steps;
    if constexpr (kMma) {  // every warp with a task: the CTA's G J x Bp products
      if constexpr (kHeldA) {
        if (holds)
          mma_dot_held<scalar_t, 1, kHeldPart>(w_s, h_cur, 0, 0, row, S, p.mtiles, p.mstack, task, held,
                                               tile);
      } else {
        mma_dot<scalar_t>(w_s, h_cur, 1, 0, row, 0, row, S, p.mtiles, p.mstack, Bp / 8, p.ksplit, task, tile);
      }
      __syncthreads();
      clk.mark(0);
    }
    // The FMA dot runs in every thread, working or not: group_sum takes whole warps.
    acc_t acc[G * NB];
#pragma unroll
    for (int i = 0; i < G * NB; ++i) acc[i] = acc_t(0);
    if constexpr (kMma) {
      if (grp.working) {
#pragma unroll
        for (int i = 0; i < G; ++i) {
#pragma unroll
          for (int n = 0; n < NB; ++n) {
            acc[i * NB + n] = tile_sum(tile, i * J + grp.jj, grp.r0 + n, p.mtiles, Bp / 8, p.ksplit);
          }
        }
      }
    } else {
      const scalar_t* hb = h_cur + grp.r0 * row;
      // The products of one k chunk: W's G gate rows (wv) times each row's h chunk.
      auto add_chunk = [&](int k, const acc_t(&wv)[G][V]) {
#pragma unroll
        for (int n = 0; n < NB; ++n) {
          acc_t hv[V];
          load_pack<acc_t, scalar_t, V>(hb + n * row + k * V, hv);
#pragma unroll
          for (int v = 0; v < V; ++v) {
#pragma unroll
            for (int i = 0; i < G; ++i) acc[i * NB + n] += wv[i][v] * hv[v];
          }
        }
      };
      if constexpr (kFmaRegs) {
#pragma unroll
        for (int m = 0; m < kRegChunks; ++m) {
          const int k = grp.ks + m * grp.KS;
          if (k >= chunks) break;
          acc_t wv[G][V];
#pragma unroll
          for (int i = 0; i < G; ++i) {
#pragma unroll
            for (int v = 0; v < V; ++v) wv[i][v] = static_cast<acc_t>(w_r[i][m].val[v]);
          }
          add_chunk(k, wv);
        }
      } else {
        const scalar_t* w0 = w_s + grp.jj * row;
        for (int k = grp.ks; k < chunks; k += grp.KS) {
          acc_t wv[G][V];
#pragma unroll
          for (int i = 0; i < G; ++i) load_pack<acc_t, scalar_t, V>(w0 + i * J * row + k * V, wv[i]);
          add_chunk(k, wv);
        }
      }
      clk.mark(0);
      group_sum(acc, grp.KS);
    }
    clk.mark(1);
    if (grp.working) {
      // Every row's cell math without branches (rows past their length, or
      // past the chunk, select what they keep): the NB independent chains
      // interleave instead of running one after the other.
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        const int r = grp.r0 + n;
        const bool alive = t < length[n];  // false for rows past the chunk (length 0)
        acc_t zx[G], zh[G], old[NS], upd[NS], sv[NV];
#pragma unroll
        for (int i = 0; i < G; ++i) {
          zx[i] = static_cast<acc_t>(z[i][n]) + b_ih[i];
          zh[i] = acc[i * NB + n] + b_hh[i];
        }
        const scalar_t h_prev = h_cur[r * row + j];
        old[0] = static_cast<acc_t>(h_prev);
#pragma unroll
        for (int k = 1; k < NS; ++k) old[k] = carried[k][n];
        Cell::template forward<M>(zx, zh, old, upd, sv);
        // Past a row's length: zero saved values and output, keep the states.
#pragma unroll
        for (int k = 1; k < NS; ++k) carried[k][n] = alive ? upd[k] : carried[k][n];
        h_out[n] = alive ? static_cast<scalar_t>(upd[0]) : h_prev;
        y_out[n] = alive ? h_out[n] : scalar_t(0);
#pragma unroll
        for (int k = 0; k < NV; ++k) saved_out[k][n] = alive ? static_cast<scalar_t>(sv[k]) : scalar_t(0);
      }
      if (!last) {
#pragma unroll
        for (int n = 0; n < NB; ++n) {
          if (valid[n]) ex.put(next, 0, grp.r0 + n, j, h_out[n], grp.puts >> n & 1u);
        }
      }
    }
    clk.mark(2);
    // Only the exchange comes before the arrive. The global stores (read by
    // no CTA of this launch) follow the wait, in the next dot's shadow: in
    // the wait their traffic lengthened the exchange, grid and cluster alike.
    if (!last) ex.arrive(next);
    clk.mark(3);
    if (!last) clk.trace(0);
    auto store_step = [&]() {
      if (grp.working) {
#pragma unroll
        for (int n = 0; n < NB; ++n) {
          if (!valid[n] || !(grp.stores >> n & 1u)) continue;
          const int64_t b = s.b0 + grp.r0 + n;
          scalar_t* sp = p.saved + t * saved_step + at_saved[n];
#pragma unroll
          for (int k = 0; k < NV; ++k) sp[k * S] = saved_out[k][n];
          p.output[t * out_step + at_out[n]] = y_out[n];
          if (last) {
            p.state_n[0][b * S + j] = h_out[n];
#pragma unroll
            for (int k = 1; k < NS; ++k) p.state_n[k][b * S + j] = static_cast<scalar_t>(carried[k][n]);
          }
        }
      }
    };
    if (last) store_step();  // two tests, as measured: one block of both compiles to other code
    if (last) break;
    if (grp.working) load_z(t + 1);
    clk.mark(4);
    ex.wait(next, t);  // every slice of h_t is in view(next)
    clk.mark(5);
    clk.trace(1);
    store_step();  // (timed in the next step's dot)
  }
  clk.trace_report(kCluster ? "forward cluster" : "forward grid", p.group);
  clk.report(kCluster ? "forward cluster" : "forward grid",
             {"dot", "reduce", "cell+put", "arrive", "loads", "wait"}, p.steps, p.rows, J, p.group,
             dot_name<kDot, kRegW>());
}

template <typename Cell, typename scalar_t, int NB, DotKind kDot, int kRegW,
          template <typename> class Exchange>
__global__ void __launch_bounds__(kMaxThreads, (kMinCtas<kDot, Exchange<scalar_t>>))
    seq_backward_persistent_kernel(const BackwardParams<scalar_t> p) {
  using acc_t = at::opmath_type<scalar_t>;
  using M = Activations<sizeof(scalar_t) <= 4>;
  constexpr int G = Cell::kGates, NS = Cell::kStates, NV = Cell::kSaved;
  constexpr int V = 16 / sizeof(scalar_t);
  constexpr int kRegChunks = kRegChunksOf<Cell>;
  constexpr bool kCluster = Exchange<scalar_t>::kClusterOnly;
  constexpr bool kMma = kDot != DotKind::kFma;
  using mma_t = MmaForm<kDot, scalar_t>;
  static_assert(kDot != DotKind::kMma3xTf32 || std::is_same_v<scalar_t, float>, "3xTF32 is float32's");
  // The grid exchanges reload dzh_t's gate blocks one by one (sm_90: an
  // mbarrier each): the MMA dot walks k segment by segment, every warp
  // starting on gate 0, and waits for each block as it reaches it. The
  // cluster's dot walks the same way (its rows are all there at once): the
  // held fragments are the first k steps of each segment's share, and the
  // dot from shared memory must add in the same order.
  constexpr bool kBlockWaits = kMma && !kCluster;
  // The grid kernels store a step's results after the dot (see the forward
  // kernel); the cluster kernels before their wait, which measured faster there.
  constexpr bool kLateStores = !kCluster;
  // W_hh^T in registers: the FMA dot's chunks, or the MMA dot's A fragments
  // (one B tile; persistent_dots.cuh's hold_a), all or the first of each segment.
  constexpr bool kFmaRegs = kRegW != 0 && !kMma, kHeldA = kRegW != 0 && kMma,
                 kHeldPart = kHeldA && kRegW == 2;
  static_assert(!kHeldA || NB == 1, "the held A fragments are one row a thread group's");
  if (unsupported_here<Exchange<scalar_t>::kClusters, kMma>()) return;
  const Slice s = my_slice(p);
  const int J = p.units, S = p.state, row = p.row, Bp = p.rows_padded;
  constexpr int kParities = kCluster ? 2 : 1;

  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* base = smem + kHeaderBytes;           // past the exchange's mbarriers
  scalar_t* wt_s = reinterpret_cast<scalar_t*>(base);  // [G][J][row], then zero rows up to w_rows
  // Gate-major (row g Bp + b: batch row b of gate g's segment): the MMA's B
  // tiles of one segment then lie `row` apart (conflict-free fragment
  // loads for every G), not G rows.
  scalar_t* x_s = wt_s + p.w_rows * row;  // [parities][G][Bp][row]
  [[maybe_unused]] float* tile = reinterpret_cast<float*>(
      base + mma_tile_offset((p.w_rows + kParities * Bp * G) * row, sizeof(scalar_t)));

  // wt_s[g][jj][k] = W_hh[g S + k][j0 + jj]: this CTA's columns of W_hh as
  // rows (read with jj fastest, so consecutive threads read consecutive
  // addresses of W); none with the FMA dot's W_hh in registers (w_rows = 0).
  // The reads are J elements wide at most: kInFlight of each thread in
  // flight before their stores (the prologue is latency-bound, as the forward's).
  {
    constexpr int kInFlight = 8;
    const int total = kFmaRegs ? 0 : G * J * row;
    for (int e0 = threadIdx.x; e0 < total; e0 += kInFlight * blockDim.x) {
      scalar_t v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int e = e0 + u * blockDim.x, jj = e % J, gk = e / J;
        const int k = gk % row, g = gk / row;
        v[u] = e < total && jj < s.jn && k < S ? p.w[(int64_t(g) * S + k) * p.w_ld + s.j0 + jj] : scalar_t(0);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int e = e0 + u * blockDim.x, jj = e % J, gk = e / J;
        const int k = gk % row, g = gk / row;
        if (e < total) wt_s[(g * J + jj) * row + k] = v[u];
      }
    }
  }
  const auto zero_row = [](int) -> const scalar_t* { return nullptr; };
  if (p.w_rows > G * J) stage_rows(wt_s + G * J * row, p.w_rows - G * J, row, 0, false, zero_row);
  stage_rows(x_s, kParities * Bp * G, row, 0, false, zero_row);
  const Exchange<scalar_t> ex = Exchange<scalar_t>::make(p, s, x_s, G, smem);

  // Thread groups cover the chunk's rows in NB-row steps (Bp may pad further, for the MMA tiles).
  const Group grp = my_group<NB>(s, p.ks, (p.rows + NB - 1) / NB * NB);
  const int j = grp.j;
  const int chunks = (S + V - 1) / V;
  // W_hh's column j in registers (kFmaRegs, see the forward kernel): chunks
  // ks + m KS of its G gate segments, w_r[g][m][v] = W_hh[g S + k][j].
  Pack<scalar_t, V> w_r[G][kFmaRegs ? kRegChunks : 1];
  if constexpr (kFmaRegs) {
#pragma unroll
    for (int i = 0; i < G; ++i) {
      const scalar_t* w_col = p.w + int64_t(i) * S * p.w_ld + j;
#pragma unroll
      for (int m = 0; m < kRegChunks; ++m) {
        const int k0 = (grp.ks + m * grp.KS) * V;
#pragma unroll
        for (int v = 0; v < V; ++v)
          w_r[i][m].val[v] = k0 + v < S ? w_col[int64_t(k0 + v) * p.w_ld] : scalar_t(0);
      }
    }
  }
  bool valid[NB];
  int64_t length[NB];
  acc_t d[NS][NB];  // the carried gradients of the states (h's without the output's term)
#pragma unroll
  for (int n = 0; n < NB; ++n) {
    valid[n] = grp.working && grp.r0 + n < s.bn;
    const int64_t b = s.b0 + grp.r0 + n;
    length[n] = !valid[n] ? 0 : (p.lengths == nullptr ? p.steps : p.lengths[b]);
    const int64_t at = b * S + j;
#pragma unroll
    for (int k = 0; k < NS; ++k) {
      d[k][n] =
          valid[n] && p.grad_state_n[k] != nullptr ? static_cast<acc_t>(p.grad_state_n[k][at]) : acc_t(0);
    }
  }
  // What step t reads from global memory, loaded one step ahead: the saved
  // values, the states the cell's backward reads (after step t and before
  // it) and the output's gradient. Element offsets as in the forward kernel.
  const int64_t zx_step = p.batch * G * int64_t(S), saved_step = p.batch * NV * int64_t(S),
                out_step = p.batch * S;
  int64_t at_zx[NB], at_saved[NB], at_out[NB];
#pragma unroll
  for (int n = 0; n < NB; ++n) {
    const int64_t b = s.b0 + grp.r0 + n;
    at_zx[n] = b * G * S + j;
    at_saved[n] = b * NV * S + j;
    at_out[n] = b * S + j;
  }
  // State k after step t: h from the output, the others from p.states; before step 0: the initial state.
  // Kept in the tensor dtype until the step's cell math (see the forward's load_z).
  auto state_at = [&](int k, int64_t t, int n) -> scalar_t {
    if (t < 0) return p.state0[k][(s.b0 + grp.r0 + n) * p.state0_ld[k] + j];
    const scalar_t* src = k == 0 ? p.output : p.states + (k - 1) * p.steps * out_step;
    return src[t * out_step + at_out[n]];
  };
  scalar_t saved_t[NV][NB], old_t[NS][NB], new_t[NS][NB], gout_t[NB];
  auto load_step = [&](int64_t t) {
#pragma unroll
    for (int n = 0; n < NB; ++n) {
      const bool live = valid[n] && t < length[n];
      const scalar_t* sv = p.saved + t * saved_step + at_saved[n];
      gout_t[n] = live && p.grad_output != nullptr ? p.grad_output[t * out_step + at_out[n]] : scalar_t(0);
#pragma unroll
      for (int k = 0; k < NV; ++k) saved_t[k][n] = live ? sv[k * S] : scalar_t(0);
#pragma unroll
      for (int k = 0; k < NS; ++k) {
        old_t[k][n] = live && (Cell::kOldRead >> k & 1u) ? state_at(k, t - 1, n) : scalar_t(0);
        new_t[k][n] = live && (Cell::kNewRead >> k & 1u) ? state_at(k, t, n) : scalar_t(0);
      }
    }
  };
  load_step(p.steps - 1);
  scalar_t dzx_out[G][NB], dzh_out[G][NB];  // step t's gradients of zx and zh
  // Their sums over the steps (the bias gradients of this unit and rows),
  // of the values stored: no pass over dzx after the loop.
  constexpr int kBiasSums = Cell::kSplit ? 2 : 1;
  acc_t bias_sum[kBiasSums][G][NB];
#pragma unroll
  for (int q = 0; q < kBiasSums; ++q) {
#pragma unroll
    for (int i = 0; i < G; ++i) {
#pragma unroll
      for (int n = 0; n < NB; ++n) bias_sum[q][i][n] = acc_t(0);
    }
  }
  [[maybe_unused]] WarpTask task{};  // the MMA dot's (see the forward kernel)
  if constexpr (kMma) task = warp_task<mma_t>(G, S, p.mtiles, p.mstack, Bp / 8, p.ksplit);
  ex.start();  // (its barrier also ends the staging of wt_s)
  [[maybe_unused]] HeldA<G, kHeldPart> held;
  [[maybe_unused]] bool holds = false;
  if constexpr (kHeldA) {
    holds = holds_task(p.mtiles, p.mstack, p.ksplit);
    if (holds) hold_a<scalar_t, G, kHeldPart>(wt_s, J, row, S, p.mstack, task, held);
  }
  StepClocks clk;
  clk.start();

  for (int64_t t = p.steps - 1; t >= 0; --t) {
    const int parity = t & 1;
    // dzh_t of this group's unit and rows, published to every CTA.
    if (grp.working) {
      // Every row without branches, as in the forward kernel.
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        const bool alive = t < length[n];  // false for rows past the chunk (length 0)
        acc_t dnext[NS], old[NS], upd[NS], sv[NV], dzx[G], dzh[G], ds[NS];
        dnext[0] = d[0][n] + static_cast<acc_t>(gout_t[n]);
#pragma unroll
        for (int k = 1; k < NS; ++k) dnext[k] = d[k][n];
#pragma unroll
        for (int k = 0; k < NS; ++k)
          old[k] = static_cast<acc_t>(old_t[k][n]), upd[k] = static_cast<acc_t>(new_t[k][n]);
#pragma unroll
        for (int k = 0; k < NV; ++k) sv[k] = static_cast<acc_t>(saved_t[k][n]);
        Cell::template backward<M>(dnext, old, upd, sv, dzx, dzh, ds);
#pragma unroll
        for (int i = 0; i < G; ++i) {
          dzx_out[i][n] = alive ? static_cast<scalar_t>(dzx[i]) : scalar_t(0);
          dzh_out[i][n] = alive ? static_cast<scalar_t>(Cell::kSplit ? dzh[i] : dzx[i]) : scalar_t(0);
          bias_sum[0][i][n] += static_cast<acc_t>(dzx_out[i][n]);
          if constexpr (Cell::kSplit) bias_sum[kBiasSums - 1][i][n] += static_cast<acc_t>(dzh_out[i][n]);
        }
        // Past a row's length the states stay: their gradients carry over as they are.
#pragma unroll
        for (int k = 0; k < NS; ++k) d[k][n] = alive ? ds[k] : d[k][n];
      }
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        if (!valid[n]) continue;
#pragma unroll
        for (int i = 0; i < G; ++i) ex.put(parity, i, grp.r0 + n, j, dzh_out[i][n], grp.puts >> n & 1u);
      }
    }
    clk.mark(0);
    ex.arrive(parity);  // before the global stores (after the dot where kLateStores): see the forward kernel
    clk.mark(1);
    auto store_step = [&]() {
      if (grp.working) {
#pragma unroll
        for (int n = 0; n < NB; ++n) {
          if (!valid[n] || !(grp.stores >> n & 1u)) continue;
          scalar_t* dp = p.dzx + t * zx_step + at_zx[n];
#pragma unroll
          for (int i = 0; i < G; ++i) dp[i * S] = dzx_out[i][n];
          if constexpr (Cell::kSplit) {
            scalar_t* dq = p.dzh + t * zx_step + at_zx[n];
#pragma unroll
            for (int i = 0; i < G; ++i) dq[i * S] = dzh_out[i][n];
          }
        }
      }
    };
    if constexpr (!kLateStores) store_step();
    if (grp.working && t > 0) load_step(t - 1);
    clk.mark(2);
    const int64_t n = p.steps - 1 - t;  // this launch's exchange
    const bool done = t == 0 && p.grad_state0[0] == nullptr;
    if constexpr (kBlockWaits) {
      ex.reload(parity, n);           // the dot waits for each gate block of dzh_t
      if (done) ex.wait_reloaded(n);  // no copy may still write to this CTA once it exits
    } else {
      ex.wait(parity, n);  // all of dzh_t is in view(parity)
    }
    clk.mark(3);
    if (done) {
      if constexpr (kLateStores) store_step();
      break;
    }

    // d h_{t-1}[b, j] += sum_g sum_k dzh_t[b, g S + k] W_hh[g S + k, j]
    const scalar_t* x_cur = ex.view(parity);
    if constexpr (kMma) {  // every warp with a task: the CTA's J x Bp products over G k segments
      // Before each gate segment: the grid's wait for its reloaded block (the cluster's are all there).
      const auto wait_gate = [&]([[maybe_unused]] int gate) {
        if constexpr (kBlockWaits) ex.wait_block(gate, n);
      };
      if constexpr (kHeldA) {
        if (holds)
          mma_dot_held<scalar_t, G, kHeldPart>(wt_s, x_cur, J, Bp * row, row, S, p.mtiles, p.mstack, task,
                                               held, tile, wait_gate);
      } else {
        mma_dot<mma_t, true>(wt_s, x_cur, G, J, row, Bp * row, row, S, p.mtiles, p.mstack, Bp / 8, p.ksplit,
                             task, tile, wait_gate);
      }
      __syncthreads();
      if constexpr (kLateStores) store_step();
      clk.mark(4);
    }
    // The FMA dot runs in every thread, working or not: group_sum takes whole warps.
    acc_t acc[NB];
#pragma unroll
    for (int n = 0; n < NB; ++n) acc[n] = acc_t(0);
    if constexpr (kMma) {
      if (grp.working) {
#pragma unroll
        for (int n = 0; n < NB; ++n) acc[n] = tile_sum(tile, grp.jj, grp.r0 + n, p.mtiles, Bp / 8, p.ksplit);
      }
    } else if constexpr (kFmaRegs) {
      // One chain per gate and row (G times shorter), added at the end.
      acc_t part[G][NB];
#pragma unroll
      for (int i = 0; i < G; ++i) {
#pragma unroll
        for (int n = 0; n < NB; ++n) part[i][n] = acc_t(0);
      }
#pragma unroll
      for (int m = 0; m < kRegChunks; ++m) {
        const int k = grp.ks + m * grp.KS;
        if (k >= chunks) break;
#pragma unroll
        for (int i = 0; i < G; ++i) {
          const scalar_t* xb = x_cur + (i * Bp + grp.r0) * row + k * V;
#pragma unroll
          for (int n = 0; n < NB; ++n) {
            acc_t xv[V];
            load_pack<acc_t, scalar_t, V>(xb + n * row, xv);
#pragma unroll
            for (int v = 0; v < V; ++v) part[i][n] += static_cast<acc_t>(w_r[i][m].val[v]) * xv[v];
          }
        }
      }
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        acc[n] = part[0][n];
#pragma unroll
        for (int i = 1; i < G; ++i) acc[n] += part[i][n];
      }
      if constexpr (kLateStores) store_step();
      clk.mark(4);
      group_sum(acc, grp.KS);
    } else {
#pragma unroll
      for (int i = 0; i < G; ++i) {
        const scalar_t* wrow = wt_s + (i * J + grp.jj) * row;
        const scalar_t* xb = x_cur + (i * Bp + grp.r0) * row;
        for (int k = grp.ks; k < chunks; k += grp.KS) {
          acc_t wv[V];
          load_pack<acc_t, scalar_t, V>(wrow + k * V, wv);
#pragma unroll
          for (int n = 0; n < NB; ++n) {
            acc_t xv[V];
            load_pack<acc_t, scalar_t, V>(xb + n * row + k * V, xv);
#pragma unroll
            for (int v = 0; v < V; ++v) acc[n] += wv[v] * xv[v];
          }
        }
      }
      if constexpr (kLateStores) store_step();
      clk.mark(4);
      group_sum(acc, grp.KS);
    }
    if (grp.working) {
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        // rows past their length got dzh = 0: their carried dh is unchanged
        d[0][n] += acc[n];
      }
    }
    clk.mark(5);
  }
  clk.report(kCluster ? "backward cluster" : "backward grid",
             {"cell+put", "arrive", kLateStores ? "loads" : "stores+loads", "wait",
              kLateStores ? "dot+stores" : "dot", "reduce"},
             p.steps, p.rows, J, p.group, dot_name<kDot, kRegW>());
  // The gradients of the initial states, and the bias sums of each batch row.
#pragma unroll
  for (int n = 0; n < NB; ++n) {
    if (!valid[n] || !(grp.stores >> n & 1u)) continue;
    const int64_t b = s.b0 + grp.r0 + n, at = b * S + j;
#pragma unroll
    for (int k = 0; k < NS; ++k) {
      if (p.grad_state0[k] != nullptr) p.grad_state0[k][at] = static_cast<scalar_t>(d[k][n]);
    }
#pragma unroll
    for (int q = 0; q < kBiasSums; ++q) {
      if (p.bias_rows[q] == nullptr) continue;
#pragma unroll
      for (int i = 0; i < G; ++i) p.bias_rows[q][b * G * S + i * S + j] = bias_sum[q][i][n];
    }
  }
}

}  // namespace cuda_detail
}  // namespace lltm
