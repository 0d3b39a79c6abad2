// What one step of the grid exchange costs without the step's work, and what
// other protocols would cost: G CTAs (one an SM), each owning 768 / G columns
// of a 16 x 776 fp16 matrix in L2 (h_t at FlashRNN's point, B = 16, S = 768,
// rows padded as the kernels pad them; the kernels' chunks there reload 8 rows
// each), publish their slice and reload the whole matrix into shared memory
// every step, as lltm/csrc/cuda/persistent_exchange.cuh's GridExchange does
// (sm_90).
//
//   nvcc -arch=sm_90 -O3 -std=c++17 -o /tmp/grid_exchange_probe scripts/grid_exchange_probe.cu
//   /tmp/grid_exchange_probe
//
// Prints ns per step (CTA 0's global timer over the steps after the first
// 100) for each protocol, G = 64 and 128, with no work between exchanges and
// with ~1,700 cycles of it (a step's dot and cell math at that point), and
// for the kernels' protocol the leader's cycles in its release, its poll and
// its wait for the copy. Every reload is checked (a sample of each step's
// elements against the value its producer wrote). Last, the same exchange
// inside clusters of 8 and 16 CTAs through DSMEM, 8 and 16 rows, one or two
// clusters: the cluster path's protocol (16-byte st.async into every other
// CTA), one bulk copy of the slice into each other CTA, and a cluster barrier
// followed by every thread loading from the others. Results and what they
// decided: docs/benchmarks-history.md, sections 50 and 51.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

// The kernels' own PTX (acquire and release, mbarriers, bulk copies, DSMEM
// stores), so the probe times the instructions the exchange runs.
#include "../lltm/csrc/cuda/ptx_sync.cuh"

namespace {

using namespace lltm::cuda_detail;

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
};

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

__device__ __forceinline__ unsigned long long timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
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

// The cluster's exchange, for comparison (ClusterExchange, sm_90): each CTA of
// a cluster stores its columns of every row into every other CTA's shared
// memory (st.async, 16 bytes a store), each store completing its bytes on the
// receiver's mbarrier of the step's parity. Nothing goes through L2; a
// cluster holds at most 16 CTAs (non-portable size), so W_hh must fit in
// them.
__global__ void __launch_bounds__(kThreads, 1) cluster_probe(Args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t bars = smem_address(smem);                   // parity 0's mbarrier, then parity 1's
  uint16_t* local = reinterpret_cast<uint16_t*>(smem + 128);  // [2][kRows][kRow]
  unsigned rank, ctas;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(ctas));
  const int tid = threadIdx.x, units = kCols / static_cast<int>(ctas), chunks = units * 2 / 16;
  const uint32_t expected = (ctas - 1) * a.rows * units * 2;  // bytes into this CTA a step
  if (tid == 0) {
    for (int q = 0; q < 2; ++q) mbarrier_init(bars + 8 * q);
    mbarrier_init_fence();
  }
  __syncwarp();
  if (tid == 0) {
    for (int q = 0; q < 2; ++q) mbarrier_expect(bars + 8 * q, expected);
  }
  cluster_barrier();
  unsigned errors = 0;
  for (int n = 0; n < a.steps; ++n) {
    if (a.work > 0) {
      const long long t0 = clock64();
      while (clock64() - t0 < a.work + blockIdx.x * 37 % 200) {
      }
    }
    if (n == 100 && blockIdx.x == 0 && tid == 0) a.times[0] = timer_ns();
    const int p = n & 1;
    uint16_t* mine = local + p * kRows * kRow;
    // kPushStores lays rows out whole ([rows][kRow]); the others lay the
    // CTAs' slices end to end ([ctas][rows][units]), so a slice is one
    // contiguous block.
    const int slice = a.rows * units;
    const bool whole_rows = a.mode == kPushStores;
    for (int e = tid; e < slice; e += kThreads) {
      const int at = whole_rows ? e / units * kRow + rank * units + e % units : rank * slice + e;
      mine[at] = uint16_t(n * 7 + rank + e / units);
    }
    const int items = a.rows * chunks, others = static_cast<int>(ctas) - 1;
    if (a.mode == kPushStores) {
      __syncthreads();
      for (int e = tid; e < items * others; e += kThreads) {
        const int other = e / items, item = e % items;
        const int peer = other + (other >= static_cast<int>(rank));  // every CTA but this one
        const uint32_t src = smem_address(mine + item / chunks * kRow + rank * units) + item % chunks * 16;
        store_to_peer16(src, cluster_address(src, peer), cluster_address(bars + 8 * p, peer));
      }
    } else if (a.mode == kPushBulk) {
      async_proxy_fence_shared();  // this thread's writes of the slice before the copy engine reads it
      __syncthreads();
      if (tid < others) {
        const int peer = tid + (tid >= static_cast<int>(rank));
        const uint32_t src = smem_address(mine + rank * slice);
        bulk_copy_to_peer(cluster_address(src, peer), src, slice * 2, cluster_address(bars + 8 * p, peer));
      }
    } else {
      cluster_barrier();  // every slice of this parity written and visible to the cluster
      for (int e = tid; e < items * others; e += kThreads) {
        const int other = e / items, item = e % items;
        const int peer = other + (other >= static_cast<int>(rank));
        const uint32_t at = smem_address(mine + peer * slice) + item * 16;
        const uint4 v = load_from_peer16(cluster_address(at, peer));
        *reinterpret_cast<uint4*>(mine + peer * slice + item * 8) = v;
      }
      __syncthreads();
    }
    if (a.mode != kPull) {
      // Exchange n completes phase n / 2 of its parity's mbarrier; thread 0 arms the next.
      mbarrier_wait(bars + 8 * p, (n >> 1) & 1);
      if (tid == 0) mbarrier_expect(bars + 8 * p, expected);
    }
    for (int e = tid; e < a.rows * kCols; e += kThreads * 7) {
      const int r = e / kCols, col = e % kCols, q = col / units;
      const int at = whole_rows ? r * kRow + col : q * slice + r * units + col % units;
      if (mine[at] != uint16_t(n * 7 + q + r)) ++errors;
    }
    __syncthreads();  // every read of this parity before exchange n + 2 can land in it
  }
  if (blockIdx.x == 0 && tid == 0) a.times[1] = timer_ns();
  if (errors) atomicAdd(a.errors, errors);
  cluster_barrier();
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

// Waits for the launch (and ends the program if it makes no progress in 5
// s: a protocol that hangs), then prints its ns per step and wrong elements.
cudaError_t finish(cudaError_t launched, const Args& a) {
  const auto start = std::chrono::steady_clock::now();
  while (launched == cudaSuccess && cudaStreamQuery(nullptr) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(5)) {
      printf("no progress in 5 s: a protocol that hangs\n");
      std::exit(1);
    }
  }
  const cudaError_t status = launched != cudaSuccess ? launched : cudaDeviceSynchronize();
  unsigned long long t[2] = {};
  unsigned errors = 0;
  cudaMemcpy(t, a.times, 16, cudaMemcpyDeviceToHost);
  cudaMemcpy(&errors, a.errors, 4, cudaMemcpyDeviceToHost);
  printf("%7.1f ns/step, %u wrong", double(t[1] - t[0]) / (kSteps - 100), errors);
  return status;
}

// `clusters` clusters of `size` CTAs, `rows` rows.
void run_cluster(ClusterMode mode, int size, int clusters, int rows, int work) {
  Args a = new_args();
  a.work = work;
  a.rows = rows;
  a.mode = mode;
  const int smem = 128 + 2 * kBlockBytes + 80 * 1024;  // more than half an SM's: one CTA an SM
  cudaFuncSetAttribute(cluster_probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(cluster_probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(size * clusters);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = size;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  const char* name[] = {"cluster, st.async (the kernels')", "cluster, a bulk copy a peer",
                        "cluster, barrier + loads"};
  printf("%-34s C=%3d x %d rows=%2d work=%4d: ", name[mode], size, clusters, rows, work);
  const cudaError_t status = finish(cudaLaunchKernelEx(&config, cluster_probe, a), a);
  printf(" %s\n", status == cudaSuccess ? "" : cudaGetErrorString(status));
  free_args(a);
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

}  // namespace

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
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
        for (ClusterMode mode : {kPushStores, kPushBulk, kPull}) {
          for (int clusters : {1, 2}) run_cluster(mode, size, clusters, rows, work);
        }
      }
    }
  }
  return 0;
}
