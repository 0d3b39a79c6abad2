// The PTX that the persistent kernels' exchanges (persistent_exchange.cuh)
// are built from: the acquire and release operations on global memory,
// mbarriers, the cluster barrier, DSMEM addresses and stores, and the bulk
// copy engine. The header has no torch dependency, so
// scripts/grid_exchange_probe.cu times these same instructions on their own.
// Instructions from sm_90 compile to nothing for older architectures; their
// callers run only on sm_90.
#pragma once

#include <cstdint>

namespace lltm {
namespace cuda_detail {

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Adds 1 to *p after every write this thread has made or observed (the
// CTA's, after a barrier) is visible at GPU scope.
__device__ __forceinline__ void release_add(unsigned* p) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(p) : "memory");
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

// Sets up the mbarrier at shared address `bar` for one arrival a phase (sm_90).
[[maybe_unused]] __device__ __forceinline__ void mbarrier_init(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar) : "memory");
#endif
}

// The mbarriers this thread initialised are initialised before any use
// from the cluster (sm_90).
[[maybe_unused]] __device__ __forceinline__ void mbarrier_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// The phase's one arrival at the mbarrier at `bar`, which then also waits
// for `bytes` from copies and DSMEM stores (sm_90).
[[maybe_unused]] __device__ __forceinline__ void mbarrier_expect(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

// Waits until the phase of parity `phase` of the mbarrier at shared address
// `bar` has completed (sm_90).
[[maybe_unused]] __device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t phase) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_loop:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_loop;\n"
      "}\n" ::"r"(bar),
      "r"(phase)
      : "memory");
#endif
}

// Every thread of every CTA of the cluster arrives here before any goes on;
// what each wrote before (its mbarriers' initialisation) is then visible
// to the cluster (sm_90).
[[maybe_unused]] __device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
#endif
}

// The copy engine's accesses (the async proxy) after this thread's: its
// global reads after what this thread acquired, its shared-memory writes
// after this CTA's reads before a barrier (sm_90).
[[maybe_unused]] __device__ __forceinline__ void async_proxy_fence_global() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}
[[maybe_unused]] __device__ __forceinline__ void async_proxy_fence_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// A bulk copy of `bytes` (a multiple of 16, both ends 16-byte aligned) from
// global memory to this CTA's shared address `dst`, its bytes completing on
// the mbarrier at `bar` (sm_90).
[[maybe_unused]] __device__ __forceinline__ void bulk_copy_to_shared(uint32_t dst, const void* src,
                                                                     uint32_t bytes, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
#endif
}

// Stores the 16 (or 4) bytes at this CTA's shared address `src` to the
// cluster shared address `dst` in another CTA, completing them on the
// mbarrier at cluster address `bar` (sm_90).
[[maybe_unused]] __device__ __forceinline__ void store_to_peer16(uint32_t src, uint32_t dst, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t v0, v1, v2, v3;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
               : "r"(src)
               : "memory");
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(
          dst),
      "r"(v0), "r"(v1), "r"(v2), "r"(v3), "r"(bar)
      : "memory");
#endif
}
[[maybe_unused]] __device__ __forceinline__ void store_to_peer4(uint32_t src, uint32_t dst, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(src) : "memory");
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(dst),
               "r"(v), "r"(bar)
               : "memory");
#endif
}

}  // namespace cuda_detail
}  // namespace lltm
