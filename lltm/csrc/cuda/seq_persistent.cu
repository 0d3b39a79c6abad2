// Persistent recurrent kernels of the fused CUDA sequence operators.
//
// One launch runs the whole time loop of one direction. The grid is made of
// groups of CTAs: a group owns a chunk of batch rows, and CTA r of the group
// owns the state units [r J, (r + 1) J). Chunks are independent, so groups
// never wait on each other; inside a group:
//
//   forward, step t: each CTA computes the three gate rows of its units for
//   its batch rows from W_h's rows (resident for all T steps in its shared
//   memory, or, with the FMA dot in float32, spread over its lanes'
//   registers) and h_{t-1} (a full copy in its shared memory), finishes the cell
//   math of its units itself (c stays in registers in float), writes output
//   and gates, and publishes its slice of h_t to the other CTAs; one group
//   barrier per step, during which the next step's input projection loads.
//
//   backward, step t (reverse time): each CTA turns the carried dh, dc of its
//   units into d_pre_t (the gradient of the gate pre-activations),
//   publishes its slice of d_pre_t, waits at the group barrier, and computes
//   d h_{t-1} for its units from W_h's columns (resident, as W_h^T rows) and
//   all of d_pre_t; dh and dc stay in registers in float, and the next
//   step's saved gates and cells load during the barrier.
//
// How a slice reaches the other CTAs is the exchange policy, the one
// difference between the two kernels of each direction:
//   ClusterExchange  a thread-block cluster (sm_90+): every CTA writes its
//                    slice into its own shared memory, then pushes it into
//                    every other CTA's (DSMEM, st.async), each store
//                    counting its bytes on the receiver's mbarrier; a CTA
//                    waits only for its own mbarrier to complete (no
//                    cluster barrier, no sender waiting for its stores).
//                    Both parities of the buffer live on chip.
//   GridExchange     any group of co-resident CTAs (a cooperative launch):
//                    slices go to a global buffer (L2), the group meets at
//                    an arrival counter, and each CTA reloads the whole step
//                    into its shared memory.
// Exchanged values travel in the tensor dtype (what the per-step cuBLAS path
// reads too); every product accumulates in float (double for double). The
// dot products run one of two ways (the split's dot, seq_plan.h): FMA
// chains (float32 strict fp32) or tensor-core MMA tiles (half types, and
// float32 as TF32 where the user allowed it). Exchange buffers are
// double-buffered by step parity, so one synchronisation per step
// suffices: a CTA writes parity p again only after every CTA has published
// the step after its last read of parity p.
//
// The cell math is the cell's (CellForward / CellBackward of cell_math.cuh);
// the plan (which kernel, which split) is seq_plan.cpp's.
#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "../lltm.h"
#include "cell_math.cuh"
#include "seq_persistent.h"
#include "seq_plan.h"

namespace lltm {
namespace cuda_detail {

namespace {

constexpr int kMaxThreads = 256;

template <typename scalar_t>
struct ForwardParams {
  scalar_t* gates;    // (T, B, 3S): x W_x^T in, activated gates out
  const scalar_t* w;  // (3S, w_ld): W_h = columns [0, S)
  int64_t w_ld;
  const scalar_t* bias;  // (3S,) or null
  const scalar_t* h0;    // (B, S) at b * h0_ld + j
  int64_t h0_ld;
  const scalar_t* c0;  // (B, S) at b * c0_ld + j
  int64_t c0_ld;
  const int64_t* lengths;  // (B,) or null
  scalar_t* output;        // (T, B, S)
  scalar_t* h_n;           // (B, S)
  scalar_t* c_n;           // (B, S)
  scalar_t* exchange;      // grid: (2, B, row) h_t by parity, zero past S
  unsigned* arrivals;      // grid: (chunks,) zeroed, one counter per chunk
  int64_t steps, batch;
  int64_t chunk0;  // the first chunk of this launch (a wave)
  int state, group, units, rows, rows_padded, ks, row;
  int mtiles, ksplit, w_rows;  // the MMA dot (seq_plan.h's Split)
};

template <typename scalar_t>
struct BackwardParams {
  const scalar_t* grad_output;  // (T, B, S) or null
  const scalar_t* grad_h_n;     // (B, S) or null
  const scalar_t* grad_c_n;     // (B, S) or null
  const scalar_t* w;            // (3S, w_ld): W_h = columns [0, S)
  int64_t w_ld;
  const scalar_t* cells;   // (T, B, S)
  const scalar_t* gates;   // (T, B, 3S) activated
  const int64_t* lengths;  // (B,) or null
  scalar_t* d_pre;         // (T, B, 3S)
  scalar_t* grad_h0;       // (B, S) or null
  scalar_t* grad_c0;       // (B, S) or null
  scalar_t* exchange;      // grid: (2, 3B, row) d_pre_t by parity, zero past S
  unsigned* arrivals;      // grid: (chunks,) zeroed
  int64_t steps, batch;
  int64_t chunk0;  // the first chunk of this launch (a wave)
  int state, group, units, rows, rows_padded, ks, row;
  int mtiles, ksplit, w_rows;  // the MMA dot (seq_plan.h's Split)
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

// ------------------------------------------------------- exchange policies
//
// Each holds the exchanged rows of one step, a matrix of R * rows_padded
// rows of `row` elements (R = 1: h_t; R = 3: d_pre_t, row b * 3 + gate).
//   view(parity)  what this CTA's dot products read
//   put(...)      element (q, j) of this CTA's slice (row q, column j of
//                 the matrix), held by `lanes` lanes of which this is `lane`
//   arrive(p)     after the puts (every thread calls it): publishes them;
//                 the global stores of the step follow it
//   wait(p, n)    every CTA's puts of exchange n (parity p) are in view(p)

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Shared-memory addresses for the PTX below: 32-bit offsets in the CTA's
// window, and the same offset in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

[[maybe_unused]] __device__ __forceinline__ uint32_t cluster_address(uint32_t local, int rank) {
  uint32_t remote;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
#else
  remote = local;
#endif
  return remote;
}

template <typename T>
struct ClusterExchange {
  // One store of the slice to another CTA, at parity 0: the source word(s)
  // in this CTA, the destination and the destination's mbarrier.
  struct Send {
    uint32_t src, dst, bar;
  };

  T* local;          // [2][R Bp][row]: both parities, in this CTA
  int parity_elems;  // R Bp row
  int row;           // elements per exchanged row (padded)
  int ctas, rank;
  uint32_t bars;      // shared address of the parity-0 mbarrier (parity 1 follows)
  uint32_t expected;  // bytes the other CTAs send into this one per step
  // The slice's stores: items = R bn rows x per_row chunks of `chunk` bytes
  // (16 where the slice is 16-byte aligned, else 4), to each of the other
  // ctas - 1 CTAs; thread i sends pairs i, i + threads, ... of the
  // (CTA, item) pairs, its first two precomputed.
  uint32_t src0;  // shared address of (row 0, column j0) at parity 0
  int row_bytes, parity_bytes, per_row, items, chunk;
  Send first[2];
  int firsts;

  __device__ T* view(int parity) const { return local + parity * parity_elems; }

  // A slice travels as whole 4-byte words (the planner keeps J even for 2-byte
  // types; the last CTA's odd word carries the zero padding past S).
  __device__ static int slice_bytes(int jn) { return (jn * static_cast<int>(sizeof(T)) + 3) / 4 * 4; }

  // This CTA's copy of the step: one lane of the group writes it locally;
  // arrive() sends the whole slice on.
  __device__ void put(int parity, int q, int j, T v, int lane, int /*lanes*/) const {
    if (lane == 0) view(parity)[q * row + j] = v;
  }

  __device__ Send send_of(int e) const {
    const int other = e / items, item = e - other * items;
    const int d = other + (other >= rank);  // every CTA but this one
    const int r = item / per_row;
    const uint32_t src = src0 + r * row_bytes + (item - r * per_row) * chunk;
    return {src, cluster_address(src, d), cluster_address(bars, d)};
  }

  __device__ void send(const Send& x, int parity) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t src = x.src + parity * parity_bytes, dst = x.dst + parity * parity_bytes;
    const uint32_t bar = x.bar + 8 * parity;
    if (chunk == 16) {
      uint32_t v0, v1, v2, v3;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
                   : "r"(src)
                   : "memory");
      asm volatile(
          "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::
              "r"(dst),
          "r"(v0), "r"(v1), "r"(v2), "r"(v3), "r"(bar)
          : "memory");
    } else {
      uint32_t v;
      asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(src) : "memory");
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(dst),
                   "r"(v), "r"(bar)
                   : "memory");
    }
#endif
  }

  // Every thread's puts are in view(parity); then the slice goes to every
  // other CTA with st.async, each store completing bytes on the receiver's
  // mbarrier of that parity. No thread waits for its stores: the receivers'
  // mbarriers say when they have landed.
  __device__ void arrive(int parity) const {
    __syncthreads();
    if (firsts > 0) send(first[0], parity);
    if (firsts > 1) send(first[1], parity);
    for (int e = threadIdx.x + 2 * blockDim.x; e < items * (ctas - 1); e += blockDim.x)
      send(send_of(e), parity);
  }

  // The n-th exchange of the launch has landed once the mbarrier of its
  // parity completes its phase (n / 2: each parity serves every other
  // exchange); thread 0 then arms the next phase of that mbarrier. Nothing
  // of exchange n + 2 can arrive earlier: every CTA sends it only after
  // exchange n + 1, which this CTA sends after this point.
  //
  // A CTA alone in its cluster (expected == 0) waits for nothing: arrive()'s
  // barrier already put its own puts before the next step's reads. Arming
  // there would complete the next phase at once, and a thread of this CTA
  // still to test the phase that just ended would then wait for the one
  // after it, which nobody completes: a hang, depending on warp timing.
  __device__ void wait(int parity, int64_t n) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (expected == 0) return;
    const uint32_t bar = bars + 8 * parity;
    const uint32_t phase = static_cast<uint32_t>(n >> 1) & 1u;
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "wait_loop:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait_loop;\n"
        "}\n" ::"r"(bar),
        "r"(phase)
        : "memory");
    if (threadIdx.x == 0) arm(bar);
#endif
  }

  __device__ void arm(uint32_t bar) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(expected)
                 : "memory");
#endif
  }

  // The mbarriers are set up and armed, and every CTA of the cluster runs,
  // before any CTA stores into another's shared memory.
  __device__ void start() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
      for (int q = 0; q < 2; ++q) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bars + 8 * q) : "memory");
      }
      // The initialisation is complete before any use, this thread's arming included.
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
      for (int q = 0; q < 2; ++q) arm(bars + 8 * q);
    }
    asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
#endif
  }

  template <typename Params>
  __device__ static ClusterExchange make(const Params& p, const Slice& s, T* buffer, int rows_per,
                                         unsigned char* header) {
    ClusterExchange ex;
    ex.local = buffer;
    ex.parity_elems = rows_per * p.rows_padded * p.row;
    ex.row = p.row;
    ex.ctas = p.group;
    ex.rank = s.rank;
    ex.bars = smem_address(header);
    int per_row = 0;
    for (int d = 0; d < p.group; ++d) {
      if (d != s.rank) per_row += slice_bytes(max(0, min(p.units, p.state - d * p.units)));
    }
    ex.expected = static_cast<uint32_t>(rows_per * s.bn * per_row);
    const int bytes = slice_bytes(s.jn);
    ex.chunk = (s.j0 * sizeof(T)) % 16 == 0 && bytes % 16 == 0 ? 16 : 4;  // rows are 16-byte aligned
    ex.src0 = smem_address(buffer + s.j0);
    ex.row_bytes = p.row * static_cast<int>(sizeof(T));
    ex.parity_bytes = ex.parity_elems * static_cast<int>(sizeof(T));
    ex.per_row = bytes / ex.chunk;
    ex.items = rows_per * s.bn * ex.per_row;
    const int pairs = ex.items * (ex.ctas - 1);
    ex.firsts = 0;
    for (int i = 0; i < 2; ++i) {
      const int e = threadIdx.x + i * blockDim.x;
      if (e < pairs) ex.first[ex.firsts++] = ex.send_of(e);
    }
    return ex;
  }
};

template <typename T>
struct GridExchange {
  T* local;              // [R Bp][row] in this CTA
  T* global;             // [2][R B][row]
  unsigned* arrivals;    // this chunk's counter
  int64_t parity_elems;  // R B row
  int64_t first;         // R b0: this chunk's first exchanged row
  int rows;              // R bn: this chunk's exchanged rows
  int row;               // elements per exchanged row (padded)
  int group;

  __device__ T* view(int /*parity*/) const { return local; }

  __device__ void put(int parity, int q, int j, T v, int lane, int lanes) const {
    if (lane == q % lanes) global[parity * parity_elems + (first + q) * row + j] = v;
  }
  // The CTA's puts, then one arrival: a release at GPU scope orders the
  // CTA's puts (which the barrier put before it) before the count.
  __device__ void arrive(int /*parity*/) const {
    __syncthreads();
    if (threadIdx.x == 0)
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(arrivals) : "memory");
  }
  // The n-th exchange of this launch is complete when the group has
  // arrived (n + 1) times; then the chunk's rows of that parity are copied
  // into shared memory, 16 bytes at a time, from L2 (ld.global.cg: another
  // SM wrote them, this SM's L1 may hold an older copy).
  __device__ void wait(int parity, int64_t n) const {
    if (threadIdx.x == 0) {
      const unsigned target = static_cast<unsigned>(n + 1) * static_cast<unsigned>(group);
      while (static_cast<int>(load_acquire(arrivals) - target) < 0) {
      }
    }
    __syncthreads();
    const int4* src = reinterpret_cast<const int4*>(global + parity * parity_elems + first * row);
    int4* dst = reinterpret_cast<int4*>(local);
    const int vectors = rows * row * static_cast<int>(sizeof(T)) / 16;
    for (int e = threadIdx.x; e < vectors; e += blockDim.x) dst[e] = __ldcg(src + e);
    __syncthreads();
  }
  __device__ void start() const { __syncthreads(); }

  template <typename Params>
  __device__ static GridExchange make(const Params& p, const Slice& s, T* buffer, int rows_per,
                                      unsigned char* /*header*/) {
    return {buffer,
            p.exchange,
            p.arrivals + s.chunk,
            rows_per * p.batch * p.row,
            rows_per * s.b0,
            rows_per * s.bn,
            p.row,
            p.group};
  }
};

// ------------------------------------------------------ the tensor-core dot
//
// One step's recurrent products of a CTA as warp-level MMAs (mma.sync,
// sm_80+), fp32 accumulators: D = A B with A = rows of W_h's slice in
// shared memory (row-major, `row` elements a row) and B = the exchanged
// rows (batch row n is B's column n, contiguous in k). K comes in
// `segments` segments: segment s of A starts `seg_rows` rows further down,
// of B one row further (backward: gate s of d_pre_t); B's batch rows lie
// `b_stride` elements apart. Warp w takes the (tile, k slice) tasks w, w +
// warps, ...: one 16-row tile of A against all NT 8-row tiles of B over
// its k slice, written to tile[slice][m][n] (ld = 8 NT + 1 floats); readers
// add the slices in order, so no result depends on timing. Padding: A's and
// B's k past S is zero in shared memory; rows of A past the CTA's units and
// columns of B past its batch rows give D entries nobody reads.

__device__ __forceinline__ uint32_t to_tf32(uint32_t x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(__uint_as_float(x)));
  return r;
}

// d += a b for one 16 x 8 tile: m16n8k8 TF32 for float, m16n8k16 for half types.
template <typename scalar_t>
__device__ __forceinline__ void mma_tile(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<scalar_t, float>) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    static_assert(std::is_same_v<scalar_t, at::Half>, "MMA for float (TF32), bfloat16 and half only");
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#endif
}

// NT B tiles (8 batch rows each; NT = 1, 2, 4 or 8: the planner pads the
// rows to one of these). The k steps of one task alternate between two sets
// of accumulators, so two MMA chains are in flight (one chain would wait out
// every MMA's latency); the sets are added at the end.
template <typename scalar_t, int NT>
__device__ __forceinline__ void mma_dot_tiles(const scalar_t* a, const scalar_t* b, int segments,
                                              int seg_rows, int b_stride, int row, int state, int mtiles,
                                              int ksplit, float* tile) {
  constexpr bool kTf32 = std::is_same_v<scalar_t, float>;
  constexpr int kStep = kTf32 ? 8 : 16;  // k of one MMA
  constexpr int kPer = kTf32 ? 1 : 2;    // elements per 32-bit word
  constexpr int kWords = kStep / kPer;   // words of one k step in a row
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int ksteps = (state + kStep - 1) / kStep;
  const int total = segments * ksteps;
  constexpr int ld = NT * 8 + 1;
  const int row_w = row / kPer, b_w = b_stride / kPer;  // in words
  const uint32_t* a32 = reinterpret_cast<const uint32_t*>(a);
  const uint32_t* b32 = reinterpret_cast<const uint32_t*>(b);
  for (int task = warp; task < mtiles * ksplit; task += warps) {
    const int mt = task % mtiles, slice = task / mtiles;
    const int k0 = slice * total / ksplit, k1 = (slice + 1) * total / ksplit;
    float acc[2][NT][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[h][nt][0] = acc[h][nt][1] = acc[h][nt][2] = acc[h][nt][3] = 0.f;
    }
    // k step k0 is step kin of segment seg; both advance one step at a time.
    int seg = k0 / ksteps, kin = k0 - seg * ksteps;
    auto step = [&](float (&d)[NT][4]) {
      // A (16 x kStep, row-major): rows g and g + 8, words t and t + 4.
      const uint32_t* ap = a32 + (seg * seg_rows + mt * 16 + g) * row_w + kin * kWords + t;
      uint32_t af[4] = {ap[0], ap[8 * row_w], ap[4], ap[8 * row_w + 4]};
      // B (kStep x 8, column n = batch row n): words t and t + 4 of row g.
      const uint32_t* bp = b32 + seg * row_w + g * b_w + kin * kWords + t;
      uint32_t bf[NT][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        bf[nt][0] = bp[nt * 8 * b_w];
        bf[nt][1] = bp[nt * 8 * b_w + 4];
      }
      if constexpr (kTf32) {
#pragma unroll
        for (int i = 0; i < 4; ++i) af[i] = to_tf32(af[i]);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) bf[nt][0] = to_tf32(bf[nt][0]), bf[nt][1] = to_tf32(bf[nt][1]);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma_tile<scalar_t>(d[nt], af, bf[nt]);
      if (++kin == ksteps) kin = 0, ++seg;
    };
    int k = k0;
    for (; k + 1 < k1; k += 2) {
      step(acc[0]);
      step(acc[1]);
    }
    if (k < k1) step(acc[0]);
    // D fragment: rows g and g + 8, columns 2t and 2t + 1 of each B tile.
    float* out = tile + (slice * mtiles * 16 + mt * 16 + g) * ld + 2 * t;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      out[nt * 8] = acc[0][nt][0] + acc[1][nt][0];
      out[nt * 8 + 1] = acc[0][nt][1] + acc[1][nt][1];
      out[8 * ld + nt * 8] = acc[0][nt][2] + acc[1][nt][2];
      out[8 * ld + nt * 8 + 1] = acc[0][nt][3] + acc[1][nt][3];
    }
  }
}

template <typename scalar_t>
__device__ __forceinline__ void mma_dot(const scalar_t* a, const scalar_t* b, int segments, int seg_rows,
                                        int b_stride, int row, int state, int mtiles, int ntiles, int ksplit,
                                        float* tile) {
  switch (ntiles) {
    case 1:
      mma_dot_tiles<scalar_t, 1>(a, b, segments, seg_rows, b_stride, row, state, mtiles, ksplit, tile);
      break;
    case 2:
      mma_dot_tiles<scalar_t, 2>(a, b, segments, seg_rows, b_stride, row, state, mtiles, ksplit, tile);
      break;
    case 4:
      mma_dot_tiles<scalar_t, 4>(a, b, segments, seg_rows, b_stride, row, state, mtiles, ksplit, tile);
      break;
    default:
      mma_dot_tiles<scalar_t, 8>(a, b, segments, seg_rows, b_stride, row, state, mtiles, ksplit, tile);
      break;
  }
}

// D[m][n] of mma_dot: its k slices added in order.
__device__ __forceinline__ float tile_sum(const float* tile, int m, int n, int mtiles, int ntiles,
                                          int ksplit) {
  const int ld = ntiles * 8 + 1, slice = mtiles * 16 * ld;
  float v = 0.f;
  for (int s = 0; s < ksplit; ++s) v += tile[s * slice + m * ld + n];
  return v;
}

// ------------------------------------------------------------ the kernels

// The sums over each KS-lane group of a warp (KS divides 32: the xor
// offsets stay inside a group). Every lane of the warp takes part: with a
// full mask the shuffles need no convergence checks.
template <int N, typename acc_t>
__device__ __forceinline__ void group_sum(acc_t (&v)[N], int ks) {
  for (int offset = ks >> 1; offset > 0; offset >>= 1) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], offset);
  }
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
  return g;
}

// The phases of a step in cycles, for profiling builds (LLTM_STEP_CLOCKS=1
// at build time, lltm/_sources.py): thread 0 of CTA 0 adds each phase's
// clock64 span up and prints the means per step when the loop ends. In
// other builds every call is empty.
struct StepClocks {
  static constexpr int kPhases = 6;
  using Names = const char* const (&)[kPhases];  // one per phase, in the order of the marks
#ifdef LLTM_STEP_CLOCKS
  long long sum[kPhases] = {}, last = 0;
  bool on = false;
  __device__ void start() {
    on = blockIdx.x == 0 && threadIdx.x == 0;
    last = clock64();
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
    long long total = 0;
    for (int i = 0; i < kPhases; ++i) total += sum[i];
    printf(
        "lltm step clocks: %s group=%d units=%d rows=%d dot=%s steps=%lld cycles/step: %s %lld, %s %lld, "
        "%s %lld, %s %lld, %s %lld, %s %lld; total %lld\n",
        what, group, units, rows, dot, static_cast<long long>(steps), names[0], sum[0] / steps, names[1],
        sum[1] / steps, names[2], sum[2] / steps, names[3], sum[3] / steps, names[4], sum[4] / steps,
        names[5], sum[5] / steps, total / steps);
  }
#else
  __device__ void start() {}
  __device__ __forceinline__ void mark(int) {}
  __device__ void report(const char*, Names, int64_t, int, int, int, const char*) const {}
#endif
};

// The dot a kernel runs, as the step clocks report it.
template <bool kMma, bool kRegW>
__device__ __forceinline__ const char* dot_name() {
  return kMma ? "mma" : kRegW ? "fma-regs" : "fma-smem";
}

// The byte offset in a CTA's shared memory of the MMA dot's tile of partial
// sums: past W_h's slice and the exchanged rows, 16-byte aligned.
__device__ __forceinline__ int mma_tile_offset(int elems, int elem_bytes) {
  return (elems * elem_bytes + 15) / 16 * 16;
}

template <typename scalar_t, int NB, bool kMma, bool kRegW, template <typename> class Exchange>
__global__ void __launch_bounds__(kMaxThreads)
    seq_forward_persistent_kernel(const ForwardParams<scalar_t> p) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int V = 16 / sizeof(scalar_t);           // elements per 16-byte chunk
  constexpr bool kFastMath = sizeof(scalar_t) <= 4;  // the cell's fast activations (float math)
  constexpr bool kCluster = std::is_same_v<Exchange<scalar_t>, ClusterExchange<scalar_t>>;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  // No clusters (or MMA, below sm_80) in this build's code for the device:
  // the host never launches this (seq_persistent's arch check); if it did,
  // fail loudly.
  if constexpr (kCluster || (kMma && __CUDA_ARCH__ < 800)) {
    __trap();
    return;
  }
#endif
  const Slice s = my_slice(p);
  const int J = p.units, S = p.state, row = p.row, Bp = p.rows_padded;
  const int64_t S3 = 3 * int64_t(S);
  constexpr int kParities = kCluster ? 2 : 1;

  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* base = smem + kHeaderBytes;          // past the exchange's mbarriers
  scalar_t* w_s = reinterpret_cast<scalar_t*>(base);  // [3][J][row], then zero rows up to w_rows
  scalar_t* h_s = w_s + p.w_rows * row;               // [parities][Bp][row]
  [[maybe_unused]] float* tile =
      reinterpret_cast<float*>(base + mma_tile_offset((p.w_rows + kParities * Bp) * row, sizeof(scalar_t)));

  // W_h's rows of this CTA's units and h0 of its batch rows; zero padding
  // past S and past the last row, so the dot products need no bounds.
  for (int e = threadIdx.x; e < p.w_rows * row; e += blockDim.x) {
    const int k = e % row, r = e / row;
    const int g = r / J, jj = r - g * J;
    w_s[e] = (g < 3 && jj < s.jn && k < S) ? p.w[(int64_t(g) * S + s.j0 + jj) * p.w_ld + k] : scalar_t(0);
  }
  for (int e = threadIdx.x; e < kParities * Bp * row; e += blockDim.x) {
    const int k = e % row, r = e / row;
    h_s[e] = (r < s.bn && k < S) ? p.h0[(s.b0 + r) * p.h0_ld + k] : scalar_t(0);
  }
  const Exchange<scalar_t> ex = Exchange<scalar_t>::make(p, s, h_s, 1, smem);

  // Thread groups cover the chunk's rows in NB-row steps (Bp may pad further, for the MMA tiles).
  const Group grp = my_group<NB>(s, p.ks, (p.rows + NB - 1) / NB * NB);
  const int j = grp.j;
  const int chunks = (S + V - 1) / V;
  // The FMA dot with W_h in registers (kRegW; the planner left it out of
  // shared memory): lane ks holds chunks ks + m KS of its unit's three gate
  // rows, zero past S (threads that are not working hold unit j0's).
  Pack<scalar_t, V> w_r[3][kRegW ? kRegChunks : 1];
  if constexpr (kRegW) {
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      const scalar_t* w_row = p.w + (int64_t(i) * S + j) * p.w_ld;
#pragma unroll
      for (int m = 0; m < kRegChunks; ++m) {
        const int k0 = (grp.ks + m * grp.KS) * V;
#pragma unroll
        for (int v = 0; v < V; ++v) w_r[i][m].val[v] = k0 + v < S ? w_row[k0 + v] : scalar_t(0);
      }
    }
  }
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
  // Element offsets of row n's unit j at step 0 in (T, B, 3S) and (T, B, S);
  // step t adds t times one step's elements.
  const int64_t gates_step = p.batch * S3, out_step = p.batch * S;
  int64_t at_gates[NB], at_out[NB];
#pragma unroll
  for (int n = 0; n < NB; ++n) {
    at_gates[n] = (s.b0 + grp.r0 + n) * S3 + j;
    at_out[n] = (s.b0 + grp.r0 + n) * S + j;
  }
  // The pre-activations x_t W_x^T of step t, loaded one step ahead.
  acc_t z[3][NB];
  auto load_z = [&](int64_t t) {
#pragma unroll
    for (int n = 0; n < NB; ++n) {
      const bool live = valid[n] && t < length[n];
      const scalar_t* g = p.gates + t * gates_step + at_gates[n];
#pragma unroll
      for (int i = 0; i < 3; ++i) z[i][n] = live ? static_cast<acc_t>(g[i * S]) : acc_t(0);
    }
  };
  load_z(0);
  scalar_t h_out[NB], y_out[NB], gate_out[3][NB];  // step t's results
  ex.start();
  StepClocks clk;
  clk.start();

  for (int64_t t = 0; t < p.steps; ++t) {
    // h_{t-1} is in parity t & 1 (h0 in 0); h_t goes to the other one.
    const scalar_t* h_cur = ex.view(t & 1);
    const int next = (t + 1) & 1;
    const bool last = t + 1 == p.steps;
    if constexpr (kMma) {  // every warp: the CTA's 3 J x Bp products
      mma_dot<scalar_t>(w_s, h_cur, 1, 0, row, row, S, p.mtiles, Bp / 8, p.ksplit, tile);
      __syncthreads();
      clk.mark(0);
    }
    // The FMA dot runs in every thread, working or not: group_sum takes whole warps.
    acc_t acc[3 * NB];
#pragma unroll
    for (int i = 0; i < 3 * NB; ++i) acc[i] = acc_t(0);
    if constexpr (kMma) {
      if (grp.working) {
#pragma unroll
        for (int i = 0; i < 3; ++i) {
#pragma unroll
          for (int n = 0; n < NB; ++n) {
            acc[i * NB + n] = tile_sum(tile, i * J + grp.jj, grp.r0 + n, p.mtiles, Bp / 8, p.ksplit);
          }
        }
      }
    } else {
      const scalar_t* hb = h_cur + grp.r0 * row;
      // The products of one k chunk: W's three gate rows (wv) times each row's h chunk.
      auto add_chunk = [&](int k, const acc_t(&wv)[3][V]) {
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
      };
      if constexpr (kRegW) {
#pragma unroll
        for (int m = 0; m < kRegChunks; ++m) {
          const int k = grp.ks + m * grp.KS;
          if (k >= chunks) break;
          acc_t wv[3][V];
#pragma unroll
          for (int i = 0; i < 3; ++i) {
#pragma unroll
            for (int v = 0; v < V; ++v) wv[i][v] = static_cast<acc_t>(w_r[i][m].val[v]);
          }
          add_chunk(k, wv);
        }
      } else {
        const scalar_t* w0 = w_s + grp.jj * row;
        for (int k = grp.ks; k < chunks; k += grp.KS) {
          acc_t wv[3][V];
#pragma unroll
          for (int i = 0; i < 3; ++i) load_pack<acc_t, scalar_t, V>(w0 + i * J * row + k * V, wv[i]);
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
        const CellForward<acc_t, kFastMath> cell(z[0][n] + bias[0] + acc[n], z[1][n] + bias[1] + acc[NB + n],
                                                 z[2][n] + bias[2] + acc[2 * NB + n], c[n]);
        // Past a row's length: zero gates and output, keep h and c.
        c[n] = alive ? cell.new_cell : c[n];
        h_out[n] = alive ? static_cast<scalar_t>(cell.new_h) : h_cur[r * row + j];
        y_out[n] = alive ? h_out[n] : scalar_t(0);
        gate_out[0][n] = alive ? static_cast<scalar_t>(cell.input_gate) : scalar_t(0);
        gate_out[1][n] = alive ? static_cast<scalar_t>(cell.output_gate) : scalar_t(0);
        gate_out[2][n] = alive ? static_cast<scalar_t>(cell.candidate) : scalar_t(0);
      }
      if (!last) {
#pragma unroll
        for (int n = 0; n < NB; ++n) {
          if (valid[n]) ex.put(next, grp.r0 + n, j, h_out[n], grp.ks, grp.KS);
        }
      }
    }
    clk.mark(2);
    // Only the exchange comes before the arrive; the global stores (read by
    // no CTA of this launch) follow it.
    if (!last) ex.arrive(next);
    clk.mark(3);
    if (grp.working) {
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        if (!valid[n] || n % grp.KS != grp.ks) continue;
        const int64_t b = s.b0 + grp.r0 + n;
        scalar_t* g = p.gates + t * gates_step + at_gates[n];
#pragma unroll
        for (int i = 0; i < 3; ++i) g[i * S] = gate_out[i][n];
        p.output[t * out_step + at_out[n]] = y_out[n];
        if (last) {
          p.h_n[b * S + j] = h_out[n];
          p.c_n[b * S + j] = static_cast<scalar_t>(c[n]);
        }
      }
    }
    if (last) break;
    if (grp.working) load_z(t + 1);
    clk.mark(4);
    ex.wait(next, t);  // every slice of h_t is in view(next)
    clk.mark(5);
  }
  clk.report(kCluster ? "forward cluster" : "forward grid",
             {"dot", "reduce", "cell+put", "arrive", "stores+loads", "wait"}, p.steps, p.rows, J, p.group,
             dot_name<kMma, kRegW>());
}

template <typename scalar_t, int NB, bool kMma, bool kRegW, template <typename> class Exchange>
__global__ void __launch_bounds__(kMaxThreads)
    seq_backward_persistent_kernel(const BackwardParams<scalar_t> p) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int V = 16 / sizeof(scalar_t);
  constexpr bool kFastMath = sizeof(scalar_t) <= 4;
  constexpr bool kCluster = std::is_same_v<Exchange<scalar_t>, ClusterExchange<scalar_t>>;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  if constexpr (kCluster || (kMma && __CUDA_ARCH__ < 800)) {  // see the forward kernel
    __trap();
    return;
  }
#endif
  const Slice s = my_slice(p);
  const int J = p.units, S = p.state, row = p.row, Bp = p.rows_padded;
  const int64_t S3 = 3 * int64_t(S);
  constexpr int kParities = kCluster ? 2 : 1;

  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* base = smem + kHeaderBytes;           // past the exchange's mbarriers
  scalar_t* wt_s = reinterpret_cast<scalar_t*>(base);  // [3][J][row], then zero rows up to w_rows
  scalar_t* x_s = wt_s + p.w_rows * row;               // [parities][Bp][3][row]
  [[maybe_unused]] float* tile = reinterpret_cast<float*>(
      base + mma_tile_offset((p.w_rows + kParities * Bp * 3) * row, sizeof(scalar_t)));

  // wt_s[g][jj][k] = W_h[g S + k][j0 + jj]: this CTA's columns of W_h as
  // rows (read with jj fastest, so consecutive threads read consecutive
  // addresses of W); none with W_h in registers (w_rows = 0).
  for (int e = threadIdx.x; e < (kRegW ? 0 : 3 * J * row); e += blockDim.x) {
    const int jj = e % J, gk = e / J;
    const int k = gk % row, g = gk / row;
    wt_s[(g * J + jj) * row + k] =
        (jj < s.jn && k < S) ? p.w[(int64_t(g) * S + k) * p.w_ld + s.j0 + jj] : scalar_t(0);
  }
  for (int e = 3 * J * row + threadIdx.x; e < p.w_rows * row; e += blockDim.x) wt_s[e] = scalar_t(0);
  for (int e = threadIdx.x; e < kParities * Bp * 3 * row; e += blockDim.x) x_s[e] = scalar_t(0);
  const Exchange<scalar_t> ex = Exchange<scalar_t>::make(p, s, x_s, 3, smem);

  // Thread groups cover the chunk's rows in NB-row steps (Bp may pad further, for the MMA tiles).
  const Group grp = my_group<NB>(s, p.ks, (p.rows + NB - 1) / NB * NB);
  const int j = grp.j;
  const int chunks = (S + V - 1) / V;
  // W_h's column j in registers (kRegW, see the forward kernel): chunks
  // ks + m KS of its three gate segments, w_r[g][m][v] = W_h[g S + k][j].
  Pack<scalar_t, V> w_r[3][kRegW ? kRegChunks : 1];
  if constexpr (kRegW) {
#pragma unroll
    for (int i = 0; i < 3; ++i) {
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
  // Element offsets as in the forward kernel.
  const int64_t gates_step = p.batch * S3, out_step = p.batch * S;
  int64_t at_gates[NB], at_out[NB];
#pragma unroll
  for (int n = 0; n < NB; ++n) {
    at_gates[n] = (s.b0 + grp.r0 + n) * S3 + j;
    at_out[n] = (s.b0 + grp.r0 + n) * S + j;
  }
  acc_t cell_t[NB], gate_t[3][NB], gout_t[NB];
  auto load_step = [&](int64_t t) {
#pragma unroll
    for (int n = 0; n < NB; ++n) {
      const bool live = valid[n] && t < length[n];
      const int64_t e = t * out_step + at_out[n];
      const scalar_t* g = p.gates + t * gates_step + at_gates[n];
      cell_t[n] = live ? static_cast<acc_t>(p.cells[e]) : acc_t(0);
      gout_t[n] = live && p.grad_output != nullptr ? static_cast<acc_t>(p.grad_output[e]) : acc_t(0);
#pragma unroll
      for (int i = 0; i < 3; ++i) gate_t[i][n] = live ? static_cast<acc_t>(g[i * S]) : acc_t(0);
    }
  };
  load_step(p.steps - 1);
  scalar_t d_out[3][NB];  // step t's d_pre
  ex.start();
  StepClocks clk;
  clk.start();

  for (int64_t t = p.steps - 1; t >= 0; --t) {
    const int parity = t & 1;
    // d_pre_t of this group's unit and rows, published to every CTA.
    if (grp.working) {
      // Every row without branches, as in the forward kernel.
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        const bool alive = t < length[n];  // false for rows past the chunk (length 0)
        const CellBackward<acc_t, kFastMath> cell(dh[n] + gout_t[n], dc[n], cell_t[n], gate_t[0][n],
                                                  gate_t[1][n], gate_t[2][n]);
        d_out[0][n] = alive ? static_cast<scalar_t>(cell.d_input) : scalar_t(0);
        d_out[1][n] = alive ? static_cast<scalar_t>(cell.d_output) : scalar_t(0);
        d_out[2][n] = alive ? static_cast<scalar_t>(cell.d_candidate) : scalar_t(0);
        dc[n] = alive ? cell.d_cell : dc[n];
        // h_{t-1} reaches h_t only through the gates; past a row's length
        // h_t = h_{t-1}, and dh carries over as it is.
        dh[n] = alive ? acc_t(0) : dh[n];
      }
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        if (!valid[n]) continue;
#pragma unroll
        for (int i = 0; i < 3; ++i) ex.put(parity, (grp.r0 + n) * 3 + i, j, d_out[i][n], grp.ks, grp.KS);
      }
    }
    clk.mark(0);
    ex.arrive(parity);  // before the global stores: see the forward kernel
    clk.mark(1);
    if (grp.working) {
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        if (!valid[n] || n % grp.KS != grp.ks) continue;
        scalar_t* dp = p.d_pre + t * gates_step + at_gates[n];
#pragma unroll
        for (int i = 0; i < 3; ++i) dp[i * S] = d_out[i][n];
      }
    }
    if (grp.working && t > 0) load_step(t - 1);
    clk.mark(2);
    ex.wait(parity, p.steps - 1 - t);  // all of d_pre_t is in view(parity)
    clk.mark(3);
    if (t == 0 && p.grad_h0 == nullptr) break;

    // d h_{t-1}[b, j] += sum_g sum_k d_pre_t[b, g S + k] W_h[g S + k, j]
    const scalar_t* x_cur = ex.view(parity);
    if constexpr (kMma) {  // every warp: the CTA's J x Bp products over three k segments
      mma_dot<scalar_t>(wt_s, x_cur, 3, J, 3 * row, row, S, p.mtiles, Bp / 8, p.ksplit, tile);
      __syncthreads();
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
    } else if constexpr (kRegW) {
      // One chain per gate and row (three times shorter), added at the end.
      acc_t part[3][NB];
#pragma unroll
      for (int i = 0; i < 3; ++i) {
#pragma unroll
        for (int n = 0; n < NB; ++n) part[i][n] = acc_t(0);
      }
#pragma unroll
      for (int m = 0; m < kRegChunks; ++m) {
        const int k = grp.ks + m * grp.KS;
        if (k >= chunks) break;
#pragma unroll
        for (int i = 0; i < 3; ++i) {
          const scalar_t* xb = x_cur + (grp.r0 * 3 + i) * row + k * V;
#pragma unroll
          for (int n = 0; n < NB; ++n) {
            acc_t xv[V];
            load_pack<acc_t, scalar_t, V>(xb + n * 3 * row, xv);
#pragma unroll
            for (int v = 0; v < V; ++v) part[i][n] += static_cast<acc_t>(w_r[i][m].val[v]) * xv[v];
          }
        }
      }
#pragma unroll
      for (int n = 0; n < NB; ++n) acc[n] = part[0][n] + part[1][n] + part[2][n];
      clk.mark(4);
      group_sum(acc, grp.KS);
    } else {
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
      clk.mark(4);
      group_sum(acc, grp.KS);
    }
    if (grp.working) {
#pragma unroll
      for (int n = 0; n < NB; ++n) dh[n] += acc[n];
    }
    clk.mark(5);
  }
  clk.report(kCluster ? "backward cluster" : "backward grid",
             {"cell+put", "arrive", "stores+loads", "wait", "dot", "reduce"}, p.steps, p.rows, J, p.group,
             dot_name<kMma, kRegW>());
  // The gradients of the initial state.
#pragma unroll
  for (int n = 0; n < NB; ++n) {
    if (!valid[n] || n % grp.KS != grp.ks) continue;
    const int64_t at = (s.b0 + grp.r0 + n) * S + j;
    if (p.grad_h0 != nullptr) p.grad_h0[at] = static_cast<scalar_t>(dh[n]);
    if (p.grad_c0 != nullptr) p.grad_c0[at] = static_cast<scalar_t>(dc[n]);
  }
}

// ------------------------------------------------------------------ host

template <typename Params>
using Kernel = void (*)(Params);

template <typename scalar_t, bool kBackward, int NB, bool kMma, bool kRegW,
          template <typename> class Exchange>
constexpr auto kernel_instance() {
  if constexpr (kBackward) {
    return &seq_backward_persistent_kernel<scalar_t, NB, kMma, kRegW, Exchange>;
  } else {
    return &seq_forward_persistent_kernel<scalar_t, NB, kMma, kRegW, Exchange>;
  }
}

template <typename scalar_t, bool kBackward, bool kMma, bool kRegW>
auto kernel_for_dot(SeqPath path, int per_thread) {
  const bool cluster = path == SeqPath::kCluster;
  switch (per_thread) {
    case 4:
      return cluster ? kernel_instance<scalar_t, kBackward, 4, kMma, kRegW, ClusterExchange>()
                     : kernel_instance<scalar_t, kBackward, 4, kMma, kRegW, GridExchange>();
    case 2:
      return cluster ? kernel_instance<scalar_t, kBackward, 2, kMma, kRegW, ClusterExchange>()
                     : kernel_instance<scalar_t, kBackward, 2, kMma, kRegW, GridExchange>();
    default:
      return cluster ? kernel_instance<scalar_t, kBackward, 1, kMma, kRegW, ClusterExchange>()
                     : kernel_instance<scalar_t, kBackward, 1, kMma, kRegW, GridExchange>();
  }
}

// The instantiation for a path, NB batch rows per thread group and the dot
// (double has no MMA kernels; the MMA dot keeps W_h in shared memory, and
// so does every dtype but float: seq_plan.h's kRegChunks).
template <typename scalar_t, bool kBackward>
auto kernel_for(SeqPath path, int per_thread, bool mma, bool w_regs) {
  if constexpr (!std::is_same_v<scalar_t, double>) {
    if (mma) return kernel_for_dot<scalar_t, kBackward, true, false>(path, per_thread);
  }
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (w_regs) return kernel_for_dot<scalar_t, kBackward, false, true>(path, per_thread);
  }
  return kernel_for_dot<scalar_t, kBackward, false, false>(path, per_thread);
}

// The virtual architecture the running device's code of `kernel` was
// compiled for (ptxVersion: 90 for a body built for sm_90 or JIT-compiled
// from compute_90 PTX, 80 for compute_80 PTX run on a newer GPU), 0 when
// the build has no code for this device. Asked once per kernel and device.
int code_arch(const void* kernel, int device) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(kernel, device);
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  cudaFuncAttributes attr{};
  int arch = 0;
  if (cudaFuncGetAttributes(&attr, kernel) == cudaSuccess) {
    arch = attr.ptxVersion;
  } else {
    (void)cudaGetLastError();
  }
  cache.emplace(key, arch);
  return arch;
}

// The launch configuration of a split (`attr` holds its cluster shape or
// the cooperative flag).
cudaLaunchConfig_t launch_config(SeqPath path, const Split& split, cudaStream_t stream,
                                 cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid_size(int64_t(split.group) * split.per_wave));
  config.blockDim = dim3(split.threads);
  config.dynamicSmemBytes = split.smem;
  config.stream = stream;
  if (path == SeqPath::kCluster) {
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = split.group;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
  } else {
    // Co-residency of every CTA: a group spins on its arrival counter.
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
  }
  config.attrs = &attr;
  config.numAttrs = 1;
  return config;
}

// How many batch chunks of this launch shape run at once on the device (0:
// none); asked once per kernel, device and shape.
template <typename Params>
int resident_chunks(Kernel<Params> kernel, SeqPath path, const Split& split, int device, size_t smem_limit,
                    int sms) {
  using Key = std::tuple<const void*, int, int, unsigned, size_t>;
  static std::mutex mutex;
  static std::map<Key, int> cache;
  const Key key{reinterpret_cast<const void*>(kernel), device, split.group,
                static_cast<unsigned>(split.threads), split.smem};
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  int chunks = 0;
  // The dynamic shared memory limit is raised to the device's maximum once,
  // so every split of this kernel can launch.
  bool ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(smem_limit)) == cudaSuccess;
  if (ok && path == SeqPath::kCluster) {
    ok = split.group <= 8 ||
         cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
    Split one = split;  // the shape of one cluster
    one.per_wave = 1;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config = launch_config(path, one, nullptr, attr);
    ok = ok && cudaOccupancyMaxActiveClusters(&chunks, kernel, &config) == cudaSuccess;
  } else if (ok) {
    int per_sm = 0;
    ok = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, split.threads, split.smem) ==
         cudaSuccess;
    chunks = per_sm * sms / split.group;
  }
  if (!ok) {
    (void)cudaGetLastError();
    chunks = 0;
  }
  cache.emplace(key, chunks);
  return chunks;
}

// The planner's view of the device and of this build's code for it.
template <typename scalar_t, bool kBackward>
DeviceLimits device_limits(int device) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device);
  DeviceLimits d;
  d.sms = prop->multiProcessorCount;
  d.smem_per_block = prop->sharedMemPerBlockOptin;
  int khz = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device) == cudaSuccess && khz > 0) {
    d.clock_ghz = khz * 1e-6;
  } else {
    (void)cudaGetLastError();
  }
  auto arch = [&](SeqPath path, bool mma) {
    return code_arch(reinterpret_cast<const void*>(kernel_for<scalar_t, kBackward>(path, 1, mma, false)),
                     device);
  };
  d.cluster_kernels = prop->major >= 9 && arch(SeqPath::kCluster, false) >= 90;
  d.grid_kernels = prop->cooperativeLaunch != 0 && arch(SeqPath::kGrid, false) > 0;
  d.mma_kernels = !std::is_same_v<scalar_t, double> && prop->major >= 8 && arch(SeqPath::kGrid, true) >= 80;
  return d;
}

// The decision for one problem on one device, made once per problem and
// setting (the environment's overrides and the TF32 switch are in the key).
template <typename scalar_t, bool kBackward>
const Decision& decide(const Problem& problem, int device) {
  using Key = std::tuple<int64_t, int64_t, int64_t, int, bool, std::string>;
  static std::mutex mutex;
  static std::map<Key, Decision> cache;
  std::string env;
  for (const char* name : {"LLTM_SEQ_PATH", "LLTM_SEQ_CLUSTER", "LLTM_SEQ_GROUP", "LLTM_SEQ_DOT"}) {
    const char* v = std::getenv(name);
    env += std::string(v == nullptr ? "" : v) + ";";
  }
  const Key key{problem.steps, problem.batch, problem.state, device, problem.tensor_cores, env};
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto found = cache.find(key);
    if (found != cache.end()) return found->second;
  }
  const DeviceLimits limits = device_limits<scalar_t, kBackward>(device);
  const ResidentChunks resident = [&](SeqPath path, const Split& split) {
    return resident_chunks(kernel_for<scalar_t, kBackward>(path, split.per_thread, split.mma, split.w_regs),
                           path, split, device, limits.smem_per_block, limits.sms);
  };
  Decision decision = plan_time_loop(problem, limits, resident);
  const std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() > 4096) cache.clear();  // many distinct shapes: start over
  return cache.emplace(key, std::move(decision)).first->second;
}

template <typename scalar_t>
Problem problem_of(bool backward, int64_t steps, int64_t batch, int64_t state) {
  Problem p;
  p.backward = backward;
  p.steps = steps;
  p.batch = batch;
  p.state = state;
  p.elem = sizeof(scalar_t);
  p.is_double = std::is_same_v<scalar_t, double>;
  p.tensor_cores =
      sizeof(scalar_t) == 2 || (std::is_same_v<scalar_t, float> && at::globalContext().allowTF32CuBLAS());
  return p;
}

// Launches the persistent kernel of the decided plan; false when the plan is
// the step loop.
template <typename scalar_t, bool kBackward, typename Params>
bool launch(const Params& base, const at::Tensor& like) {
  const int device = like.get_device();
  const Problem problem = problem_of<scalar_t>(kBackward, base.steps, base.batch, base.state);
  const Plan& plan = decide<scalar_t, kBackward>(problem, device).chosen;
  if (plan.path == SeqPath::kLoop) return false;
  const Split& split = plan.split;
  Params params = base;
  params.group = split.group;
  params.units = split.units;
  params.rows = split.rows;
  params.rows_padded = split.rows_padded;
  params.ks = split.ks;
  params.row = split.row;
  params.mtiles = split.mtiles;
  params.ksplit = split.ksplit;
  params.w_rows = split.w_rows;
  at::Tensor exchange, arrivals;
  if (plan.path == SeqPath::kGrid) {
    // Zeroed: padding past S is read as 0, and the counters start at 0.
    const int64_t rows_per = kBackward ? 3 : 1;
    exchange = at::zeros({2, rows_per * base.batch, split.row}, like.options());
    arrivals = at::zeros({split.chunks}, like.options().dtype(at::kInt));
    params.exchange = exchange.mutable_data_ptr<scalar_t>();
    params.arrivals = reinterpret_cast<unsigned*>(arrivals.mutable_data_ptr<int>());
  }
  const Kernel<Params> kernel =
      kernel_for<scalar_t, kBackward>(plan.path, split.per_thread, split.mma, split.w_regs);
  // One launch per wave of chunks, in turn on the stream (chunks are
  // independent; every CTA of a launch is resident at once).
  for (int64_t chunk0 = 0; chunk0 < split.chunks; chunk0 += split.per_wave) {
    Split wave = split;
    wave.per_wave = static_cast<int>(std::min<int64_t>(split.per_wave, split.chunks - chunk0));
    params.chunk0 = chunk0;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config = launch_config(plan.path, wave, c10::cuda::getCurrentCUDAStream(), attr);
    C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, params));
  }
  return true;
}

}  // namespace

bool seq_forward_persistent(const at::Tensor& gates, const RowMajor& w, const at::Tensor& bias,
                            const RowMajor& h0, const RowMajor& c0, const at::Tensor& lengths,
                            const at::Tensor& output, const at::Tensor& h_n, const at::Tensor& c_n) {
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
        launched = launch<scalar_t, false>(p, gates);
      });
  return launched;
}

bool seq_backward_persistent(const at::Tensor& grad_output, const at::Tensor& grad_h_n,
                             const at::Tensor& grad_c_n, const RowMajor& w, const at::Tensor& cells,
                             const at::Tensor& gates, const at::Tensor& lengths, const at::Tensor& d_pre,
                             const at::Tensor& grad_h0, const at::Tensor& grad_c0) {
  const int64_t steps = cells.size(0), batch = cells.size(1), state = cells.size(2);
  bool launched = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, cells.scalar_type(), "lltm_seq_backward_persistent", [&] {
        auto ptr = [](const at::Tensor& t) { return t.defined() ? t.const_data_ptr<scalar_t>() : nullptr; };
        auto mut = [](const at::Tensor& t) { return t.defined() ? t.mutable_data_ptr<scalar_t>() : nullptr; };
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
        launched = launch<scalar_t, true>(p, cells);
      });
  return launched;
}

}  // namespace cuda_detail

std::string fused_cuda_seq_plan(bool backward, int64_t steps, int64_t batch, int64_t state,
                                c10::ScalarType dtype, int64_t device) {
  using namespace cuda_detail;
  TORCH_CHECK(steps >= 0 && batch >= 0 && state >= 1,
              "lltm::_fused_cuda_seq_plan: expected steps >= 0, "
              "batch >= 0 and state >= 1, got ",
              steps, ", ", batch, ", ", state);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  std::string report;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "lltm_fused_cuda_seq_plan", [&] {
    const Problem problem = problem_of<scalar_t>(backward, steps, batch, state);
    const Decision& decision = backward ? decide<scalar_t, true>(problem, static_cast<int>(device))
                                        : decide<scalar_t, false>(problem, static_cast<int>(device));
    report = describe(problem, decision);
  });
  return report;
}

}  // namespace lltm
