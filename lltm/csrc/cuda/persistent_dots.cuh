// The persistent kernels' dot products: the tensor-core MMA tiles (mma.sync,
// sm_80+) and the lane-group sums of the FMA dot.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <type_traits>

namespace lltm {
namespace cuda_detail {

// ------------------------------------------------------ the tensor-core dot
//
// One step's recurrent products of a CTA as warp-level MMAs (mma.sync,
// sm_80+), fp32 accumulators: D = A B with A = rows of W_h's slice in
// shared memory (row-major, `row` elements a row) and B = the exchanged
// rows (batch row n is B's column n, contiguous in k). K comes in
// `segments` segments: segment s of A starts `seg_rows` rows further down,
// of B `b_seg` elements further (backward: gate s of dzh_t); B's batch rows
// lie `b_stride` elements apart (a row stride of 4 words mod 8 puts a
// fragment load's 8 rows x 4 words on 32 banks). Warp w takes the (tile, k slice) tasks w, w +
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
// rows to one of these). The k steps of one task go round kSets sets of
// accumulators, so kSets MMA chains are in flight (one chain would wait out
// every MMA's latency and its fragments' loads): four where B is narrow
// (the small-batch splits, whose long k slices are latency-bound), two
// where NT tiles already give the warp independent MMAs; the sets are added
// at the end in a fixed order.
template <typename scalar_t, int NT>
__device__ __forceinline__ void mma_dot_tiles(const scalar_t* a, const scalar_t* b, int segments,
                                              int seg_rows, int b_stride, int b_seg, int row, int state,
                                              int mtiles, int ksplit, float* tile) {
  constexpr int kSets = NT <= 2 ? 4 : 2;
  constexpr bool kTf32 = std::is_same_v<scalar_t, float>;
  constexpr int kStep = kTf32 ? 8 : 16;  // k of one MMA
  constexpr int kPer = kTf32 ? 1 : 2;    // elements per 32-bit word
  constexpr int kWords = kStep / kPer;   // words of one k step in a row
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int ksteps = (state + kStep - 1) / kStep;
  const int total = segments * ksteps;
  constexpr int ld = NT * 8 + 1;
  const int row_w = row / kPer, b_w = b_stride / kPer, seg_w = b_seg / kPer;  // in words
  const uint32_t* a32 = reinterpret_cast<const uint32_t*>(a);
  const uint32_t* b32 = reinterpret_cast<const uint32_t*>(b);
  for (int task = warp; task < mtiles * ksplit; task += warps) {
    const int mt = task % mtiles, slice = task / mtiles;
    const int k0 = slice * total / ksplit, k1 = (slice + 1) * total / ksplit;
    float acc[kSets][NT][4];
#pragma unroll
    for (int h = 0; h < kSets; ++h) {
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
      const uint32_t* bp = b32 + seg * seg_w + g * b_w + kin * kWords + t;
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
    for (; k + kSets <= k1; k += kSets) {
#pragma unroll
      for (int h = 0; h < kSets; ++h) step(acc[h]);
    }
#pragma unroll
    for (int h = 0; h < kSets - 1; ++h) {
      if (k + h < k1) step(acc[h]);
    }
#pragma unroll
    for (int h = 1; h < kSets; ++h) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[0][nt][i] += acc[h][nt][i];
      }
    }
    // D fragment: rows g and g + 8, columns 2t and 2t + 1 of each B tile.
    float* out = tile + (slice * mtiles * 16 + mt * 16 + g) * ld + 2 * t;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      out[nt * 8] = acc[0][nt][0];
      out[nt * 8 + 1] = acc[0][nt][1];
      out[8 * ld + nt * 8] = acc[0][nt][2];
      out[8 * ld + nt * 8 + 1] = acc[0][nt][3];
    }
  }
}

template <typename scalar_t>
__device__ __forceinline__ void mma_dot(const scalar_t* a, const scalar_t* b, int segments, int seg_rows,
                                        int b_stride, int b_seg, int row, int state, int mtiles, int ntiles,
                                        int ksplit, float* tile) {
  switch (ntiles) {
    case 1:
      mma_dot_tiles<scalar_t, 1>(a, b, segments, seg_rows, b_stride, b_seg, row, state, mtiles, ksplit, tile);
      break;
    case 2:
      mma_dot_tiles<scalar_t, 2>(a, b, segments, seg_rows, b_stride, b_seg, row, state, mtiles, ksplit, tile);
      break;
    case 4:
      mma_dot_tiles<scalar_t, 4>(a, b, segments, seg_rows, b_stride, b_seg, row, state, mtiles, ksplit, tile);
      break;
    default:
      mma_dot_tiles<scalar_t, 8>(a, b, segments, seg_rows, b_stride, b_seg, row, state, mtiles, ksplit, tile);
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

}  // namespace cuda_detail
}  // namespace lltm
