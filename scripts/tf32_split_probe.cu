// How accurate and how costly the recurrent dot's float32 products can be on
// the tensor cores: an m16n8 tile D = A B over K (A: 16 x K, W_hh's rows;
// B: K x 8, a chunk's h), computed
//   fma       in float32 FMAs, k in order (the strict FMA dot's sums);
//   tf32      one TF32 MMA a k step of 8, chained through the accumulator;
//   3xtf32    each operand split into its TF32 rounding and the TF32
//             rounding of the rest, three MMAs a k step (small x big, big
//             x small, then big x big) chained through the accumulator, as
//             CUTLASS's 3xTF32 does;
//   3xtf32-c0 the same three MMAs with a zero accumulator each k step (the
//             two small products first, then big x big), their results
//             added to float32 accumulators outside the tensor cores, so
//             no sum of more than one k step's products goes through the
//             tensor cores' truncating adder;
//   3xtf32-fx the zero-accumulator form with the big parts on a fixed-point
//             grid: A's rows rounded to multiples of 2^(e - 11), the
//             row's largest magnitude below 2^e, B to multiples of 2^-10
//             (|B| <= 1), each with the round-to-nearest of a float32 add
//             of 1.5 * 2^(e + 12) (of 1.5 * 2^13 for B). Every big x big
//             product is then an integer multiple of one unit below 2^21
//             units, a k step's sum below 2^24, so the tensor cores add it
//             exactly and only the small products (2^-11 of the sum) meet
//             the truncation. (Its lean on a tile is none; in the LLTM's
//             forward the coarser rest of A's split is a fixed change of
//             W_hh that the cell state adds up: section 54.)
// For each K (128, 256, 768, 1024), 4,096 tiles of fresh random values (A
// uniform in +-1/sqrt(K), B in +-1): the relative error norm of D against
// float64 on the host, its bias (the mean of the error times the sign of
// the exact value, over the error's root mean square: ~0 for round-to-
// nearest errors, < 0 when sums are truncated towards zero), and each
// variant's cycles per k step with one warp a scheduler
// (a latency-bound chain, as in the persistent kernels), the operands read
// through L1 and, for K <= 256, from shared memory.
//
//   nvcc -arch=sm_90 -O3 -std=c++17 -o /tmp/tf32_split_probe scripts/tf32_split_probe.cu
//   /tmp/tf32_split_probe
//
// Exit status 1 when a launch fails, 2 without a GPU of compute capability
// 8.0 or later. Results: docs/benchmarks-history.md, sections 52 and 54.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "probe_common.cuh"

namespace {

using lltm_probe::has_compute_capability;

enum Variant { kFma, kTf32, k3xTf32, k3xTf32Zero, k3xTf32Fixed };
const char* const kNames[] = {"fma", "tf32", "3xtf32", "3xtf32-c0", "3xtf32-fx"};
constexpr int kTiles = 4096, kTileA = 16, kTileB = 8;

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// D += A B over one k step of 8: m16n8k8, TF32 operands, float32 accumulator.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One tile's products: warp w takes tile `tile`; A [tiles][16][K] and B
// [tiles][K][8] row-major; D [tiles][16][8]. `reps` repeats the whole dot
// (for timing; every repetition the same sums). kShared: the warp first
// copies its tile's operands into shared memory and reads them from there
// (dynamic shared memory: 4 warps x 24 K floats).
template <int V, bool kShared>
__global__ void __launch_bounds__(128)
    tile_dot(const float* A, const float* B, float* D, int K, int reps, long long* cycles) {
  extern __shared__ float staged[];
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4, warp = threadIdx.x / 32;
  const int tile = blockIdx.x * (blockDim.x / 32) + warp;
  const float* a = A + static_cast<size_t>(tile) * kTileA * K;
  const float* b = B + static_cast<size_t>(tile) * K * kTileB;
  if constexpr (kShared) {
    float* sa = staged + warp * (kTileA + kTileB) * K;
    float* sb = sa + kTileA * K;
    for (int e = lane; e < kTileA * K; e += 32) sa[e] = a[e];
    for (int e = lane; e < K * kTileB; e += 32) sb[e] = b[e];
    __syncwarp();
    a = sa, b = sb;
  }
  // 3xtf32-fx: the rounding constants of rows g and g + 8 (A) and of B.
  float round_a[2] = {}, round_b = 1.5f * 8192.f;
  if constexpr (V == k3xTf32Fixed) {
    for (int half = 0; half < 2; ++half) {
      float biggest = 0.f;
      for (int k = 0; k < K; ++k) biggest = fmaxf(biggest, fabsf(a[(g + 8 * half) * K + k]));
      int e = 0;
      frexpf(biggest, &e);  // biggest < 2^e
      round_a[half] = ldexpf(1.5f, e - 1 + 13);
    }
  }
  float out[4] = {};
  const long long t0 = clock64();
  for (int rep = 0; rep < reps; ++rep) {
    float d[4] = {};
    if constexpr (V == kFma) {  // lane (g, c) owns D's (g, 2c), (g, 2c + 1), (g + 8, 2c), (g + 8, 2c + 1)
      for (int k = 0; k < K; ++k) {
        const float a0 = a[g * K + k], a1 = a[(g + 8) * K + k];
        const float b0 = b[k * kTileB + 2 * c], b1 = b[k * kTileB + 2 * c + 1];
        d[0] = fmaf(a0, b0, d[0]), d[1] = fmaf(a0, b1, d[1]);
        d[2] = fmaf(a1, b0, d[2]), d[3] = fmaf(a1, b1, d[3]);
      }
    } else {
      for (int k = 0; k < K; k += 8) {
        const float af[4] = {a[g * K + k + c], a[(g + 8) * K + k + c], a[g * K + k + c + 4],
                             a[(g + 8) * K + k + c + 4]};
        const float bf[2] = {b[(k + c) * kTileB + g], b[(k + c + 4) * kTileB + g]};
        uint32_t ab[4], bb[2];
        if constexpr (V == k3xTf32Fixed) {
          for (int i = 0; i < 4; ++i)
            ab[i] = __float_as_uint(__fsub_rn(__fadd_rn(af[i], round_a[i % 2]), round_a[i % 2]));
          for (int i = 0; i < 2; ++i) bb[i] = __float_as_uint(__fsub_rn(__fadd_rn(bf[i], round_b), round_b));
        } else {
          for (int i = 0; i < 4; ++i) ab[i] = to_tf32(af[i]);
          for (int i = 0; i < 2; ++i) bb[i] = to_tf32(bf[i]);
        }
        if constexpr (V == kTf32) {
          mma_tf32(d, ab, bb);
        } else {
          uint32_t as[4], bs[2];
          for (int i = 0; i < 4; ++i) as[i] = to_tf32(af[i] - __uint_as_float(ab[i]));
          for (int i = 0; i < 2; ++i) bs[i] = to_tf32(bf[i] - __uint_as_float(bb[i]));
          if constexpr (V == k3xTf32) {
            mma_tf32(d, as, bb);
            mma_tf32(d, ab, bs);
            mma_tf32(d, ab, bb);
          } else {
            float small[4] = {}, big[4] = {};
            mma_tf32(small, as, bb);
            mma_tf32(small, ab, bs);
            mma_tf32(big, ab, bb);
            for (int i = 0; i < 4; ++i) d[i] += big[i] + small[i];
          }
        }
      }
    }
    // Only the first repetition's sums are kept; 0 * d (NaN for an infinite d) still
    // needs every later one, so the compiler cannot drop them.
    for (int i = 0; i < 4; ++i) out[i] += rep == 0 ? d[i] : 0.f * d[i];
  }
  const long long t1 = clock64();
  float* dt = D + static_cast<size_t>(tile) * kTileA * kTileB;
  dt[g * kTileB + 2 * c] = out[0], dt[g * kTileB + 2 * c + 1] = out[1];
  dt[(g + 8) * kTileB + 2 * c] = out[2], dt[(g + 8) * kTileB + 2 * c + 1] = out[3];
  if (lane == 0 && tile == 0) *cycles = t1 - t0;
}

int failures = 0;

// D = A B in float64 on the host, [tiles][16][8].
std::vector<double> reference(int K, const std::vector<float>& hA, const std::vector<float>& hB) {
  std::vector<double> want(size_t(kTiles) * kTileA * kTileB);
  for (int t = 0; t < kTiles; ++t) {
    for (int m = 0; m < kTileA; ++m) {
      for (int n = 0; n < kTileB; ++n) {
        double sum = 0;
        for (int k = 0; k < K; ++k)
          sum += double(hA[(size_t(t) * kTileA + m) * K + k]) * double(hB[(size_t(t) * K + k) * kTileB + n]);
        want[(size_t(t) * kTileA + m) * kTileB + n] = sum;
      }
    }
  }
  return want;
}

template <int V>
void run(int K, const float* dA, const float* dB, float* dD, const std::vector<double>& want,
         long long* dcycles) {
  tile_dot<V, false><<<kTiles / 4, 128>>>(dA, dB, dD, K, 1, dcycles);
  cudaError_t status = cudaDeviceSynchronize();
  std::vector<float> got(static_cast<size_t>(kTiles) * kTileA * kTileB);
  cudaMemcpy(got.data(), dD, got.size() * 4, cudaMemcpyDeviceToHost);
  double err = 0, ref = 0, towards = 0;
  for (size_t e = 0; e < got.size(); ++e) {
    const double diff = got[e] - want[e];
    err += diff * diff, ref += want[e] * want[e];
    towards += want[e] > 0 ? diff : -diff;
  }
  const double bias = towards / got.size() / std::sqrt(err / got.size());
  // Timing: one warp a scheduler of each SM (4 warps a CTA, one CTA an SM),
  // 20 repetitions, operands through L1 and (K <= 256) from shared memory.
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  constexpr int kReps = 20;
  double per_step[2] = {};
  for (int shared = 0; shared < 2; ++shared) {
    if (shared && K > 256) break;
    const int smem = shared ? 4 * (kTileA + kTileB) * K * 4 : 0;
    auto kernel = shared ? tile_dot<V, true> : tile_dot<V, false>;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    kernel<<<sms, 128, smem>>>(dA, dB, dD, K, kReps, dcycles);
    if (status == cudaSuccess) status = cudaDeviceSynchronize();
    long long cycles = 0;
    cudaMemcpy(&cycles, dcycles, 8, cudaMemcpyDeviceToHost);
    per_step[shared] = double(cycles) / kReps / (K / 8);
  }
  printf("K=%4d %-10s relative error %.3e, bias %+.3f; cycles a k step of 8: %6.1f (L1), %6.1f (shared) %s\n",
         K, kNames[V], std::sqrt(err / ref), bias, per_step[0], per_step[1],
         status == cudaSuccess ? "" : cudaGetErrorString(status));
  failures += status != cudaSuccess;
}

}  // namespace

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  if (!has_compute_capability(8)) {
    printf("tf32_split_probe: needs a GPU of compute capability 8.0 or later (TF32 MMA)\n");
    return 2;
  }
  std::mt19937 rng(20261130);
  for (int K : {128, 256, 768, 1024}) {
    const float scale = 1.f / std::sqrt(float(K));
    std::uniform_real_distribution<float> wa(-scale, scale), hb(-1.f, 1.f);
    std::vector<float> hA(size_t(kTiles) * kTileA * K), hB(size_t(kTiles) * K * kTileB);
    for (float& x : hA) x = wa(rng);
    for (float& x : hB) x = hb(rng);
    float *dA, *dB, *dD;
    long long* dcycles;
    cudaMalloc(&dA, hA.size() * 4);
    cudaMalloc(&dB, hB.size() * 4);
    cudaMalloc(&dD, size_t(kTiles) * kTileA * kTileB * 4);
    cudaMalloc(&dcycles, 8);
    cudaMemcpy(dA, hA.data(), hA.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, hB.data(), hB.size() * 4, cudaMemcpyHostToDevice);
    const std::vector<double> want = reference(K, hA, hB);
    run<kFma>(K, dA, dB, dD, want, dcycles);
    run<kTf32>(K, dA, dB, dD, want, dcycles);
    run<k3xTf32>(K, dA, dB, dD, want, dcycles);
    run<k3xTf32Zero>(K, dA, dB, dD, want, dcycles);
    run<k3xTf32Fixed>(K, dA, dB, dD, want, dcycles);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dD);
    cudaFree(dcycles);
  }
  return failures != 0;
}
