// A whole step of the grid path's persistent kernels at FlashRNN's point (the
// LLTM, B = 16, S = 768, fp16) in two designs, so that a change of design is
// measured before it is built into lltm/csrc/cuda/persistent_kernels.cuh:
//
//   one part   the kernels' own: a group of G CTAs a chunk of 8 batch rows,
//              both chunks side by side (2 G CTAs); each step a CTA computes
//              its chunk's products and cell, publishes its slice (one
//              arrival counter a group, GridExchange's protocol) and waits
//              for the whole chunk to come back from L2 (one bulk copy a
//              gate block);
//   two parts  every CTA both chunks (G CTAs), each chunk with its own
//              counter, reload and mbarriers; the CTA computes part 0, then
//              part 1 while part 0's exchange travels, and so on. Two
//              producer warps (one a part) count the CTA's arrival, poll the
//              part's counter and issue its reload, so that no compute warp
//              waits in a release or a poll. A step costs max(2 C, C + E) for
//              a part's work C and an exchange E, against C1 + E for one
//              part's (twice as many units a CTA).
//
// Both hold every A fragment of W_hh in registers (each warp a range of k
// steps over all the CTA's tiles), as the kernels' held plans do; the
// forward's dot has 3 J rows (the LLTM's three gates of J units) over
// K = 768, the backward's J rows (W_hh^T's columns) over K = 3 x 768 and
// exchanges the three gate blocks of dz_h. Each step also loads three values
// of its input and stores three (the input projection and saved values, or
// the saved values and the input gradients) for each (unit, batch row).
//
// Every exchanged value is exact (x_value below, added to 0 times the cell's
// result so that the cell stays on the step's path), so the gate sums of
// every CTA and both chunks at steps 0 and 1000 are checked exactly against
// the host's: a reload that is late, early or wrong fails the run.
//
//   nvcc -arch=sm_90 -O3 -std=c++17 -o /tmp/grid_step_probe scripts/grid_step_probe.cu
//   /tmp/grid_step_probe
//
// Prints ns per step (CTA 0's global timer over the steps after the first
// 100) and CTA 0 thread 0's cycles a step: waiting for the reload, the
// products, the cell with the arrival. Results and what they decided:
// docs/benchmarks-history.md, section 59.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

// The kernels' own PTX (acquire and release, mbarriers, bulk copies).
#include "../lltm/csrc/cuda/ptx_sync.cuh"
#include "probe_common.cuh"

namespace {

using namespace lltm::cuda_detail;
using namespace lltm_probe;

constexpr int kS = 768, kRow = 776;    // units; elements an exchanged row (padded as the kernels pad it)
constexpr int kBatch = 16, kRows = 8;  // batch rows; rows a chunk (a part)
constexpr int kWarps = 8;              // compute warps: each a range of k steps
constexpr int kSteps = 4000, kCheckStep = 1000;
constexpr int kSeq = 1024;  // the per-step inputs and outputs wrap every kSeq steps (T at FlashRNN's point)
constexpr int kCounterStride = 32;  // words between counters: a 128-byte line each

// Small exact values (and w_value's): every gate sum below is exact in float.
// Element k of batch row b of the rows step n reads (k < R 768; step n
// writes step n + 1's).
__host__ __device__ inline float x_value(int n, int b, int k) {
  return float((n * 5 + b * 37 + k * 13) % 29 - 14) / 64.f;
}

struct Args {
  const uint16_t* w;          // [G][tiles 16][R 768]: each CTA's rows of W_hh (or of W_hh^T), zero-padded
  uint16_t* x;                // [2 parities][R][kBatch][kRow]: the exchanged rows in L2
  unsigned* counters;         // [2][kCounterStride]: a chunk's arrival counter
  const uint16_t* in;         // [kSeq][kBatch][3 kS]
  uint16_t* out;              // [kSeq][kBatch][3 kS]
  float* sums;                // [2 checks][G][2 chunks][tiles 16][kRows]
  unsigned long long* times;  // CTA 0's timer after step 100 and at the end
  long long* cycles;          // CTA 0, thread 0: wait, products, cell (sums after step 100)
  int steps;
  int units, row, state, ksteps;  // kRuntimeShape: J, kRow, kS and a warp's k steps, at run time
};

// Variants of the one-part step, each a feature of the kernels' step that
// the plain probe leaves out (bits of the kernel's template parameter V):
//   kRuntimeShape  units, row length and state size (and the held k loop's
//                  bound) read at run time, as the kernels' generic code does;
//   kBlockWaits    the backward's k steps walked gate block by gate block, each
//                  block reloaded onto its own mbarrier and waited for as the
//                  products reach it (GridExchange's wait_block);
//   kFourSets      four accumulator sets round the k steps (the kernels' one-tile dot);
//   kWholeFirst    with kRuntimeShape: a warp whose run-time k steps are all
//                  of the held ones runs a loop without the exit test.
constexpr int kRuntimeShape = 1, kBlockWaits = 2, kFourSets = 4, kWholeFirst = 8;

// An mbarrier of `count` arrivals a phase, and one arrival on it (sm_90).
__device__ __forceinline__ void mbarrier_init_count(uint32_t bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// The compute warps' own barrier (the producer warps never wait on it).
__device__ __forceinline__ void compute_barrier() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kWarps * 32) : "memory");
}

__device__ __forceinline__ uint16_t half_bits(float v) {
  const __half h = __float2half(v);
  return *reinterpret_cast<const uint16_t*>(&h);
}
__device__ __forceinline__ float half_value(uint16_t v) {
  return __half2float(*reinterpret_cast<const __half*>(&v));
}

// R: exchanged gate blocks (1: the forward's h; 3: the backward's dz_h); J:
// units a CTA; TILES: 16-row MMA tiles of its dot rows (3 J forward, J
// backward); kTwoParts: the design (above).
template <int R, int J, int TILES, bool kTwoParts, int V = 0>
__global__ void __launch_bounds__((kWarps + 2) * 32, 1) step_kernel(Args a) {
  constexpr int K = R * kS, KW = K / 16 / kWarps;  // k steps of 16 a warp
  constexpr int D = (R == 1 ? 3 : 1) * J, T16 = TILES * 16, kFrags = TILES * KW;
  constexpr int kCompute = kWarps * 32, kItems = J * kRows, G = kS / J;
  constexpr int kParts = kTwoParts ? 2 : 1, kPartial = kRows + 1;  // partial sums' row stride: bank-free
  constexpr uint32_t kBlockBytes = kRows * kRow * 2;
  static_assert(K % (16 * kWarps) == 0 && kS % J == 0, "whole k steps a warp, whole units a CTA");
  static_assert(D <= T16 && D > T16 - 16, "the dot rows fill the last tile in part");
  static_assert(kItems <= kCompute, "a compute thread each (unit, row)");
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t bars = smem_address(smem);  // full[2] (a reload landed), done[2] (a part's rows written)
  uint16_t* buf = reinterpret_cast<uint16_t*>(smem + 128);  // [kParts][R][kRows][kRow]
  float* partial =
      reinterpret_cast<float*>(buf + kParts * R * kRows * kRow);  // [kParts][kWarps][T16][kPartial]
  static_assert(!(V & kBlockWaits) || (R > 1 && !kTwoParts), "block waits: the one-part backward's");
  constexpr int kSets = (V & kFourSets) ? 4 : 1, KWS = KW / R;  // k steps a warp in each gate block
  const int Jr = (V & kRuntimeShape) ? a.units : J, row = (V & kRuntimeShape) ? a.row : kRow;
  const int Sr = (V & kRuntimeShape) ? a.state : kS, kw = (V & kRuntimeShape) ? a.ksteps : KW;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int cta = kTwoParts ? static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x) % G;
  const int chunk = kTwoParts ? 0 : static_cast<int>(blockIdx.x) / G;  // one part: the group's chunk
  const auto full = [&](int q) { return bars + 8 * q; };
  const auto done = [&](int q) { return bars + 16 + 8 * q; };
  const auto block_bar = [&](int i) { return bars + 32 + 8 * i; };  // kBlockWaits: gate block i's
  // The global k step of this warp's s-th: a range of k (or kBlockWaits: a range of each block's).
  const auto kstep_of = [&](int s) {
    return (V & kBlockWaits) ? s / KWS * (kS / 16) + warp * KWS + s % KWS : warp * KW + s;
  };

  if (tid == 0) {
    for (int q = 0; q < 2; ++q) {
      mbarrier_init_count(full(q), 1);
      mbarrier_init_count(done(q), kCompute);
    }
    for (int i = 0; i < 3; ++i) mbarrier_init_count(block_bar(i), 1);
  }
  for (int e = tid; e < kParts * R * kRows * kRow; e += blockDim.x) {  // step 0's rows, padding zero
    const int col = e % kRow, r = e / kRow % kRows, i = e / (kRow * kRows) % R, q = e / (kRow * kRows * R);
    buf[e] = col < kS ? half_bits(x_value(0, 8 * (chunk + q) + r, i * kS + col)) : 0;
  }
  __syncthreads();

  if (warp >= kWarps) {  // two parts: producer warp q, its lane 0
    const int q = warp - kWarps;
    if (lane != 0) return;
    unsigned* counter = a.counters + q * kCounterStride;
    for (int n = 0; n + 1 < a.steps; ++n) {
      mbarrier_wait(done(q), n & 1);  // every compute thread's writes of part q's rows of step n
      release_add(counter);
      const unsigned target = static_cast<unsigned>(n + 1) * G;
      while (static_cast<int>(load_acquire(counter) - target) < 0) {
      }
      async_proxy_fence_global();
      async_proxy_fence_shared();
      mbarrier_expect(full(q), R * kBlockBytes);
      for (int i = 0; i < R; ++i) {
        bulk_copy_to_shared(smem_address(buf + (q * R + i) * kRows * kRow),
                            a.x + ((((n + 1) & 1) * R + i) * kBatch + 8 * q) * kRow, kBlockBytes, full(q));
      }
    }
    return;
  }

  // This warp's A fragments (m16n8k16's layout): tile m's rows over k steps k0 .. k0 + KW - 1.
  const int g = lane / 4, c2 = lane % 4 * 2;
  uint32_t held[kFrags][4];
  const uint16_t* w = a.w + static_cast<size_t>(cta) * T16 * K;
#pragma unroll
  for (int f = 0; f < kFrags; ++f) {
    const int wr = f % TILES * 16 + g, k = kstep_of(f / TILES) * 16 + c2;
    held[f][0] = *reinterpret_cast<const uint32_t*>(w + wr * K + k);
    held[f][1] = *reinterpret_cast<const uint32_t*>(w + (wr + 8) * K + k);
    held[f][2] = *reinterpret_cast<const uint32_t*>(w + wr * K + k + 8);
    held[f][3] = *reinterpret_cast<const uint32_t*>(w + (wr + 8) * K + k + 8);
  }

  const int u = tid % Jr, r = tid / Jr, col = cta * Jr + u;  // the cell's (unit, row), tid < kItems
  const bool cell_thread = tid < Jr * kRows;
  float state[kParts] = {};
  uint16_t in[kParts][3] = {};
  const auto load_in = [&](int n, int q) {
    if (!cell_thread) return;
    const uint16_t* p = a.in + (static_cast<size_t>(n % kSeq) * kBatch + 8 * (chunk + q) + r) * 3 * Sr + col;
#pragma unroll
    for (int i = 0; i < 3; ++i) in[q][i] = p[i * Sr];
  };
#pragma unroll
  for (int q = 0; q < kParts; ++q) load_in(0, q);
  long long spent[3] = {};
  const bool clocks = blockIdx.x == 0 && tid == 0;

  for (int n = 0; n < a.steps; ++n) {
    if (n == 100 && clocks) a.times[0] = timer_ns();
    const bool last = n + 1 == a.steps;
#pragma unroll
    for (int q = 0; q < kParts; ++q) {
      const int p = chunk + q, b = 8 * p + r;  // the chunk's index, the cell's batch row
      const long long c0 = clock64();
      if (n > 0 && !(V & kBlockWaits))
        mbarrier_wait(full(q), (n - 1) & 1);  // step n - 1's rows of this chunk
      const long long c1 = clock64();
      const uint16_t* h = buf + q * R * kRows * kRow;
      float sets[kSets][TILES][4] = {};
      const auto kstep = [&](int s) {  // s a constant once unrolled
        const int kk = kstep_of(s) * 16, blk = kk / kS;
        if ((V & kBlockWaits) && n > 0 && s % KWS == 0) mbarrier_wait(block_bar(blk), (n - 1) & 1);
        const uint16_t* hb = h + (blk * kRows + g) * row + kk % kS + c2;
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(hb);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(hb + 8);
#pragma unroll
        for (int m = 0; m < TILES; ++m) mma16816(sets[s % kSets][m], held[s * TILES + m], b0, b1);
      };
      if (!(V & kRuntimeShape) || ((V & kWholeFirst) && kw == KW)) {
#pragma unroll
        for (int s = 0; s < KW; ++s) kstep(s);
      } else {  // an exit between k steps: each step's B loads wait for its test
#pragma unroll
        for (int s = 0; s < KW; ++s) {
          if (s >= kw) break;
          kstep(s);
        }
      }
      float (&acc)[TILES][4] = sets[0];
#pragma unroll
      for (int h2 = 1; h2 < kSets; ++h2) {
#pragma unroll
        for (int m = 0; m < TILES; ++m) {
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[m][i] += sets[h2][m][i];
        }
      }
      // D of tile m: lane (g, c2) holds rows g and g + 8, columns (batch rows) c2 and c2 + 1.
      float* pq = partial + q * kWarps * T16 * kPartial;
#pragma unroll
      for (int m = 0; m < TILES; ++m) {
        float* d = pq + (warp * T16 + m * 16 + g) * kPartial + c2;
        d[0] = acc[m][0], d[1] = acc[m][1];
        d[8 * kPartial] = acc[m][2], d[8 * kPartial + 1] = acc[m][3];
      }
      compute_barrier();
      const long long c2c = clock64();
      float e[3] = {};  // the cell's three results: stored after the arrival
      if (cell_thread) {
        const auto dot = [&](int d) {
          float sum = 0.f;
#pragma unroll
          for (int v = 0; v < kWarps; ++v) sum += pq[(v * T16 + d) * kPartial + r];
          if (n == 0 || n == kCheckStep)
            a.sums[((((n == 0 ? 0 : 1) * G + cta) * 2 + p) * T16 + d) * kRows + r] = sum;
          return sum;
        };
        if constexpr (R == 1) {  // the LLTM's forward cell
          const float zi = dot(u) + half_value(in[q][0]), zo = dot(Jr + u) + half_value(in[q][1]);
          const float zc = dot(2 * Jr + u) + half_value(in[q][2]);
          const float gi = 1.f / (1.f + __expf(-zi)), go = 1.f / (1.f + __expf(-zo));
          const float cand = zc > 0.f ? zc : __expf(zc) - 1.f;
          state[q] += gi * cand;
          e[0] = tanhf(state[q]) * go, e[1] = gi, e[2] = cand;
        } else {  // its backward: dh, the saved gates, dc through the step
          const float dh = dot(u) + half_value(in[q][0]), go = half_value(in[q][1]),
                      tc = half_value(in[q][2]);
          state[q] += dh * go * (1.f - tc * tc);
          e[0] = state[q] * go, e[1] = dh * tc, e[2] = state[q] * (go > 0.f ? 1.f : go + 1.f);
        }
        if (!last) {
#pragma unroll
          for (int i = 0; i < R; ++i) {
            const float v = x_value(n + 1, b, i * kS + col) + 0.f * e[i];
            a.x[(((n + 1) & 1) * R + i) * kBatch * row + b * row + col] = half_bits(v);
          }
        }
      }
      if constexpr (kTwoParts) {
        mbarrier_arrive(done(q));  // the producer counts it; the stores below follow
      } else {
        compute_barrier();
        if (tid == kCompute - 1 && !last) release_add(a.counters + p * kCounterStride);
      }
      if (cell_thread) {
        uint16_t* o = a.out + (static_cast<size_t>(n % kSeq) * kBatch + b) * 3 * Sr + col;
#pragma unroll
        for (int i = 0; i < 3; ++i) o[i * Sr] = half_bits(e[i]);
      }
      if (!last) load_in(n + 1, q);
      if constexpr (!kTwoParts) {  // the kernels' leader: poll, then the reload
        if (tid == kCompute - 1 && !last) {
          const unsigned target = static_cast<unsigned>(n + 1) * G;
          while (static_cast<int>(load_acquire(a.counters + p * kCounterStride) - target) < 0) {
          }
          async_proxy_fence_global();
          async_proxy_fence_shared();
          if (!(V & kBlockWaits)) mbarrier_expect(full(0), R * kBlockBytes);
          for (int i = 0; i < R; ++i) {
            const uint32_t bar = (V & kBlockWaits) ? block_bar(i) : full(0);
            if (V & kBlockWaits) mbarrier_expect(bar, kBlockBytes);
            bulk_copy_to_shared(smem_address(buf + i * kRows * kRow),
                                a.x + ((((n + 1) & 1) * R + i) * kBatch + 8 * p) * kRow, kBlockBytes, bar);
          }
        }
      }
      if (clocks && n >= 100) {
        spent[0] += c1 - c0, spent[1] += c2c - c1, spent[2] += clock64() - c2c;
      }
    }
  }
  if (clocks) {
    a.times[1] = timer_ns();
    for (int i = 0; i < 3; ++i) a.cycles[i] = spent[i];
  }
}

int failures = 0;

template <int R, int J, int TILES, bool kTwoParts, int V = 0>
void run(const uint16_t* in, uint16_t* out) {
  constexpr int K = R * kS, D = (R == 1 ? 3 : 1) * J, T16 = TILES * 16, G = kS / J;
  constexpr int kParts = kTwoParts ? 2 : 1, ctas = kTwoParts ? G : 2 * G;
  // W's rows, a CTA's tiles zero-padded past D; the same in both groups of the one-part design.
  std::vector<uint16_t> w_host(static_cast<size_t>(G) * T16 * K, 0);
  for (int c = 0; c < G; ++c)
    for (int d = 0; d < D; ++d)
      for (int k = 0; k < K; ++k) {
        const __half v = __float2half(w_value(c * T16 + d, k));
        w_host[(static_cast<size_t>(c) * T16 + d) * K + k] = *reinterpret_cast<const uint16_t*>(&v);
      }
  const size_t sums = 2 * static_cast<size_t>(G) * 2 * T16 * kRows;
  Args a{};
  uint16_t* w = nullptr;
  cudaMalloc(&w, w_host.size() * 2);
  cudaMemcpy(w, w_host.data(), w_host.size() * 2, cudaMemcpyHostToDevice);
  a.w = w;
  cudaMalloc(&a.x, 2 * R * kBatch * kRow * 2);
  cudaMemset(a.x, 0, 2 * R * kBatch * kRow * 2);
  cudaMalloc(&a.counters, 2 * kCounterStride * 4);
  cudaMemset(a.counters, 0, 2 * kCounterStride * 4);
  cudaMalloc(&a.sums, sums * 4);
  cudaMemset(a.sums, 0xff, sums * 4);  // NaN: a sum never written fails the check
  cudaMalloc(&a.times, 16);
  cudaMalloc(&a.cycles, 24);
  a.in = in;
  a.out = out;
  a.steps = kSteps;
  a.units = J, a.row = kRow, a.state = kS, a.ksteps = K / 16 / kWarps;
  const int smem = 128 + kParts * R * kRows * kRow * 2 + kParts * kWarps * T16 * (kRows + 1) * 4;
  const int smem_launch = smem > 120 * 1024 ? smem : 120 * 1024;  // over half an SM's: one CTA an SM
  auto kernel = step_kernel<R, J, TILES, kTwoParts, V>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_launch);
  const int threads = (kWarps + (kTwoParts ? 2 : 0)) * 32;
  printf("%s %-9s %3d CTAs, %2d units, %d tiles, %2d held a warp (%3d KB)%s%s%s%s: ",
         R == 1 ? "forward " : "backward", kTwoParts ? "two parts" : "one part", ctas, J, TILES,
         TILES * K / 16 / kWarps, smem / 1024, (V & kRuntimeShape) ? ", shape at run time" : "",
         (V & kBlockWaits) ? ", block waits" : "", (V & kFourSets) ? ", four sets" : "",
         (V & kWholeFirst) ? ", no exit test" : "");
  kernel<<<ctas, threads, smem_launch>>>(a);
  const cudaError_t status = wait_for(cudaGetLastError(), 10);
  const StepClock clock = read_step_clock(a.times, a.cycles, kSteps - 100);
  std::vector<float> got(sums);
  cudaMemcpy(got.data(), a.sums, sums * 4, cudaMemcpyDeviceToHost);
  int wrong = 0;
  for (int check = 0; check < 2; ++check) {
    const int n = check == 0 ? 0 : kCheckStep;
    for (int c = 0; c < G; ++c)
      for (int p = 0; p < 2; ++p)
        for (int d = 0; d < D; ++d)
          for (int r = 0; r < kRows; ++r) {
            float want = 0.f;
            for (int k = 0; k < K; ++k) want += w_value(c * T16 + d, k) * x_value(n, 8 * p + r, k);
            const float v = got[((((size_t)check * G + c) * 2 + p) * T16 + d) * kRows + r];
            wrong += !(std::fabs(v - want) <= 1e-3f);
          }
  }
  printf("%7.1f ns/step (cycles a step: wait %lld, products %lld, cell %lld), %d wrong sums %s\n", clock.ns,
         clock.cycles[0], clock.cycles[1], clock.cycles[2], wrong,
         status == cudaSuccess ? "" : cudaGetErrorString(status));
  failures += status != cudaSuccess || wrong != 0;
  cudaFree(w);
  cudaFree(a.x);
  cudaFree(a.counters);
  cudaFree(a.sums);
  cudaFree(a.times);
  cudaFree(a.cycles);
}

}  // namespace

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  if (!has_compute_capability(9)) {
    printf("grid_step_probe: needs a GPU of compute capability 9.0 or later (bulk copies, mbarriers)\n");
    return 2;
  }
  const size_t seq = static_cast<size_t>(kSeq) * kBatch * 3 * kS;
  uint16_t *in = nullptr, *out = nullptr;
  cudaMalloc(&in, seq * 2);
  cudaMalloc(&out, seq * 2);
  cudaMemset(in, 0, seq * 2);
  for (int round = 0; round < 2; ++round) {
    run<1, 12, 3, false>(in, out);  // the kernels' forward: groups of 64, 12 units (36 of 48 rows)
    run<1, 6, 2, true>(in, out);    // 128 CTAs, 6 units (18 of 32 rows)
    run<1, 8, 2, true>(in, out);    // 96 CTAs, 8 units (24 of 32)
    run<1, 12, 3, true>(in, out);   // 64 CTAs, 12 units
    run<3, 12, 1, false>(in, out);  // the kernels' backward: groups of 64, 12 units (12 of 16 rows)
    run<3, 6, 1, true>(in, out);
    run<3, 8, 1, true>(in, out);
    run<3, 12, 1, true>(in, out);
    run<3, 16, 1, true>(in, out);  // 48 CTAs, 16 units
  }
  // The one-part step with the kernels' features one at a time, then together.
  for (int round = 0; round < 2; ++round) {
    run<1, 12, 3, false>(in, out);
    run<1, 12, 3, false, kRuntimeShape>(in, out);
    run<3, 12, 1, false>(in, out);
    run<3, 12, 1, false, kRuntimeShape>(in, out);
    run<3, 12, 1, false, kBlockWaits>(in, out);
    run<3, 12, 1, false, kFourSets>(in, out);
    run<3, 12, 1, false, kBlockWaits | kFourSets>(in, out);
    run<3, 12, 1, false, kRuntimeShape | kBlockWaits | kFourSets>(in, out);
    run<1, 12, 3, false, kRuntimeShape | kWholeFirst>(in, out);
    run<3, 12, 1, false, kRuntimeShape | kWholeFirst>(in, out);
    run<3, 12, 1, false, kRuntimeShape | kBlockWaits | kFourSets | kWholeFirst>(in, out);
  }
  cudaFree(in);
  cudaFree(out);
  return failures != 0;
}
