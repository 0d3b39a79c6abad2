// How a persistent kernel's CTAs share the exchanged rows of a step (h_t
// forward, dzh_t backward): the cluster policy (DSMEM, st.async onto the
// receivers' mbarriers, sm_90+), the grid policy (L2 and one arrival
// counter per group) and the grid policy in clusters that share each reload
// (multicast, sm_90). seq_persistent.cu has the overview.
#pragma once

#include <cstdint>

#include "persistent_params.cuh"
#include "ptx_sync.cuh"

namespace lltm {
namespace cuda_detail {

// ------------------------------------------------------- exchange policies
//
// Each holds the exchanged rows of one step, a matrix of R * rows_padded
// rows of `row` elements (R = 1: h_t; R = G: the step's dzh, gate-major:
// row i * rows_padded + b is batch row b of gate i).
//   view(parity)  what this CTA's dot products read
//   put(...)      element (i, b, j) of this CTA's slice (gate i, batch row b,
//                 column j), written by the one lane of its group that is `mine`
//   arrive(p)     after the puts (every thread calls it): publishes them;
//                 the step's global stores follow it (the forward's after
//                 the wait, the grid backward's after the dot:
//                 persistent_kernels.cuh)
//   wait(p, n)    every CTA's puts of exchange n (parity p) are in view(p)

template <typename T>
struct ClusterExchange {
  static constexpr bool kClusters = true;     // launched in clusters: sm_90 code only
  static constexpr bool kClusterOnly = true;  // a cluster is the whole group (no grid-wide exchange)
  // One store of the slice to another CTA, at parity 0: the source word(s)
  // in this CTA, the destination and the destination's mbarrier.
  struct Send {
    uint32_t src, dst, bar;
  };

  T* local;          // [2][R][Bp][row]: both parities, in this CTA
  int parity_elems;  // R Bp row
  int row;           // elements per exchanged row (padded)
  int bp, bn;        // rows per gate block (padded), of which this chunk's
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

  // This CTA's copy of the step: one lane of the group (`mine`) writes it
  // locally; arrive() sends the whole slice on.
  __device__ void put(int parity, int i, int b, int j, T v, bool mine) const {
    if (mine) view(parity)[(i * bp + b) * row + j] = v;
  }

  __device__ Send send_of(int e) const {
    const int other = e / items, item = e - other * items;
    const int d = other + (other >= rank);  // every CTA but this one
    const int r = item / per_row;           // the chunk's r-th exchanged row: gate r / bn, batch row r % bn
    const int i = r / bn;
    const uint32_t src = src0 + (i * bp + r - i * bn) * row_bytes + (item - r * per_row) * chunk;
    return {src, cluster_address(src, d), cluster_address(bars, d)};
  }

  __device__ void send(const Send& x, int parity) const {
    const uint32_t src = x.src + parity * parity_bytes, dst = x.dst + parity * parity_bytes;
    const uint32_t bar = x.bar + 8 * parity;
    if (chunk == 16) {
      store_to_peer16(src, dst, bar);
    } else {
      store_to_peer4(src, dst, bar);
    }
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
    mbarrier_wait(bar, phase);
    if (threadIdx.x == 0) arm(bar);
#endif
  }

  __device__ void arm(uint32_t bar) const { mbarrier_expect(bar, expected); }

  // The mbarriers are set up and armed, and every CTA of the cluster runs,
  // before any CTA stores into another's shared memory.
  __device__ void start() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
      for (int q = 0; q < 2; ++q) {
        mbarrier_init(bars + 8 * q);
      }
      // The initialisation is complete before any use, this thread's arming included.
      mbarrier_init_fence();
    }
    // Orders nothing thread 0's program order does not; racecheck counts the
    // initialisation as a write of the whole warp and, without this,
    // reports every arm as a warp-level hazard.
    __syncwarp();
    if (threadIdx.x == 0) {
      for (int q = 0; q < 2; ++q) arm(bars + 8 * q);
    }
    cluster_barrier();
#endif
  }

  template <typename Params>
  __device__ static ClusterExchange make(const Params& p, const Slice& s, T* buffer, int rows_per,
                                         unsigned char* header) {
    ClusterExchange ex;
    ex.local = buffer;
    ex.parity_elems = rows_per * p.rows_padded * p.row;
    ex.row = p.row;
    ex.bp = p.rows_padded;
    ex.bn = s.bn;
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
  static constexpr bool kClusters = false;
  static constexpr bool kClusterOnly = false;
  T* local;              // [R][Bp][row] in this CTA
  T* global;             // [2][R][B][row]
  unsigned* arrivals;    // this chunk's counter
  int64_t parity_elems;  // R B row
  int64_t gate_elems;    // B row: one gate's block
  int64_t first;         // b0 row: this chunk's first row in a block
  int rows_per;          // R
  int bp, bn;            // batch rows per local block (padded), of which this chunk's
  int row;               // elements per exchanged row (padded)
  int group;
  uint32_t bar;  // sm_90: shared address of the reload's first mbarrier (the header's first)
  int bars;      // its mbarriers: one per gate block, the last kReloadBars - 1 and up sharing one

  __device__ T* view(int /*parity*/) const { return local; }
  // The mbarrier of gate block i, and the gate blocks mbarrier q waits for.
  __device__ uint32_t bar_of(int i) const { return bar + 8 * min(i, bars - 1); }
  __device__ int blocks_of(int q) const { return q == bars - 1 ? rows_per - q : 1; }

  // The thread that arrives, polls the counter and issues the reload: the
  // CTA's last, which the splits leave without batch rows where threads
  // are left over (and else holds the last rows), so the step's global
  // stores and next loads, which follow the arrival in every working
  // thread, do not delay its poll. The counter is mostly complete at the
  // first poll: the poll's start is on the step's critical path.
  __device__ static bool leader() { return threadIdx.x == blockDim.x - 1; }

  __device__ void put(int parity, int i, int b, int j, T v, bool mine) const {
    if (mine) global[parity * parity_elems + i * gate_elems + first + b * row + j] = v;
  }
  // The CTA's puts, then one arrival: a release at GPU scope orders the
  // CTA's puts (which the barrier put before it) before the count.
  __device__ void arrive(int /*parity*/) const {
    __syncthreads();
    if (leader()) release_add(arrivals);
  }
  // The n-th exchange of this launch is complete when the group has
  // arrived (n + 1) times (the leader waits for the count); then the chunk's
  // rows of that parity are copied into shared memory from L2: reload()
  // starts the copy, wait_block(i, n) waits for gate block i, wait() does
  // both for every block.
  //   sm_90: each gate block (bn rows, contiguous in both places) is one
  //   bulk copy of the copy engine, issued by the leader, its bytes counted on
  //   the block's mbarrier (exchange n completes its phase n), so a dot can
  //   start on the first blocks while the last still travel.
  //   The proxy fences order the copy's global reads after the acquire and
  //   its shared-memory writes after the last step's reads (the barrier in
  //   arrive()). Against 16-byte copies from every thread: backward steps
  //   15% shorter at 98 KB a step (docs/benchmarks-history.md, section 18).
  //   sm_80: every thread issues its 16-byte copies at once (cp.async.cg:
  //   L2, not this SM's L1, which may hold an older copy) and waits for them
  //   once: one L2 round trip and the SM's share of L2 bandwidth.
  __device__ void reload(int parity, int64_t n) const {
    if (leader()) {
      const unsigned target = static_cast<unsigned>(n + 1) * static_cast<unsigned>(group);
      while (static_cast<int>(load_acquire(arrivals) - target) < 0) {
      }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      bulk_copy(parity);
#endif
    }
#if !(defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
    copy_rows(parity);
#endif
  }
  // sm_90: the leader's bulk copy of every gate block, each onto its mbarrier.
  __device__ void bulk_copy(int parity) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t block = static_cast<uint32_t>(bn * row * sizeof(T));
    async_proxy_fence_global();
    async_proxy_fence_shared();
    arm(block);
    for (int i = 0; i < rows_per; ++i) {
      bulk_copy_to_shared(smem_address(local + int64_t(i) * bp * row),
                          global + parity * parity_elems + i * gate_elems + first, block, bar_of(i));
    }
#endif
  }
  // The leader's arrival on each mbarrier, with the bytes of its blocks (sm_90).
  __device__ void arm(uint32_t block) const {
    for (int q = 0; q < bars; ++q) mbarrier_expect(bar + 8 * q, block * static_cast<uint32_t>(blocks_of(q)));
  }
  __device__ void wait_block(int i, int64_t n) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    mbarrier_wait(bar_of(i), static_cast<uint32_t>(n) & 1u);
#endif
  }
  __device__ void wait_reloaded(int64_t n) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    for (int q = 0; q < bars; ++q) mbarrier_wait(bar + 8 * q, static_cast<uint32_t>(n) & 1u);
#endif
  }
  __device__ void wait(int parity, int64_t n) const {
    reload(parity, n);
    wait_reloaded(n);
  }
  // sm_80: the copy of the rows, every thread's 16-byte copies.
  __device__ void copy_rows(int parity) const {
    __syncthreads();
    const int vectors = bn * row * static_cast<int>(sizeof(T)) / 16;  // per gate block
    for (int i = 0; i < rows_per; ++i) {
      const int4* src =
          reinterpret_cast<const int4*>(global + parity * parity_elems + i * gate_elems + first);
      int4* dst = reinterpret_cast<int4*>(local + int64_t(i) * bp * row);
      for (int e = threadIdx.x; e < vectors; e += blockDim.x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_address(dst + e)), "l"(src + e)
                     : "memory");
#else
        dst[e] = __ldcg(src + e);
#endif
      }
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
    __syncthreads();
  }

  // Thread 0 sets up the reload's mbarriers (sm_90).
  __device__ void init_bars() const {
    if (threadIdx.x == 0) {
      for (int q = 0; q < bars; ++q) mbarrier_init(bar + 8 * q);
    }
  }
  __device__ void start() const {
    init_bars();
    __syncthreads();
  }

  template <typename Params>
  __device__ static GridExchange make(const Params& p, const Slice& s, T* buffer, int rows_per,
                                      unsigned char* header) {
    return {buffer,
            p.exchange,
            p.arrivals + s.chunk,
            rows_per * p.batch * p.row,
            p.batch * p.row,
            s.b0 * p.row,
            rows_per,
            p.rows_padded,
            s.bn,
            p.row,
            p.group,
            smem_address(header),
            min(rows_per, kReloadBars)};
  }
};

// The grid exchange in clusters of `multicast` CTAs of a group that share
// each reload (sm_90; the grid path's MMA kernels, where the planner asks
// for it: seq_plan.cpp's grid_multicast). The cluster's first CTA polls the
// counter and issues one multicast bulk copy per gate block into every CTA
// of the cluster (the same offsets, each CTA's own mbarrier), so L2 serves
// each chunk's rows once a cluster instead of once a CTA. Kernels of their
// own, not a flag of GridExchange: the flag's branches and the copy's code
// cost the plain kernels up to 9% of a step (docs/benchmarks-history.md,
// section 23).
template <typename T>
struct MulticastExchange : GridExchange<T> {
  using Base = GridExchange<T>;
  static constexpr bool kClusters = true;
  int multicast;  // CTAs of a cluster, a divisor of the group (a cluster is in one group)
  bool issues;    // rank 0 of its cluster: polls and copies for the cluster

  // As GridExchange's, with a proxy fence before the count: the copy
  // engine of another CTA writes this CTA's rows next, and the fence orders
  // this CTA's reads of them (the barrier) before those writes, which the
  // count's release and the issuer's acquire then order after them.
  //
  // Every thread also arrives on the cluster barrier, which the issuer's
  // threads wait on before the copy (wait()). It orders nothing the count
  // does not, but the count orders through global memory, which
  // compute-sanitizer's racecheck does not follow, and the barrier it does:
  // racecheck then sees the peers' reads of the rows end before the copy
  // overwrites them. Relaxed, it costs nothing measurable; with release
  // semantics the step's puts waited on it (3-5% at FlashRNN's point,
  // docs/benchmarks-history.md, section 25).
  __device__ void arrive(int /*parity*/) const {
    __syncthreads();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#endif
    if (Base::leader()) {
      async_proxy_fence_shared();
      release_add(this->arrivals);
    }
  }
  // Every CTA's leader arms its own mbarriers for the step's bytes; the
  // issuer's leader polls and copies into the whole cluster (each gate
  // block onto the same mbarrier of every CTA). A copy that lands before a
  // CTA arms its mbarrier leaves the phase open: the phase waits for that
  // arrival too. wait_block / wait_reloaded / wait: GridExchange's.
  __device__ void reload(int parity, int64_t n) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");  // the cluster's arrive()
    if (Base::leader()) {
      const uint32_t block = static_cast<uint32_t>(this->bn * this->row * sizeof(T));
      if (issues) {
        const unsigned target = static_cast<unsigned>(n + 1) * static_cast<unsigned>(this->group);
        while (static_cast<int>(load_acquire(this->arrivals) - target) < 0) {
        }
        async_proxy_fence_global();
        async_proxy_fence_shared();
      }
      this->arm(block);
      if (issues) {
        const uint16_t everyone = static_cast<uint16_t>((1u << multicast) - 1u);
        for (int i = 0; i < this->rows_per; ++i) {
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
              "[%1], "
              "%2, [%3], %4;\n" ::"r"(smem_address(this->local + int64_t(i) * this->bp * this->row)),
              "l"(this->global + parity * this->parity_elems + i * this->gate_elems + this->first),
              "r"(block), "r"(this->bar_of(i)), "h"(everyone)
              : "memory");
        }
      }
    }
#endif
  }
  __device__ void wait(int parity, int64_t n) const {
    reload(parity, n);
    this->wait_reloaded(n);
  }

  // Every CTA's mbarriers are set up, and visible to the copy engine, before
  // the cluster's first CTA can copy into them.
  __device__ void start() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    this->init_bars();
    if (threadIdx.x == 0) mbarrier_init_fence();
    cluster_barrier();
#endif
  }

  template <typename Params>
  __device__ static MulticastExchange make(const Params& p, const Slice& s, T* buffer, int rows_per,
                                           unsigned char* header) {
    MulticastExchange ex;
    static_cast<Base&>(ex) = Base::make(p, s, buffer, rows_per, header);
    ex.multicast = p.multicast;
    ex.issues = s.rank % p.multicast == 0;
    return ex;
  }
};

}  // namespace cuda_detail
}  // namespace lltm
