// What one step of the grid exchange costs without the step's work, and what
// other protocols would cost: G CTAs (one an SM), each owning 768 / G columns
// of a 16 x 776 fp16 matrix in L2 (h_t at FlashRNN's point, B = 16, S = 768,
// rows padded as the kernels pad them; the kernels' chunks there reload 8 rows
// each), publish their slice and reload the whole matrix into shared memory
// every step, as lltm/csrc/cuda/persistent_exchange.cuh's GridExchange does
// (sm_90).
//
//   nvcc -arch=sm_90 -O3 -std=c++17 -o /tmp/grid_exchange_probe scripts/grid_exchange_probe.cu
//   /tmp/grid_exchange_probe [tagged]
//
// Prints ns per step (CTA 0's global timer over the steps after the first
// 100) for each protocol, G = 64 and 128, with no work between exchanges and
// with ~1,700 cycles of it (a step's dot and cell math at that point), and
// for the kernels' protocol the leader's cycles in its release, its poll and
// its wait for the copy. Every reload is checked (a sample of each step's
// elements against the value its producer wrote). Last, the same exchange
// inside clusters of 8 and 16 CTAs through DSMEM, 8 and 16 rows, one or two
// clusters: the cluster path's protocol (16-byte st.async into every other
// CTA), one bulk copy of the slice into each other CTA (completing on one
// mbarrier, or on an mbarrier a slice so that readers wait only for the
// slices they read next), and a cluster barrier followed by every thread
// loading from the others. Then a whole LLTM forward step at FlashRNN's point
// in 16-CTA clusters (step_probe: W_hh's products from held and staged A
// fragments, the cell, each exchange), its cycles split into products, cell
// and exchange, step 0's gate sums checked. Last, tagged words in L2 (each
// 8-byte word two or three fp16 columns and the step) reloaded by one bulk
// copy that every thread validates, repeated until every tag is the step's:
// no counter, no release fence, the copy engine as the poll (run alone:
// `grid_exchange_probe tagged`). Results and what they decided:
// docs/benchmarks-history.md, sections 50 to 52 and 63.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

// The kernels' own PTX (acquire and release, mbarriers, bulk copies, DSMEM
// stores), so the probe times the instructions the exchange runs.
#include "../lltm/csrc/cuda/ptx_sync.cuh"
#include "probe_common.cuh"

namespace {

using namespace lltm::cuda_detail;
using namespace lltm_probe;

constexpr int kRows = 16, kRow = 776, kCols = 768, kThreads = 256;
constexpr int kBlockBytes = kRows * kRow * 2;  // the whole matrix, padding columns included
constexpr int kColsBytes = kRows * kCols * 2;  // without them (the band copies' total)
constexpr int kCounterStride = 32;             // words between band counters: one 128-byte line each

enum Protocol {
  kBarrierOnly,      // arrival counter, one poller, no copy: the grid barrier alone
  kCounterCopy,      // the kernels': counter, the leader polls, one bulk copy of the matrix
  kStaggered,        // counter, `pollers` threads poll `stagger` ns apart; the first to see it copies
  kSeparateRelease,  // counter, another thread releases, so the leader's poll starts at once
  kFlags,            // a flag per producer (st.release), one warp polls them all, one copy
  kFlagBands,        // flags; each band of producers' columns copied as soon as its flags are in
  kCounterBands,     // a counter per band of producers; each band copied as soon as its count is in
};

struct Args {
  uint16_t* x;                // [2][kRows][kRow]: both parities
  unsigned* counters;         // [bands][kCounterStride]
  unsigned* flags;            // [G]
  unsigned* errors;           // elements whose reload was wrong
  unsigned long long* times;  // CTA 0's timer after step 100 and at the end
  long long* leader_cycles;   // kCounterCopy: release, poll, copy wait (sums)
  int steps, work, pollers, stagger, bands, relaxed;
  int rows;  // cluster_probe: the rows exchanged (kRows at most)
  int mode;  // cluster_probe: a ClusterMode
};

// How cluster_probe moves each CTA's columns into the other CTAs.
enum ClusterMode {
  kPushStores,  // ClusterExchange's: st.async of 16 bytes into every other CTA, rows laid out whole
  kPushBulk,    // one bulk copy (the copy engine) of the slice into each other CTA, slices laid end to end
  kPull,        // a cluster barrier, then every thread loads 16-byte pieces of the others' slices
  kBulkSlices,  // kPushBulk with an mbarrier per slice: a reader waits only for the slices it reads next
};

// The slice modes pad each row of a CTA's slice by kSlicePad columns, so that
// the 8 rows of an MMA's B fragment fall into distinct shared-memory banks.
constexpr int kSlicePad = 8;
// One parity's buffer of exchanged rows: the rows laid out whole, or 16 CTAs'
// padded slices laid end to end (the larger).
constexpr int kBufHalves = kRows * (kCols + 16 * kSlicePad);
constexpr int kHeader = 512;  // mbarriers: [parity][16 slices] (kBulkSlices) or [parity]

// Whether *p has reached target: an acquire load, or (relaxed) a relaxed load
// and, once it has, an acquire fence.
__device__ __forceinline__ bool reached(const unsigned* p, unsigned target, bool relaxed) {
  if (!relaxed) return static_cast<int>(load_acquire(p) - target) >= 0;
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  if (static_cast<int>(v - target) < 0) return false;
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
  return true;
}

// The mbarrier's one arrival of a phase, expecting `bytes` from copies that
// overwrite what this CTA read before its last barrier.
__device__ __forceinline__ void arm(uint32_t bar, uint32_t bytes) {
  async_proxy_fence_shared();
  mbarrier_expect(bar, bytes);
}

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint32_t bar) {
  bulk_copy_to_shared(smem_address(dst), src, bytes, bar);
}

// Each band's columns, row by row (bulk copies are contiguous), onto `bar`.
__device__ void copy_band(uint16_t* local, const uint16_t* x, int band, int band_cols, uint32_t bar) {
  async_proxy_fence_global();
  for (int r = 0; r < kRows; ++r) {
    const int at = r * kRow + band * band_cols;
    bulk_copy(local + at, x + at, band_cols * 2, bar);
  }
}

template <Protocol P>
__global__ void __launch_bounds__(kThreads, 1) probe(Args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  int* claimed = reinterpret_cast<int*>(smem + 8);  // kStaggered: the last step whose copy was issued
  uint16_t* local = reinterpret_cast<uint16_t*>(smem + 128);
  const uint32_t bar = smem_address(smem);
  const int G = gridDim.x, cta = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int units = kCols / G, per_band = G / a.bands, band_cols = per_band * units;
  const bool leader = tid == kThreads - 1, last_warp = warp == kThreads / 32 - 1;
  if (tid == 0) {
    mbarrier_init(bar);
    *claimed = -1;
  }
  __syncthreads();
  unsigned errors = 0;
  long long cycles[3] = {};
  for (int n = 0; n < a.steps; ++n) {
    if (a.work > 0) {  // the step's work, a little longer in some CTAs
      const long long t0 = clock64();
      while (clock64() - t0 < a.work + cta * 37 % 200) {
      }
    }
    if (n == 100 && cta == 0 && tid == 0) a.times[0] = timer_ns();
    uint16_t* x = a.x + (n & 1) * kRows * kRow;
    if (tid < kRows * units)
      x[tid / units * kRow + cta * units + tid % units] = uint16_t(n * 7 + cta + tid / units);
    __syncthreads();
    const long long c0 = clock64();
    const unsigned target = unsigned(n + 1) * unsigned(G);
    const uint32_t phase = n & 1;
    if constexpr (P == kFlags || P == kFlagBands) {
      if (leader)
        asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(a.flags + cta), "r"(n + 1) : "memory");
    } else if constexpr (P == kCounterBands) {
      if (leader) release_add(a.counters + cta / per_band * kCounterStride);
    } else if constexpr (P == kSeparateRelease) {
      if (tid == kThreads - 33) release_add(a.counters);
    } else {
      if (leader) release_add(a.counters);
    }

    if constexpr (P == kBarrierOnly) {
      if (leader) {
        while (!reached(a.counters, target, a.relaxed)) {
        }
      }
      __syncthreads();
    } else if constexpr (P == kCounterCopy || P == kSeparateRelease) {
      if (leader) {
        const long long c1 = clock64();
        while (!reached(a.counters, target, a.relaxed)) {
        }
        const long long c2 = clock64();
        async_proxy_fence_global();
        arm(bar, kBlockBytes);
        bulk_copy(local, x, kBlockBytes, bar);
        if (n >= 100) cycles[0] += c1 - c0, cycles[1] += c2 - c1;
      }
      const long long c3 = clock64();
      mbarrier_wait(bar, phase);
      if (leader && n >= 100) cycles[2] += clock64() - c3;
    } else if constexpr (P == kStaggered) {
      const int k = kThreads / 32 - 1 - warp;  // poller k: lane 31 of the k-th warp from the last
      if (lane == 31 && k < a.pollers) {
        if (k > 0) __nanosleep(k * a.stagger);
        const volatile int* done = claimed;
        while (*done < n) {
          if (reached(a.counters, target, a.relaxed)) {
            if (atomicMax(claimed, n) < n) {
              async_proxy_fence_global();
              arm(bar, kBlockBytes);
              bulk_copy(local, x, kBlockBytes, bar);
            }
            break;
          }
        }
      }
      mbarrier_wait(bar, phase);
    } else if constexpr (P == kFlags || P == kFlagBands) {
      if (last_warp) {  // lane l polls producers l and l + 32 (G <= 64)
        if (lane == 31) arm(bar, P == kFlags ? kBlockBytes : kColsBytes);
        bool in0 = lane >= G, in1 = lane + 32 >= G;
        unsigned issued = 0;
        const unsigned all = (1u << a.bands) - 1;
        while (issued != all) {
          if (!in0) in0 = reached(a.flags + lane, n + 1, a.relaxed);
          if (!in1) in1 = reached(a.flags + lane + 32, n + 1, a.relaxed);
          const unsigned long long in =
              __ballot_sync(~0u, in0) | static_cast<unsigned long long>(__ballot_sync(~0u, in1)) << 32;
          for (int band = 0; band < a.bands; ++band) {
            const unsigned long long need = (per_band == 64 ? ~0ull : (1ull << per_band) - 1)
                                            << (band * per_band);
            if ((issued >> band & 1u) || (in & need) != need) continue;
            issued |= 1u << band;
            if (lane != 31) continue;
            if (P == kFlags) {
              async_proxy_fence_global();
              bulk_copy(local, x, kBlockBytes, bar);
            } else {
              copy_band(local, x, band, band_cols, bar);
            }
          }
        }
      }
      mbarrier_wait(bar, phase);
    } else if constexpr (P == kCounterBands) {
      if (last_warp) {  // lane b polls band b's counter and copies the band
        if (lane == 31) arm(bar, kColsBytes);
        __syncwarp();
        bool in = lane >= a.bands;
        while (!__all_sync(~0u, in)) {
          if (!in && reached(a.counters + lane * kCounterStride, unsigned(n + 1) * per_band, a.relaxed)) {
            in = true;
            copy_band(local, x, lane, band_cols, bar);
          }
        }
      }
      mbarrier_wait(bar, phase);
    }
    if constexpr (P != kBarrierOnly) {  // a sample of the reload against what its producers wrote
      for (int e = tid; e < kRows * kCols; e += kThreads * 7) {
        const int r = e / kCols, col = e % kCols;
        if (local[r * kRow + col] != uint16_t(n * 7 + col / units + r)) ++errors;
      }
    }
    __syncthreads();  // every read of `local` before the next copy
  }
  if (cta == 0 && tid == 0) a.times[1] = timer_ns();
  if (errors) atomicAdd(a.errors, errors);
  if (cta == 0 && leader) {
    for (int i = 0; i < 3; ++i) a.leader_cycles[i] = cycles[i];
  }
}

// DSMEM operations only the probe uses (sm_90): a bulk copy of `bytes` from
// this CTA's shared memory into another CTA's (cluster address `dst`), its
// bytes completing on the mbarrier at cluster address `bar`; a 16-byte load
// from another CTA's shared memory.
__device__ __forceinline__ void bulk_copy_to_peer(uint32_t dst, uint32_t src, uint32_t bytes, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          dst),
      "r"(src), "r"(bytes), "r"(bar)
      : "memory");
#endif
}
__device__ __forceinline__ uint4 load_from_peer16(uint32_t src) {
  uint4 v = {};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(src)
               : "memory");
#endif
  return v;
}

// Where element (row r, column col) of the exchanged rows lies in a CTA's
// buffer: kPushStores lays rows out whole ([rows][kRow]); the other modes lay
// the CTAs' slices end to end ([ctas][rows][units + kSlicePad]), so that a
// slice is one contiguous block.
struct ClusterLayout {
  int mode, rank, ctas, rows, units;
  __device__ int stride() const { return units + kSlicePad; }
  __device__ int slice() const { return rows * stride(); }
  __device__ int at(int r, int col) const {
    return mode == kPushStores ? r * kRow + col : col / units * slice() + r * stride() + col % units;
  }
  // bytes from one other CTA an exchange: kPushStores sends its columns alone, the others the padded slice
  __device__ uint32_t bytes_sent() const { return (mode == kPushStores ? rows * units : slice()) * 2; }
  // bytes into this CTA an exchange: into each slice's mbarrier (kBulkSlices) or into its one mbarrier
  __device__ uint32_t bytes_in() const { return (mode == kBulkSlices ? 1 : ctas - 1) * bytes_sent(); }
  // mbarriers a parity: one a slice (kBulkSlices; this CTA's own is never armed) or one
  __device__ int bars() const { return mode == kBulkSlices ? ctas : 1; }
  // the first mbarrier of parity p, of the two parities' laid out from `bars`
  __device__ uint32_t parity_bars(uint32_t bars, int p) const { return bars + 8 * this->bars() * p; }
};

__device__ ClusterLayout cluster_layout(int mode, int rows) {
  unsigned rank, ctas;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(ctas));
  return {mode, static_cast<int>(rank), static_cast<int>(ctas), rows, kCols / static_cast<int>(ctas)};
}

// Thread 0 sets up and arms both parities' mbarriers at `bars`; then the
// cluster meets, so no CTA sends before every mbarrier is ready.
__device__ void cluster_start(const ClusterLayout& L, uint32_t bars) {
  const int count = 2 * L.bars();
  if (threadIdx.x == 0) {
    for (int q = 0; q < count; ++q) mbarrier_init(bars + 8 * q);
    mbarrier_init_fence();
  }
  __syncwarp();
  if (threadIdx.x == 0) {
    for (int q = 0; q < count; ++q) {
      if (L.mode != kBulkSlices || q % L.ctas != L.rank) mbarrier_expect(bars + 8 * q, L.bytes_in());
    }
  }
  cluster_barrier();
}

// kBulkSlices: waits until slice j of this parity's buffer has landed.
__device__ __forceinline__ void wait_slice(uint32_t bars, int j, int phase) {
  mbarrier_wait(bars + 8 * j, phase);
}

// kBulkSlices, once every thread that reads this parity's slices has waited
// for them: their mbarriers armed for the parity's next exchange.
__device__ __forceinline__ void rearm_slices(const ClusterLayout& L, uint32_t bars, int phase) {
  const int j = threadIdx.x;
  if (j < L.ctas && j != L.rank) {
    wait_slice(bars, j, phase);  // complete already; this thread's own view of it
    mbarrier_expect(bars + 8 * j, L.bytes_in());
  }
}

// The cluster's exchange (sm_90): every thread has written this CTA's slice
// into `buffer` (L's layout) and nothing has synchronised since; returns when
// every other CTA's slice is in `buffer` too, except in kBulkSlices. The
// push modes complete on the mbarrier at `bar` (phase `phase`), which thread
// 0 then arms again.
//   kPushStores: ClusterExchange's, 16-byte st.async into every other CTA;
//   kPushBulk: one bulk copy (the copy engine) of the slice into each;
//   kPull: a cluster barrier, then every thread loads 16-byte pieces of the
//          others' slices;
//   kBulkSlices: kPushBulk's copies, each onto the mbarrier of its slice in
//          the peer (`bar` is the parity's first); returns once they are
//          issued: the readers wait for each slice (wait_slice), then re-arm.
// Nothing goes through L2; a cluster holds at most 16 CTAs (non-portable
// size), so W_hh must fit in them.
__device__ void cluster_exchange(const ClusterLayout& L, uint16_t* buffer, uint32_t bar, int phase) {
  const int tid = threadIdx.x, threads = blockDim.x, slice = L.slice(), chunks = L.units * 2 / 16;
  const int items = L.rows * chunks, others = L.ctas - 1;
  if (L.mode == kPushStores) {
    __syncthreads();
    for (int e = tid; e < items * others; e += threads) {
      const int other = e / items, item = e % items;
      const int peer = other + (other >= L.rank);  // every CTA but this one
      const uint32_t src =
          smem_address(buffer + item / chunks * kRow + L.rank * L.units) + item % chunks * 16;
      store_to_peer16(src, cluster_address(src, peer), cluster_address(bar, peer));
    }
  } else if (L.mode == kPushBulk || L.mode == kBulkSlices) {
    async_proxy_fence_shared();  // this thread's writes of the slice before the copy engine reads it
    __syncthreads();
    if (tid < others) {
      const int peer = tid + (tid >= L.rank);
      const uint32_t src = smem_address(buffer + L.rank * slice);
      const uint32_t done = L.mode == kBulkSlices ? bar + 8 * L.rank : bar;
      bulk_copy_to_peer(cluster_address(src, peer), src, slice * 2, cluster_address(done, peer));
    }
    if (L.mode == kBulkSlices) return;
  } else {
    cluster_barrier();                  // every slice of this buffer written and visible to the cluster
    const int pieces = slice * 2 / 16;  // a slice's 16-byte pieces, padding included
    for (int e = tid; e < pieces * others; e += threads) {
      const int other = e / pieces, item = e % pieces;
      const int peer = other + (other >= L.rank);
      const uint32_t at = smem_address(buffer + peer * slice) + item * 16;
      *reinterpret_cast<uint4*>(buffer + peer * slice + item * 8) =
          load_from_peer16(cluster_address(at, peer));
    }
    __syncthreads();
    return;
  }
  mbarrier_wait(bar, phase);
  if (tid == 0) mbarrier_expect(bar, L.bytes_in());
}

// The cluster's exchange alone, for comparison with the grid's: exchange n
// goes through buffer and mbarrier n % 2 (phase n / 2).
__global__ void __launch_bounds__(kThreads, 1) cluster_probe(Args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t bars = smem_address(smem);                       // parity 0's mbarriers, then parity 1's
  uint16_t* local = reinterpret_cast<uint16_t*>(smem + kHeader);  // [2][kBufHalves]
  const ClusterLayout L = cluster_layout(a.mode, a.rows);
  const int tid = threadIdx.x;
  cluster_start(L, bars);
  unsigned errors = 0;
  for (int n = 0; n < a.steps; ++n) {
    if (a.work > 0) {
      const long long t0 = clock64();
      while (clock64() - t0 < a.work + blockIdx.x * 37 % 200) {
      }
    }
    if (n == 100 && blockIdx.x == 0 && tid == 0) a.times[0] = timer_ns();
    const int p = n & 1, phase = (n >> 1) & 1;
    uint16_t* mine = local + p * kBufHalves;
    for (int e = tid; e < L.rows * L.units; e += kThreads) {
      const int r = e / L.units;
      mine[L.at(r, L.rank * L.units + e % L.units)] = uint16_t(n * 7 + L.rank + r);
    }
    cluster_exchange(L, mine, L.parity_bars(bars, p), phase);
    if (L.mode == kBulkSlices) {  // every slice, in turn
      for (int j = 0; j < L.ctas; ++j) {
        if (j != L.rank) wait_slice(L.parity_bars(bars, p), j, phase);
      }
      rearm_slices(L, L.parity_bars(bars, p), phase);
    }
    for (int e = tid; e < a.rows * kCols; e += kThreads * 7) {
      const int r = e / kCols, col = e % kCols;
      if (mine[L.at(r, col)] != uint16_t(n * 7 + col / L.units + r)) ++errors;
    }
    __syncthreads();  // every read of this parity before exchange n + 2 can land in it
  }
  if (blockIdx.x == 0 && tid == 0) a.times[1] = timer_ns();
  if (errors) atomicAdd(a.errors, errors);
  cluster_barrier();
}

// Tagged words with a validated copy (no counter, no release fence): every
// 8-byte word a producer stores (st.relaxed, single-copy atomic) holds `hpw`
// of its fp16 columns and the step's tag (32 bits beside 2 columns, 16 bits
// beside 3); a CTA's leader copies the parity's `rows` rows in one bulk copy
// as soon as the CTA's own words are stored (after `delay` ns), every thread
// checks the tags of its share of the copied words, and the CTA copies again
// until every tag is the step's. Then each thread unpacks its words into the
// rows' usual layout (what the dot would read) and checks a sample of them.
// No thread polls L2: the copy engine's reads are the poll.
struct TaggedArgs {
  unsigned long long* words;  // [2][kRows][kCols / hpw]
  unsigned* errors;
  unsigned long long* times;
  unsigned long long* attempts;  // copies over every CTA and step after the first 100
  long long* wait_cycles;        // CTA 0's leader: from its own put to the valid copy
  int steps, work, rows, hpw, delay;
};

__global__ void __launch_bounds__(kThreads, 1) tagged_probe(TaggedArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned long long* copied = reinterpret_cast<unsigned long long*>(smem + 128);  // [rows][W]
  const int W = kCols / a.hpw;                                                     // words a row
  uint16_t* local = reinterpret_cast<uint16_t*>(copied + kRows * (kCols / 2));     // [rows][kRow]
  const uint32_t bar = smem_address(smem);
  const int G = gridDim.x, cta = blockIdx.x, tid = threadIdx.x;
  const int units = kCols / G, wpc = units / a.hpw;  // columns and words a CTA a row
  const bool leader = tid == kThreads - 1;
  const uint32_t bytes = a.rows * W * 8;
  if (tid == 0) mbarrier_init(bar);
  __syncthreads();
  unsigned errors = 0, uses = 0;
  unsigned long long attempts = 0;
  long long waited = 0;
  for (int n = 0; n < a.steps; ++n) {
    if (a.work > 0) {
      const long long t0 = clock64();
      while (clock64() - t0 < a.work + cta * 37 % 200) {
      }
    }
    if (n == 100 && cta == 0 && tid == 0) a.times[0] = timer_ns();
    unsigned long long* x = a.words + (n & 1) * kRows * W;
    const unsigned long long tag = a.hpw == 2 ? unsigned(n) : unsigned(n) & 0xffffu;
    if (tid < a.rows * wpc) {  // this thread's word: hpw columns and the tag
      const int r = tid / wpc, w = cta * wpc + tid % wpc;
      unsigned long long v = tag << (16 * a.hpw);
      for (int h = 0; h < a.hpw; ++h) {
        const int col = w * a.hpw + h;
        v |= static_cast<unsigned long long>(uint16_t(n * 7 + col / units + r)) << (16 * h);
      }
      asm volatile("st.relaxed.gpu.global.u64 [%0], %1;\n" ::"l"(x + r * W + w), "l"(v) : "memory");
    }
    __syncthreads();
    const long long c0 = clock64();
    if (a.delay > 0 && leader) __nanosleep(a.delay);
    for (;;) {
      if (leader) {
        async_proxy_fence_global();
        arm(bar, bytes);
        bulk_copy(copied, x, bytes, bar);
      }
      mbarrier_wait(bar, uses & 1);
      ++uses;
      if (n >= 100) ++attempts;
      bool stale = false;
      for (int e = tid; e < a.rows * W; e += kThreads) {
        stale |= (copied[e] >> (16 * a.hpw)) != tag;
      }
      if (!__syncthreads_or(stale)) break;
    }
    if (leader && n >= 100) waited += clock64() - c0;
    for (int e = tid; e < a.rows * W; e += kThreads) {  // unpack into the rows' layout
      const unsigned long long v = copied[e];
      const int r = e / W, col = e % W * a.hpw;
      for (int h = 0; h < a.hpw; ++h) local[r * kRow + col + h] = uint16_t(v >> (16 * h));
    }
    __syncthreads();
    for (int e = tid; e < a.rows * kCols; e += kThreads * 7) {
      const int r = e / kCols, col = e % kCols;
      if (local[r * kRow + col] != uint16_t(n * 7 + col / units + r)) ++errors;
    }
    __syncthreads();  // every read of `copied` and `local` before the next copy
  }
  if (cta == 0 && tid == 0) a.times[1] = timer_ns();
  if (errors) atomicAdd(a.errors, errors);
  if (leader) atomicAdd(a.attempts, attempts);
  if (cta == 0 && leader) *a.wait_cycles = waited;
}

constexpr int kSteps = 4000;

// The device buffers of one launch, zeroed.
Args new_args() {
  Args a{};
  cudaMalloc(&a.x, 2 * kBlockBytes);
  cudaMalloc(&a.counters, 8 * kCounterStride * 4);
  cudaMalloc(&a.flags, 4 * 128);
  cudaMalloc(&a.errors, 4);
  cudaMalloc(&a.times, 16);
  cudaMalloc(&a.leader_cycles, 24);
  cudaMemset(a.x, 0, 2 * kBlockBytes);
  cudaMemset(a.counters, 0, 8 * kCounterStride * 4);
  cudaMemset(a.flags, 0, 4 * 128);
  cudaMemset(a.errors, 0, 4);
  cudaMemset(a.leader_cycles, 0, 24);
  a.steps = kSteps;
  return a;
}

void free_args(const Args& a) {
  cudaFree(a.x);
  cudaFree(a.counters);
  cudaFree(a.flags);
  cudaFree(a.errors);
  cudaFree(a.times);
  cudaFree(a.leader_cycles);
}

// Launches that failed or reloaded something wrong: the exit status.
int failures = 0;

constexpr int kHangSeconds = 5;  // a launch without progress for longer: a protocol that hangs

// Launches `kernel` in `clusters` clusters of `size` CTAs of `threads`
// threads with `smem` bytes of dynamic shared memory, and waits for it.
template <typename Kernel, typename A>
cudaError_t launch_in_clusters(Kernel kernel, const A& a, int size, int clusters, int threads, int smem) {
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(size * clusters);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = size;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return wait_for(cudaLaunchKernelEx(&config, kernel, a), kHangSeconds);
}

// Waits for the launch, then prints its ns per step and wrong elements.
cudaError_t finish(cudaError_t launched, const Args& a) {
  const cudaError_t status = wait_for(launched, kHangSeconds);
  unsigned errors = 0;
  cudaMemcpy(&errors, a.errors, 4, cudaMemcpyDeviceToHost);
  printf("%7.1f ns/step, %u wrong", read_step_clock(a.times, nullptr, kSteps - 100).ns, errors);
  failures += status != cudaSuccess || errors != 0;
  return status;
}

// `clusters` clusters of `size` CTAs, `rows` rows.
void run_cluster(ClusterMode mode, int size, int clusters, int rows, int work) {
  Args a = new_args();
  a.work = work;
  a.rows = rows;
  a.mode = mode;
  const int smem = kHeader + 2 * kBufHalves * 2 + 80 * 1024;  // more than half an SM's: one CTA an SM
  const char* name[] = {"cluster, st.async (the kernels')", "cluster, a bulk copy a peer",
                        "cluster, barrier + loads", "cluster, bulk, a barrier a slice"};
  printf("%-34s C=%3d x %d rows=%2d work=%4d: ", name[mode], size, clusters, rows, work);
  const cudaError_t status = finish(launch_in_clusters(cluster_probe, a, size, clusters, kThreads, smem), a);
  printf(" %s\n", status == cudaSuccess ? "" : cudaGetErrorString(status));
  free_args(a);
}

// A whole forward step of the LLTM at FlashRNN's point in a 16-CTA cluster
// a batch chunk of 8 rows: what section 50's cluster design would take a
// step. Each CTA owns 48 of the 768 units: 144 rows of W_hh (the three
// gates' rows of its units), 9 MMA tiles of 16 rows over 48 k steps of 16.
// 3 KR warps: warp w takes tiles 3 (w / KR) .. +2 over the (w % KR)-th of KR
// ranges of k steps, 3 x 48 / KR A fragments, the first H in registers and
// the rest staged in shared memory, fragment by fragment (one 16-byte load a
// thread). KR = 4 (12 warps) holds up to 30 fragments a thread in registers;
// KR = 6 (18 warps, 5 on some of an SM's 4 schedulers, so 96 registers a
// thread at most) 12.
// A step: the warps' products against the exchanged rows (B), their partial
// sums through shared memory, the cell (i = sigmoid, o = sigmoid, z = elu;
// c += i z, h = tanh(c) o) for 48 units x 8 rows, h's slice into the next
// buffer, and the exchange. Left out: the input projection's gates (a 4.6 KB
// read a step). W_hh and h_0 are small exact values; step 0's gate sums are
// written out and checked against the host's.
constexpr int kStepRows = 8, kStepUnits = 48, kGateRows = 3 * kStepUnits;

struct StepArgs {
  const uint16_t* w;          // [16 ranks * kGateRows][kCols], fp16
  float* gates;               // step 0's gate sums, [CTA][kGateRows][kStepRows]
  unsigned long long* times;  // CTA 0's timer after step 100 and at the end
  long long* cycles;          // CTA 0, thread 0: products, cell, exchange (sums after step 100)
  int steps, mode;
};

// Small exact values (and w_value's): every sum of products below is exact in float.
__host__ __device__ inline float h0_value(int r, int k) { return float((r * 37 + k * 13) % 29 - 14) / 64.f; }

// Where the step's buffers keep element (row r, column col): the units a
// CTA are known at compile time here, so the slice layouts cost no division.
constexpr int kSliceStride = kStepUnits + kSlicePad, kSliceHalves = kStepRows * kSliceStride;
__device__ __forceinline__ int step_at(int mode, int r, int col) {
  return mode == kPushStores ? r * kRow + col
                             : col / kStepUnits * kSliceHalves + r * kSliceStride + col % kStepUnits;
}
constexpr int kPartialStride = kStepRows + 1;  // a gate row's partial sums: the cell reads them bank-free

// KR: k ranges; H: A fragments a warp holds in registers (whole k steps: 3
// tiles each); M: the ClusterMode (at compile time, so that only kBulkSlices's
// k loop has waits in it: each is a compiler barrier to the loads around it).
template <int KR, int H, int M>
__global__ void __launch_bounds__(96 * KR, 1) step_probe(StepArgs a) {
  constexpr int kStepThreads = 96 * KR, kKRanges = KR, kKSteps = kCols / 16 / KR;
  constexpr int kFrags = 3 * kKSteps;
  static_assert(H % 3 == 0 && H <= kFrags, "held fragments: whole k steps of the warp's three tiles");
  static_assert(kStepThreads >= kStepUnits * kStepRows, "a thread for each of the cell's (unit, row)");
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t bars = smem_address(smem);
  uint16_t* hbuf = reinterpret_cast<uint16_t*>(smem + kHeader);  // [2][kBufHalves]
  float* partial =
      reinterpret_cast<float*>(smem + kHeader + 4 * kBufHalves);  // [KR][kGateRows][kPartialStride]
  uint4* staged =
      reinterpret_cast<uint4*>(partial + KR * kGateRows * kPartialStride);  // [warp][kFrags - H][lane]
  const ClusterLayout L = cluster_layout(M, kStepRows);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, group = warp / kKRanges,
            krange = warp % kKRanges;
  const int g = lane / 4, c2 = lane % 4 * 2, k0 = krange * kKSteps;

  // This warp's fragments of this CTA's rows: m16n8k16's A layout.
  const uint16_t* w = a.w + static_cast<size_t>(L.rank) * kGateRows * kCols;
  uint32_t held[H > 0 ? H : 1][4];
#pragma unroll
  for (int j = 0; j < kFrags; ++j) {
    const int row = (group * 3 + j % 3) * 16 + g, k = (k0 + j / 3) * 16 + c2;
    const uint32_t f[4] = {*reinterpret_cast<const uint32_t*>(w + row * kCols + k),
                           *reinterpret_cast<const uint32_t*>(w + (row + 8) * kCols + k),
                           *reinterpret_cast<const uint32_t*>(w + row * kCols + k + 8),
                           *reinterpret_cast<const uint32_t*>(w + (row + 8) * kCols + k + 8)};
    if (j < H) {
      for (int q = 0; q < 4; ++q) held[j < H ? j : 0][q] = f[q];
    } else {
      staged[(warp * (kFrags - H) + j - H) * 32 + lane] = make_uint4(f[0], f[1], f[2], f[3]);
    }
  }
  for (int e = tid; e < kStepRows * kCols; e += kStepThreads) {  // h_0, whole, in buffer 0
    const __half v = __float2half(h0_value(e / kCols, e % kCols));
    hbuf[step_at(M, e / kCols, e % kCols)] = *reinterpret_cast<const uint16_t*>(&v);
  }
  cluster_start(L, bars);  // also the CTA's barrier after the writes above

  const int unit = tid % kStepUnits, brow = tid / kStepUnits;  // the cell's (unit, row), tid < 384
  float cell = 0.f;
  long long spent[3] = {};
  for (int n = 0; n < a.steps; ++n) {
    if (n == 100 && blockIdx.x == 0 && tid == 0) a.times[0] = timer_ns();
    const long long t0 = clock64();
    const uint16_t* h = hbuf + (n & 1) * kBufHalves;
    uint16_t* next = hbuf + ((n + 1) & 1) * kBufHalves;
    // kBulkSlices: step n - 1's exchange filled this parity's slices (phase (n - 1) / 2 of their mbarriers)
    const uint32_t in_bars = L.parity_bars(bars, n & 1);
    const int in_phase = ((n - 1) >> 1) & 1;
    const bool by_slice = M == kBulkSlices && n > 0;
    float acc[3][4] = {};
    uint4 pre[3][3];  // the staged A fragments of k steps s0 .. s0 + 2, loaded before any wait among them
#pragma unroll
    for (int s = 0; s < kKSteps; ++s) {
      if (s % 3 == 0) {
#pragma unroll
        for (int q = 0; q < 9; ++q) {
          const int j = s * 3 + q;
          if (j >= H && j < kFrags) pre[q / 3][q % 3] = staged[(warp * (kFrags - H) + j - H) * 32 + lane];
        }
      }
      const int ks = k0 + s, slice = ks / 3;  // 3 k steps of 16 a CTA's slice of 48 columns
      if (by_slice && (s == 0 || ks % 3 == 0) && slice != L.rank) wait_slice(in_bars, slice, in_phase);
      const int at = M == kPushStores ? g * kRow + ks * 16 + c2
                                      : slice * kSliceHalves + g * kSliceStride + ks % 3 * 16 + c2;
      const uint32_t b0 = *reinterpret_cast<const uint32_t*>(h + at);
      const uint32_t b1 = *reinterpret_cast<const uint32_t*>(h + at + 8);
#pragma unroll
      for (int m = 0; m < 3; ++m) {
        const int j = s * 3 + m;
        uint32_t f[4];
        if (j < H) {
          for (int q = 0; q < 4; ++q) f[q] = held[j < H ? j : 0][q];
        } else {
          const uint4 v = pre[s % 3][m];
          f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
        }
        mma16816(acc[m], f, b0, b1);
      }
    }
    // D of tile t: lane (g, c2) holds rows g and g + 8, columns (batch rows) c2 and c2 + 1.
#pragma unroll
    for (int m = 0; m < 3; ++m) {
      float* d = partial + (krange * kGateRows + (group * 3 + m) * 16 + g) * kPartialStride + c2;
      d[0] = acc[m][0], d[1] = acc[m][1];
      d[8 * kPartialStride] = acc[m][2], d[8 * kPartialStride + 1] = acc[m][3];
    }
    __syncthreads();
    if (by_slice) rearm_slices(L, in_bars, in_phase);
    const long long t1 = clock64();
    if (tid < kStepUnits * kStepRows) {
      float z[3];
      for (int gate = 0; gate < 3; ++gate) {
        const int row = gate * kStepUnits + unit;
        float sum = 0.f;
        for (int r = 0; r < kKRanges; ++r) sum += partial[(r * kGateRows + row) * kPartialStride + brow];
        z[gate] = sum;
        if (n == 0) a.gates[(blockIdx.x * kGateRows + row) * kStepRows + brow] = sum;
      }
      const float i = 1.f / (1.f + __expf(-z[0])), o = 1.f / (1.f + __expf(-z[1]));
      const float cand = z[2] > 0.f ? z[2] : __expf(z[2]) - 1.f;
      cell += i * cand;
      const __half v = __float2half(tanhf(cell) * o);
      next[step_at(M, brow, L.rank * kStepUnits + unit)] = *reinterpret_cast<const uint16_t*>(&v);
    }
    const long long t2 = clock64();
    // Step n's rows go through buffer and mbarriers (n + 1) % 2; an mbarrier
    // of parity b is used by steps b ^ 1, b ^ 1 + 2, ...: phase n / 2.
    cluster_exchange(L, next, L.parity_bars(bars, (n + 1) & 1), (n >> 1) & 1);
    if (n >= 100 && blockIdx.x == 0 && tid == 0) {
      const long long t3 = clock64();
      spent[0] += t1 - t0, spent[1] += t2 - t1, spent[2] += t3 - t2;
    }
  }
  if (blockIdx.x == 0 && tid == 0) {
    a.times[1] = timer_ns();
    for (int q = 0; q < 3; ++q) a.cycles[q] = spent[q];
  }
  cluster_barrier();
}

// Step 0's gate sums on the host, [rank][kGateRows][kStepRows] (exact).
const std::vector<float>& step0_gates() {
  static const std::vector<float> want = [] {
    std::vector<float> v(16 * kGateRows * kStepRows);
    for (size_t e = 0; e < v.size(); ++e) {
      const int row = int(e / kStepRows), r = int(e % kStepRows);
      for (int k = 0; k < kCols; ++k) v[e] += w_value(row, k) * h0_value(r, k);
    }
    return v;
  }();
  return want;
}

template <int KR, int H, int M>
void run_step(ClusterMode mode, int clusters, const uint16_t* w) {
  constexpr int kStepWarps = 3 * KR, kFrags = 3 * kCols / 16 / KR;
  StepArgs a{};
  const int ctas = 16 * clusters, gates = ctas * kGateRows * kStepRows;
  a.w = w;
  a.steps = kSteps;
  a.mode = mode;
  cudaMalloc(&a.gates, gates * 4);
  cudaMalloc(&a.times, 16);
  cudaMalloc(&a.cycles, 24);
  cudaMemset(a.gates, 0xff, gates * 4);  // NaN: a sum never written fails the check
  const int smem =
      kHeader + 4 * kBufHalves + KR * kGateRows * kPartialStride * 4 + kStepWarps * (kFrags - H) * 32 * 16;
  const char* name[] = {"st.async", "bulk copies", "barrier + loads", "bulk, slice waits"};
  printf("LLTM step, 16 CTAs x %d, %2d warps, %2d of %2d held, %-15s (%3d KB smem): ", clusters, kStepWarps,
         H, kFrags, name[mode], smem / 1024);
  const cudaError_t status = launch_in_clusters(step_probe<KR, H, M>, a, 16, clusters, kStepWarps * 32, smem);
  const StepClock clock = read_step_clock(a.times, a.cycles, kSteps - 100);
  std::vector<float> got(gates);
  cudaMemcpy(got.data(), a.gates, gates * 4, cudaMemcpyDeviceToHost);
  int wrong = 0;  // every cluster's CTA of rank q against want's rows of rank q
  const std::vector<float>& want = step0_gates();
  for (int e = 0; e < gates; ++e) wrong += !(std::fabs(got[e] - want[e % want.size()]) <= 1e-3f);
  printf("%7.1f ns/step (cycles: products %lld, cell %lld, exchange %lld), %d wrong gate sums %s\n", clock.ns,
         clock.cycles[0], clock.cycles[1], clock.cycles[2], wrong,
         status == cudaSuccess ? "" : cudaGetErrorString(status));
  failures += status != cudaSuccess || wrong != 0;
  cudaFree(a.gates);
  cudaFree(a.times);
  cudaFree(a.cycles);
}

template <int KR, int H>
void run_steps_of(ClusterMode mode, int clusters, const uint16_t* w) {
  switch (mode) {
    case kPushStores:
      return run_step<KR, H, kPushStores>(mode, clusters, w);
    case kPushBulk:
      return run_step<KR, H, kPushBulk>(mode, clusters, w);
    case kPull:
      return run_step<KR, H, kPull>(mode, clusters, w);
    case kBulkSlices:
      return run_step<KR, H, kBulkSlices>(mode, clusters, w);
  }
}

void run_steps() {
  const size_t count = size_t(16) * kGateRows * kCols;
  std::vector<uint16_t> host(count);
  for (size_t e = 0; e < count; ++e) {
    const __half v = __float2half(w_value(int(e / kCols), int(e % kCols)));
    host[e] = *reinterpret_cast<const uint16_t*>(&v);
  }
  uint16_t* w = nullptr;
  cudaMalloc(&w, count * 2);
  cudaMemcpy(w, host.data(), count * 2, cudaMemcpyHostToDevice);
  for (ClusterMode mode : {kPushStores, kPushBulk, kPull, kBulkSlices}) {
    for (int clusters : {1, 2}) {
      run_steps_of<4, 18>(mode, clusters, w);
      run_steps_of<4, 24>(mode, clusters, w);
      run_steps_of<4, 30>(mode, clusters, w);
      run_steps_of<6, 12>(mode, clusters, w);
    }
  }
  cudaFree(w);
}

// tagged_probe: G CTAs, `rows` rows, `hpw` columns a word, the first copy `delay` ns after the put.
void run_tagged(int G, int work, int rows, int hpw, int delay) {
  TaggedArgs a{};
  const size_t words = size_t(2) * kRows * (kCols / 2);
  cudaMalloc(&a.words, words * 8);
  cudaMalloc(&a.errors, 4);
  cudaMalloc(&a.times, 16);
  cudaMalloc(&a.attempts, 8);
  cudaMalloc(&a.wait_cycles, 8);
  cudaMemset(a.words, 0xff, words * 8);  // tags no step has
  cudaMemset(a.errors, 0, 4);
  cudaMemset(a.attempts, 0, 8);
  cudaMemset(a.wait_cycles, 0, 8);
  a.steps = kSteps;
  a.work = work;
  a.rows = rows;
  a.hpw = hpw;
  a.delay = delay;
  const int smem = 128 + kRows * (kCols / 2) * 8 + kRows * kRow * 2 + 40 * 1024;  // one CTA an SM
  cudaFuncSetAttribute(tagged_probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  printf("%-34s G=%3d work=%4d rows=%2d hpw=%d delay=%4d: ", "tagged words, validated copy", G, work, rows,
         hpw, delay);
  const cudaError_t status =
      wait_for((tagged_probe<<<G, kThreads, smem>>>(a), cudaGetLastError()), kHangSeconds);
  unsigned errors = 0;
  unsigned long long attempts = 0;
  long long waited = 0;
  cudaMemcpy(&errors, a.errors, 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(&attempts, a.attempts, 8, cudaMemcpyDeviceToHost);
  cudaMemcpy(&waited, a.wait_cycles, 8, cudaMemcpyDeviceToHost);
  const int n = kSteps - 100;
  printf("%7.1f ns/step, %u wrong; copies a step %.2f, CTA 0's wait %lld cycles %s\n",
         read_step_clock(a.times, nullptr, n).ns, errors, double(attempts) / n / G, waited / n,
         status == cudaSuccess ? "" : cudaGetErrorString(status));
  failures += status != cudaSuccess || errors != 0;
  cudaFree(a.words);
  cudaFree(a.errors);
  cudaFree(a.times);
  cudaFree(a.attempts);
  cudaFree(a.wait_cycles);
}

struct Case {
  int G, work, pollers = 1, stagger = 0, bands = 1, relaxed = 0;
};

template <Protocol P>
void run(const char* name, const Case& c) {
  Args a = new_args();
  a.work = c.work;
  a.pollers = c.pollers;
  a.stagger = c.stagger;
  a.bands = c.bands;
  a.relaxed = c.relaxed;
  const int smem = 128 + kBlockBytes + 100 * 1024;  // more than half an SM's: one CTA an SM
  cudaFuncSetAttribute(probe<P>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  printf("%-34s G=%3d work=%4d pollers=%d stagger=%3d bands=%d relaxed=%d: ", name, c.G, c.work, c.pollers,
         c.stagger, c.bands, c.relaxed);
  probe<P><<<c.G, kThreads, smem>>>(a);
  const cudaError_t status = finish(cudaGetLastError(), a);
  if (P == kCounterCopy || P == kSeparateRelease) {
    long long cycles[3];
    cudaMemcpy(cycles, a.leader_cycles, 24, cudaMemcpyDeviceToHost);
    const int n = kSteps - 100;
    printf("; leader's cycles: release %lld, poll %lld, copy %lld", cycles[0] / n, cycles[1] / n,
           cycles[2] / n);
  }
  printf(" %s\n", status == cudaSuccess ? "" : cudaGetErrorString(status));
  free_args(a);
}

// The tagged words beside the kernels' protocol, G = 64 and 128, with and without work.
void run_tagged_all() {
  for (int G : {64, 128}) {
    for (int work : {0, 1700}) {
      run<kCounterCopy>("counter + bulk copy (the kernels')", {G, work});
      for (int rows : {8, 16}) {
        for (int hpw : {2, 3}) {
          for (int delay : {0, 300, 600}) run_tagged(G, work, rows, hpw, delay);
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IONBF, 0);
  const bool tagged_only = argc > 1 && std::string(argv[1]) == "tagged";
  if (!has_compute_capability(9)) {
    printf(
        "grid_exchange_probe: needs a GPU of compute capability 9.0 or later (clusters, DSMEM, bulk "
        "copies)\n");
    return 2;
  }
  if (tagged_only) {
    run_tagged_all();
    return failures != 0;
  }
  for (int G : {64, 128}) {
    for (int work : {0, 1700}) {
      run<kBarrierOnly>("counter, no copy", {G, work});
      run<kCounterCopy>("counter + bulk copy (the kernels')", {G, work});
      run<kCounterCopy>("counter, relaxed polls + fence", {G, work, 1, 0, 1, 1});
      run<kSeparateRelease>("another thread releases", {G, work});
      for (int pollers : {2, 4, 8}) run<kStaggered>("staggered pollers", {G, work, pollers, 400 / pollers});
      for (int stagger : {100, 300}) run<kStaggered>("staggered pollers", {G, work, 2, stagger});
      if (G <= 64) {
        run<kFlags>("a flag per producer, one copy", {G, work});
        for (int bands : {2, 4}) run<kFlagBands>("flags, band copies", {G, work, 1, 0, bands});
      }
      for (int bands : {2, 4, 8}) run<kCounterBands>("band counters, band copies", {G, work, 1, 0, bands});
    }
  }
  for (int work : {0, 1700}) {
    for (int rows : {8, 16}) {
      for (int size : {8, 16}) {
        for (ClusterMode mode : {kPushStores, kPushBulk, kPull, kBulkSlices}) {
          for (int clusters : {1, 2}) run_cluster(mode, size, clusters, rows, work);
        }
      }
    }
  }
  run_steps();
  run_tagged_all();
  return failures != 0;
}
