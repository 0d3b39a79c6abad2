// What the scripts/ probes share: the global timer, the fp16 MMA they time,
// the exact test values of W, a launch's wait with a hang guard, the step
// clocks' readback and the device check. Host and device code only; no torch dependency.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace lltm_probe {

__device__ __forceinline__ unsigned long long timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// D += A B on one m16n8k16 tile, fp16 operands, float accumulators (sm_80+).
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Small exact values of W (multiples of 1/256 in [-30/256, 30/256]): the
// probes' sums of their products with the exchanged values are exact in float.
__host__ __device__ inline float w_value(int row, int k) {
  return float((row * 131 + k * 71) % 61 - 30) / 256.f;
}

// Waits for the launch on the default stream; ends the program if it makes
// no progress in `seconds` (a protocol that hangs).
inline cudaError_t wait_for(cudaError_t launched, int seconds) {
  const auto start = std::chrono::steady_clock::now();
  while (launched == cudaSuccess && cudaStreamQuery(nullptr) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(seconds)) {
      printf("no progress in %d s: a protocol that hangs\n", seconds);
      std::exit(1);
    }
  }
  return launched != cudaSuccess ? launched : cudaDeviceSynchronize();
}

// A step kernel's clocks, per step over `steps` steps: its global timer's two
// readings (`times`, ns; the steps between them) and, where `cycles` is not
// null, one thread's cycles summed over the same steps in three phases.
struct StepClock {
  double ns;
  long long cycles[3];
};
inline StepClock read_step_clock(const unsigned long long* times, const long long* cycles, int steps) {
  unsigned long long t[2] = {};
  long long c[3] = {};
  cudaMemcpy(t, times, sizeof t, cudaMemcpyDeviceToHost);
  if (cycles != nullptr) cudaMemcpy(c, cycles, sizeof c, cudaMemcpyDeviceToHost);
  return {double(t[1] - t[0]) / steps, {c[0] / steps, c[1] / steps, c[2] / steps}};
}

// Whether device 0 exists and has compute capability `major`.x or later.
inline bool has_compute_capability(int major) {
  int devices = 0, got = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0 &&
         cudaDeviceGetAttribute(&got, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess && got >= major;
}

}  // namespace lltm_probe
