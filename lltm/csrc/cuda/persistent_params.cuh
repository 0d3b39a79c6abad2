// The persistent recurrent kernels' parameters and thread layout
// (seq_persistent.cu has the overview): what one launch is given, where a
// CTA and a thread group sit in the work, and the profiling clocks.
#pragma once

#include <ATen/OpMathType.h>

#include <cstdint>

#include "seq_plan.h"

namespace lltm {
namespace cuda_detail {

constexpr int kMaxThreads = 256;
constexpr int kMaxStates = 2;  // the most states a cell carries (cells/cell.h)

// One launch of the forward kernel of a cell with G gates, NS states and NV
// saved values.
template <typename scalar_t>
struct ForwardParams {
  const scalar_t* zx;  // (T, B, G S): x W_ih^T (no bias)
  scalar_t* saved;     // (T, B, NV S) out; may be zx itself (NV == G: step t's
                       //   values are read before step t writes)
  const scalar_t* w;   // W_hh (G S, S), rows w_ld apart
  int64_t w_ld;
  const scalar_t* b_ih;                // (G S,) or null
  const scalar_t* b_hh;                // (G S,) or null
  const scalar_t* state0[kMaxStates];  // (B, S) at b * state0_ld[k] + j
  int64_t state0_ld[kMaxStates];
  const int64_t* lengths;         // (B,) or null
  scalar_t* output;               // (T, B, S)
  scalar_t* state_n[kMaxStates];  // (B, S)
  scalar_t* exchange;             // grid: (2, 1, B, row) h_t by parity, zero past S
  unsigned* arrivals;             // grid: (chunks,) zeroed, one counter per chunk
  int64_t steps, batch;
  int64_t chunk0;  // the first chunk of this launch (a wave)
  int state, group, units, rows, rows_padded, ks, row;
  int mtiles, mstack, ksplit, w_rows;  // the MMA dot (seq_plan.h's Split)
  int multicast;  // grid MMA, sm_90: CTAs of a cluster sharing each reload (MulticastExchange; else 1)
};

// One launch of the backward kernel (reverse time).
template <typename scalar_t>
struct BackwardParams {
  const scalar_t* grad_output;               // (T, B, S) or null
  const scalar_t* grad_state_n[kMaxStates];  // (B, S) or null
  const scalar_t* w;                         // W_hh (G S, S), rows w_ld apart
  int64_t w_ld;
  const scalar_t* saved;   // (T, B, NV S)
  const scalar_t* output;  // (T, B, S): h_t, and h_{t-1} of step t > 0
  const scalar_t* states;  // (NS - 1, T, B, S): the other states after each step, or null (NS = 1)
  const scalar_t* state0[kMaxStates];  // (B, S) at b * state0_ld[k] + j
  int64_t state0_ld[kMaxStates];
  const int64_t* lengths;             // (B,) or null
  scalar_t* dzx;                      // (T, B, G S)
  scalar_t* dzh;                      // (T, B, G S), or null: the cell's dzh is its dzx
  scalar_t* grad_state0[kMaxStates];  // (B, S) or null
  // The bias gradients per batch row: (B, G S) sums over the steps of dzx
  // ([0]) and of dzh ([1], cells with kSplit), or null.
  at::opmath_type<scalar_t>* bias_rows[2];
  scalar_t* exchange;  // grid: (2, G, B, row) dzh_t by parity (gate-major), zero past S
  unsigned* arrivals;  // grid: (chunks,) zeroed
  int64_t steps, batch;
  int64_t chunk0;  // the first chunk of this launch (a wave)
  int state, group, units, rows, rows_padded, ks, row;
  int mtiles, mstack, ksplit, w_rows;  // the MMA dot (seq_plan.h's Split)
  int multicast;  // grid MMA, sm_90: CTAs of a cluster sharing each reload (MulticastExchange; else 1)
};

// Where this CTA sits: its units [j0, j0 + jn) and batch rows [b0, b0 + bn).
// Group g of a launch is CTAs [g C, (g + 1) C) of the 1-D grid (for a
// cluster launch that is the cluster, and blockIdx.x % C its rank in it),
// and owns chunk chunk0 + g.
struct Slice {
  int rank, j0, jn, bn;
  int64_t chunk, b0;
};

template <typename Params>
__device__ __forceinline__ Slice my_slice(const Params& p) {
  const int group = p.group, units = p.units, rows = p.rows, state = p.state;
  const int64_t batch = p.batch;
  Slice s;
  s.rank = static_cast<int>(blockIdx.x % group);
  s.chunk = p.chunk0 + blockIdx.x / group;
  s.j0 = s.rank * units;
  s.jn = max(0, min(units, state - s.j0));
  s.b0 = s.chunk * rows;
  s.bn = static_cast<int>(::min(static_cast<int64_t>(rows), batch - s.b0));
  return s;
}

// Thread layout shared by every kernel: thread group q (KS lanes) owns unit
// j0 + q % jn and the NB batch rows r0 .. r0 + NB - 1 of this CTA, for the
// whole sequence. Its lanes split the k range of the dot products and then
// all hold the same sums (a butterfly of commutative adds), so every lane
// runs the cell math of its group's NB rows and keeps the same carried
// state in registers; lane ks stores row n to global memory when
// n % KS == ks.
struct Group {
  int ks, KS, jj, j, r0;
  // Threads past the CTA's (unit, rows) pairs are not working: they run the
  // FMA dot (of unit 0, rows 0..) with their warp but no cell math.
  bool working;
  // Bit n: this lane puts row r0 + n into the exchange ((r0 + n) % KS ==
  // ks, spreading a thread group's rows over its lanes), or stores row n to
  // global memory (n % KS == ks). Divisions by KS, done once per launch,
  // not on every step's critical path.
  unsigned puts, stores;
};

template <int NB>
__device__ __forceinline__ Group my_group(const Slice& s, int KS, int rows_padded) {
  Group g;
  g.KS = KS;
  g.ks = threadIdx.x % KS;
  const int q = threadIdx.x / KS;
  g.working = q < s.jn * (rows_padded / NB);
  g.jj = g.working ? q % s.jn : 0;
  g.j = s.j0 + g.jj;
  g.r0 = g.working ? (q / s.jn) * NB : 0;
  g.puts = g.stores = 0;
#pragma unroll
  for (int n = 0; n < NB; ++n) {
    g.puts |= static_cast<unsigned>((g.r0 + n) % KS == g.ks) << n;
    g.stores |= static_cast<unsigned>(n % KS == g.ks) << n;
  }
  return g;
}

// The phases of a step in cycles, for profiling builds (LLTM_STEP_CLOCKS=1
// at build time, lltm/_sources.py): thread 0 of CTA 0 adds each phase's
// clock64 span up and prints the means per step when the loop ends, with
// the SM clock the loop ran at (its cycles over the global timer's
// nanoseconds: under load it may run below the clock rate the runtime
// reports, and the cycles are the SM's). In other builds every call is
// empty.
#ifdef LLTM_STEP_CLOCKS
// The exchange's trace (forward kernels of profiling builds): thread 0 of
// every CTA writes the global timer as it leaves the step's arrive and its
// wait, for kTraceSteps steps from step kTraceFrom on; the launch's last CTA
// to finish reads them all and prints, per batch chunk, how far apart the
// CTAs arrive and how long the last arrival takes to end the waits.
constexpr int kTraceCtas = 264, kTraceSteps = 64, kTraceFrom = 16;
static __device__ unsigned long long step_trace[kTraceCtas][kTraceSteps][2];
static __device__ unsigned step_trace_done;
#endif

struct StepClocks {
  static constexpr int kPhases = 6;
  using Names = const char* const (&)[kPhases];  // one per phase, in the order of the marks
#ifdef LLTM_STEP_CLOCKS
  long long sum[kPhases] = {}, last = 0, first = 0;
  unsigned long long first_ns = 0;
  int64_t traced = 0;  // steps that passed their wait (trace)
  bool on = false;
  // After the exchange's arrive (0) and after its wait (1): the trace's times.
  __device__ __forceinline__ void trace(int which) {
    const int64_t k = traced - kTraceFrom;
    if (threadIdx.x == 0 && blockIdx.x < kTraceCtas && k >= 0 && k < kTraceSteps)
      step_trace[blockIdx.x][k][which] = global_ns();
    if (which == 1) ++traced;
  }
  // Every thread at the end of a forward launch; thread 0 of the last CTA prints.
  __device__ void trace_report(const char* what, int group) const {
    if (threadIdx.x != 0) return;
    __threadfence();
    if (atomicAdd(&step_trace_done, 1u) != gridDim.x - 1) return;
    __threadfence();
    const int ctas = min(static_cast<int>(gridDim.x), kTraceCtas);
    const int64_t steps = min(static_cast<int64_t>(kTraceSteps), traced - kTraceFrom);
    for (int c0 = 0; c0 + group <= ctas && steps > 0; c0 += group) {
      double spread = 0, first_out = 0, last_out = 0, period = 0;
      unsigned long long min_spread = ~0ull, prev_last = 0;
      int last_cta = -1, last_count = 0, zero = 0;
      int counts[kTraceCtas] = {};
      for (int64_t k = 0; k < steps; ++k) {
        unsigned long long a_min = ~0ull, a_max = 0, w_min = ~0ull, w_max = 0;
        int arg = c0;
        for (int c = c0; c < c0 + group; ++c) {
          const unsigned long long a = step_trace[c][k][0], w = step_trace[c][k][1];
          if (a > a_max) a_max = a, arg = c;
          a_min = min(a_min, a);
          w_min = min(w_min, w);
          w_max = max(w_max, w);
        }
        spread += double(a_max - a_min);
        if (a_max > a_min) min_spread = min(min_spread, a_max - a_min);
        zero += a_max == a_min;
        first_out += double(w_min) - double(a_max);
        last_out += double(w_max) - double(a_max);
        if (k > 0) period += double(a_max - prev_last);
        prev_last = a_max;
        if (++counts[arg] > last_count) last_count = counts[arg], last_cta = arg;
      }
      printf(
          "lltm step trace: %s group=%d ctas %d-%d steps=%lld: arrivals %.0f ns apart (first to last), the "
          "last arrival to the first wait's end %.0f ns and to the last's %.0f ns; step %.0f ns; CTA %d "
          "arrives last in %d steps; timer: smallest nonzero spread %llu ns, %d steps without one\n",
          what, group, c0, c0 + group - 1, static_cast<long long>(steps), spread / steps, first_out / steps,
          last_out / steps, steps > 1 ? period / (steps - 1) : 0.0, last_cta, last_count, min_spread, zero);
    }
    step_trace_done = 0;
  }
  __device__ static unsigned long long global_ns() {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    return ns;
  }
  __device__ void start() {
    on = blockIdx.x == 0 && threadIdx.x == 0;
    first_ns = global_ns();
    first = last = clock64();
  }
  __device__ __forceinline__ void mark(int phase) {
    if (!on) return;
    const long long now = clock64();
    sum[phase] += now - last;
    last = now;
  }
  __device__ void report(const char* what, Names names, int64_t steps, int rows, int units, int group,
                         const char* dot) const {
    if (!on || steps <= 0) return;
    const long long cycles = clock64() - first;
    const unsigned long long ns = global_ns() - first_ns;
    long long total = 0;
    for (int i = 0; i < kPhases; ++i) total += sum[i];
    printf(
        "lltm step clocks: %s group=%d units=%d rows=%d dot=%s steps=%lld cycles/step: %s %lld, %s %lld, "
        "%s %lld, %s %lld, %s %lld, %s %lld; total %lld; sm clock %.3f GHz\n",
        what, group, units, rows, dot, static_cast<long long>(steps), names[0], sum[0] / steps, names[1],
        sum[1] / steps, names[2], sum[2] / steps, names[3], sum[3] / steps, names[4], sum[4] / steps,
        names[5], sum[5] / steps, total / steps, ns > 0 ? static_cast<double>(cycles) / ns : 0.0);
  }
#else
  __device__ void start() {}
  __device__ __forceinline__ void mark(int) {}
  __device__ __forceinline__ void trace(int) {}
  __device__ void trace_report(const char*, int) const {}
  __device__ void report(const char*, Names, int64_t, int, int, int, const char*) const {}
#endif
};

// The persistent kernels' dot (their kDot): FMA chains, tensor-core MMA in
// the dtype's own form (TF32 for float32), or float32's MMA as 3xTF32
// (persistent_dots.cuh's Tf32x3: lltm's accurate mode).
enum class DotKind { kFma, kMma, kMma3xTf32 };

// The dot a kernel runs, as the step clocks report it.
template <DotKind kDot, int kRegW>
__device__ __forceinline__ const char* dot_name() {
  if constexpr (kDot == DotKind::kMma3xTf32) {
    return "mma-3xtf32";
  } else if constexpr (kDot == DotKind::kMma) {
    return kRegW == 2 ? "mma-regs-part" : kRegW ? "mma-regs" : "mma";
  } else {
    return kRegW ? "fma-regs" : "fma-smem";
  }
}

// The byte offset in a CTA's shared memory of the MMA dot's tile of partial
// sums: past W_h's slice and the exchanged rows, 16-byte aligned.
__device__ __forceinline__ int mma_tile_offset(int elems, int elem_bytes) {
  return (elems * elem_bytes + 15) / 16 * 16;
}

}  // namespace cuda_detail
}  // namespace lltm
